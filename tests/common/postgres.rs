//! A throwaway PostgreSQL server for tests, from the system's `postgresql`
//! package (`tests/run.sh` installs it).
//!
//! [`TestPostgres::start`] gives each test its own database on a server that
//! the test process shares while any test uses it: `initdb` costs about half a
//! second, a database about a tenth. The server runs as an unprivileged user
//! when the tests run as root (PostgreSQL refuses root), listens on a free
//! 127.0.0.1 port and on a unix socket inside its temp dir, and keeps nothing
//! (`fsync=off`). The last [`TestPostgres`] to go stops it, reaps it and
//! removes its dir; if the test process dies first, the server is told to
//! quit by the kernel (`PR_SET_PDEATHSIG`). [`TestPostgres::dedicated`] gives
//! a test a server of its own that it may stop and start again.

use std::fs;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The server tests share, while any of them holds it.
static SHARED: Mutex<Weak<Server>> = Mutex::new(Weak::new());

/// One database of a test server.
pub struct TestPostgres {
    server: Arc<Server>,
    database: String,
}

impl TestPostgres {
    /// A fresh database on the shared server (started if no test holds it).
    pub fn start() -> TestPostgres {
        let server = {
            let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
            match shared.upgrade() {
                Some(server) => server,
                None => {
                    let server = Arc::new(Server::start());
                    *shared = Arc::downgrade(&server);
                    server
                }
            }
        };
        TestPostgres::on(server)
    }

    /// A fresh database on a server of this test's own, which it may
    /// [`stop`](Self::stop) and [`restart`](Self::restart).
    pub fn dedicated() -> TestPostgres {
        TestPostgres::on(Arc::new(Server::start()))
    }

    fn on(server: Arc<Server>) -> TestPostgres {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let database = format!(
            "test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        server.sql(&format!("CREATE DATABASE {database}"));
        TestPostgres { server, database }
    }

    /// `postgres://postgres@127.0.0.1:<port>/<database>`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.server.port(),
            self.database
        )
    }

    /// The URL of another fresh database on the same server.
    pub fn another_database(&self) -> String {
        self.another().url()
    }

    /// Another fresh database on the same server.
    pub fn another(&self) -> TestPostgres {
        TestPostgres::on(self.server.clone())
    }

    /// Runs `sql` in this test's database with `psql`; returns its output
    /// (unaligned, tuples only).
    pub fn psql(&self, sql: &str) -> String {
        self.server.psql(&self.database, sql)
    }

    /// The server's postmaster process (its backends are its children).
    pub fn server_pid(&self) -> Option<u32> {
        self.server
            .postmaster
            .lock()
            .unwrap()
            .as_ref()
            .map(|p| p.pid)
    }

    /// Stops the server at once (as a crash would), keeping its data.
    /// Only for a [`dedicated`](Self::dedicated) server.
    pub fn stop(&self) {
        assert!(
            Arc::strong_count(&self.server) == 1,
            "only a dedicated server may be stopped"
        );
        self.server.stop();
    }

    /// Starts a stopped server again, on the same port.
    pub fn restart(&self) {
        self.server.run();
    }
}

/// A running PostgreSQL server and its data dir.
struct Server {
    bin: PathBuf,
    dir: tempfile::TempDir,
    user: Option<User>,
    port: Mutex<u16>,
    postmaster: Mutex<Option<Postmaster>>,
}

/// The postmaster child, reaped by its own thread: `PR_SET_PDEATHSIG` fires
/// when the *thread* that spawned the child ends, so it is spawned from a
/// thread that lives exactly as long as the child.
struct Postmaster {
    pid: u32,
    exited: mpsc::Receiver<()>,
    reaper: JoinHandle<()>,
}

#[derive(Clone, Copy)]
struct User {
    uid: u32,
    gid: u32,
}

impl Server {
    fn start() -> Server {
        let bin = bin_dir();
        let user = unprivileged_user();
        let dir = tempfile::Builder::new()
            .prefix("wf-pg-")
            .tempdir()
            .expect("a temp dir for PostgreSQL");
        if let Some(user) = user {
            std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid))
                .expect("give the temp dir to the server's user");
        }
        let data = dir.path().join("data");
        let output = command(&bin.join("initdb"), user)
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync")
            .output()
            .expect("run initdb");
        assert!(
            output.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let server = Server {
            bin,
            dir,
            user,
            port: Mutex::new(0),
            postmaster: Mutex::new(None),
        };
        // A port found free may be taken before the server binds it (another
        // test binary starting its own server): try a few.
        let mut last = String::new();
        for _ in 0..5 {
            *server.port.lock().unwrap() = free_port();
            match server.try_run() {
                Ok(()) => return server,
                Err(log) => last = log,
            }
        }
        panic!("PostgreSQL did not start:\n{last}");
    }

    fn port(&self) -> u16 {
        *self.port.lock().unwrap()
    }

    fn run(&self) {
        if let Err(log) = self.try_run() {
            panic!("PostgreSQL did not start:\n{log}");
        }
    }

    /// Starts the postmaster and waits until it accepts connections; on
    /// failure, its log.
    fn try_run(&self) -> Result<(), String> {
        let log_path = self.dir.path().join("server.log");
        let log = fs::File::create(&log_path).expect("server log");
        if let Some(user) = self.user {
            let _ = std::os::unix::fs::chown(&log_path, Some(user.uid), Some(user.gid));
        }
        let mut cmd = command(&self.bin.join("postgres"), self.user);
        // Statement counts, for the workers bench (round trips per run),
        // where the server has the module (Debian's package does).
        if self.bin.join("../lib/pg_stat_statements.so").exists() {
            cmd.args(["-c", "shared_preload_libraries=pg_stat_statements"]);
        }
        cmd.arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-k")
            .arg(self.dir.path())
            .args(["-h", "127.0.0.1", "-p", &self.port().to_string()])
            // No fsync, but commits still reach the OS before they return
            // (no `synchronous_commit=off`): a server a test stops with an
            // immediate shutdown keeps what was committed, as a real one would.
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=200"])
            .args(["-c", "shared_buffers=16MB"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("server log"))
            .stderr(log);
        // SAFETY: prctl only sets a flag of the child; nothing is allocated.
        unsafe {
            cmd.pre_exec(|| {
                // SIGQUIT: immediate shutdown, should the test process die.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (spawned_tx, spawned_rx) = mpsc::channel();
        let (exited_tx, exited) = mpsc::channel();
        let reaper = std::thread::spawn(move || {
            let mut child = match cmd.spawn() {
                Ok(child) => child,
                Err(e) => {
                    let _ = spawned_tx.send(Err(e));
                    return;
                }
            };
            let _ = spawned_tx.send(Ok(child.id()));
            let _ = child.wait();
            let _ = exited_tx.send(());
        });
        let pid = spawned_rx
            .recv()
            .expect("reaper thread")
            .expect("spawn postgres");
        let postmaster = Postmaster {
            pid,
            exited,
            reaper,
        };
        let pid_file = self.dir.path().join("data/postmaster.pid");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // The postmaster writes `ready` as the status line of its pid
            // file once it accepts connections.
            let ready = fs::read_to_string(&pid_file)
                .is_ok_and(|text| text.lines().nth(7).is_some_and(|s| s.trim() == "ready"));
            if ready {
                *self.postmaster.lock().unwrap() = Some(postmaster);
                return Ok(());
            }
            if postmaster.exited.try_recv().is_ok() || Instant::now() > deadline {
                stop_postmaster(postmaster);
                return Err(fs::read_to_string(&log_path).unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stop(&self) {
        if let Some(postmaster) = self.postmaster.lock().unwrap().take() {
            stop_postmaster(postmaster);
        }
    }

    fn sql(&self, sql: &str) {
        self.psql("postgres", sql);
    }

    fn psql(&self, database: &str, sql: &str) -> String {
        let output = Command::new(self.bin.join("psql"))
            .arg("-h")
            .arg(self.dir.path())
            .args([
                "-p",
                &self.port().to_string(),
                "-U",
                "postgres",
                "-d",
                database,
            ])
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .expect("run psql");
        assert!(
            output.status.success(),
            "psql `{sql}` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        // The TempDir removes the data dir after this.
    }
}

/// Immediate shutdown (SIGQUIT), then waits until the reaper has reaped it.
fn stop_postmaster(postmaster: Postmaster) {
    // SAFETY: kill(2) on the pid of our own child, not reaped yet (the
    // reaper thread reaps it only after it exits).
    unsafe { libc::kill(postmaster.pid as libc::pid_t, libc::SIGQUIT) };
    if postmaster
        .exited
        .recv_timeout(Duration::from_secs(30))
        .is_err()
    {
        unsafe { libc::kill(postmaster.pid as libc::pid_t, libc::SIGKILL) };
    }
    let _ = postmaster.reaper.join();
}

fn command(program: &Path, user: Option<User>) -> Command {
    let mut cmd = Command::new(program);
    if let Some(user) = user {
        cmd.uid(user.uid).gid(user.gid);
    }
    // PostgreSQL reads these; the test's environment is not the server's.
    cmd.env_remove("PGDATA")
        .env_remove("PGPORT")
        .env("LC_ALL", "C");
    cmd
}

/// The newest PostgreSQL's `bin` dir: Debian installs each major version in
/// `/usr/lib/postgresql/<version>/bin`. `WF_TEST_PG_BIN` overrides it.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WF_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let root = Path::new("/usr/lib/postgresql");
    let newest = fs::read_dir(root)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            e.path().join("bin/postgres").exists().then_some(version)
        })
        .max();
    match newest {
        Some(version) => root.join(version.to_string()).join("bin"),
        None => panic!(
            "PostgreSQL is not installed (no {}/<version>/bin/postgres); \
             install it with:  apt-get install -y postgresql",
            root.display()
        ),
    }
}

/// `nobody` when the tests run as root (PostgreSQL will not), else none.
fn unprivileged_user() -> Option<User> {
    // SAFETY: getuid cannot fail; getpwnam returns a pointer into static
    // storage that is read before any other call could reuse it.
    unsafe {
        if libc::getuid() != 0 {
            return None;
        }
        let pw = libc::getpwnam(c"nobody".as_ptr());
        assert!(
            !pw.is_null(),
            "tests run as root and there is no `nobody` user to run PostgreSQL as"
        );
        Some(User {
            uid: (*pw).pw_uid,
            gid: (*pw).pw_gid,
        })
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
