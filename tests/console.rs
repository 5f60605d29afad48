//! The web console in a real browser: headless Chromium driven through
//! chromedriver (WebDriver), against a real `wf-host serve` with a token.
//! The console asks for the token, starts runs, follows them live, draws
//! their step graph and cancels one; without the token its shell loads but
//! every data request is refused. A first visit is checked by what a person
//! sees: the start form as it comes, each page screenshotted and required to
//! show something and no error, and the pages of a server with nothing yet.
//!
//! Needs the Debian packages `chromium` and `chromium-driver` (tests/run.sh
//! and .ci/run install them). Screenshots of the console are left in
//! `target/test-artifacts/`.

mod common;

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::error::CmdError;
use fantoccini::{Client, ClientBuilder, Locator};
use futures::future::BoxFuture;
use serde_json::{Value, json};

use common::serve::Serve;
use common::*;

const TOKEN: &str = "console-test-token";

/// What the browser waits for at most: the first run compiles its nodes.
const WAIT: Duration = Duration::from_secs(60);

/// `pair`: two echo steps, `second` needing `first`. `nap`: a long upstream
/// sleep, then a step that needs it, to be paused, resumed and cancelled.
fn config(dir: &Path) -> PathBuf {
    let call = plugin("call");
    let echo = plugin("echo");
    let path = dir.join("wf.toml");
    std::fs::write(
        &path,
        format!(
            r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]

[[workflows.pair.steps]]
id = "first"
component = {echo:?}

[[workflows.pair.steps]]
id = "second"
component = {echo:?}
needs = ["first"]
input = '.steps.first.output'

[[workflows.nap.steps]]
id = "nap"
component = {call:?}
allow = ["fixture.sleep"]
input = '{{capability: "fixture.sleep", arguments: {{ms: 120000}}}}'

[[workflows.nap.steps]]
id = "after"
component = {echo:?}
needs = ["nap"]

[[workflows.trip.steps]]
id = "book"
component = {echo:?}
compensate = {{ component = {echo:?} }}

[[workflows.trip.steps]]
id = "pay"
component = {call:?}
allow = ["fixture.fail"]
needs = ["book"]
input = '{{capability: "fixture.fail", arguments: {{message: "card declined"}}}}'
"#
        ),
    )
    .unwrap();
    path
}

/// Two quick workflows, `greet` first (with an `input_schema` that `{}`
/// breaks), and no connections: a first visit starts one without choosing
/// or typing anything.
fn two_workflows(dir: &Path) -> PathBuf {
    let echo = plugin("echo");
    let path = dir.join("wf.toml");
    std::fs::write(
        &path,
        format!(
            r#"[workflows.greet]
# `{{}}` would not do: the start form fills in what the schema asks for.
input_schema = {{ type = "object", required = ["name", "times"], properties = {{ name = {{ type = "string", minLength = 1, default = "world" }}, times = {{ type = "integer", minimum = 1 }} }} }}

[[workflows.greet.steps]]
id = "hello"
component = {echo:?}

[[workflows.pair.steps]]
id = "first"
component = {echo:?}

[[workflows.pair.steps]]
id = "second"
component = {echo:?}
needs = ["first"]
"#
        ),
    )
    .unwrap();
    path
}

/// Nothing at all: no workflows, no connections, so no runs.
fn nothing(dir: &Path) -> PathBuf {
    let path = dir.join("wf.toml");
    std::fs::write(&path, "").unwrap();
    path
}

/// chromedriver on a free port, in its own process group with the Chromium
/// it starts; the whole group is killed, and chromedriver reaped, on drop.
struct ChromeDriver {
    child: Child,
    url: String,
    /// The browser's fresh profile.
    profile: tempfile::TempDir,
}

impl ChromeDriver {
    async fn start() -> ChromeDriver {
        let profile = tempfile::tempdir().unwrap();
        let client = http_client();
        // A port picked here may be taken before chromedriver binds it: then
        // it exits, and another port is tried.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut child = Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot start chromedriver ({e}); install the Debian packages \
                         `chromium` and `chromium-driver` (tests/run.sh does)"
                    )
                });
            let url = format!("http://127.0.0.1:{port}");
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
                let ready = client
                    .get(format!("{url}/status"))
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status().is_success());
                if let Some(response) = ready {
                    let status: Value = response.json().await.unwrap();
                    if status["value"]["ready"] == json!(true) {
                        return ChromeDriver {
                            child,
                            url,
                            profile,
                        };
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            kill_group(&mut child);
        }
        panic!("chromedriver did not start");
    }

    /// A new headless Chromium session.
    async fn browser(&self) -> Client {
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,1000",
        ]
        .map(str::to_owned)
        .into_iter()
        .chain([format!("--user-data-dir={}", self.profile.path().display())])
        .collect::<Vec<_>>();
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert("goog:chromeOptions".into(), json!({ "args": args }));
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .expect("chromedriver starts a Chromium session")
    }
}

fn kill_group(child: &mut Child) {
    // chromedriver leads its own group (`process_group(0)`), so this kills
    // the browser processes it started too.
    let pgid = child.id() as libc::pid_t;
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
    let _ = child.wait();
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        kill_group(&mut self.child);
    }
}

/// Where the screenshots go: `target/test-artifacts/`.
fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target tmp dir is inside the target dir")
        .join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The element `css` matches once it is there, or a panic that shows what
/// the page said instead.
async fn wait_for(c: &Client, css: &str) -> Element {
    match c.wait().at_most(WAIT).for_element(Locator::Css(css)).await {
        Ok(element) => element,
        Err(e) => {
            let text = c
                .execute("return document.body.innerText", vec![])
                .await
                .unwrap_or_default();
            let shot = c.screenshot().await.unwrap_or_default();
            let path = artifacts().join("console-failure.png");
            let _ = std::fs::write(&path, shot);
            panic!(
                "`{css}` did not appear ({e}); the page said:\n{}\n(screenshot: {})",
                text.as_str().unwrap_or_default(),
                path.display()
            )
        }
    }
}

/// Finds `css` and does `act` with it, finding it again when the page
/// replaced it in between: the runs list, the graph and the connections
/// table are re-rendered live, so an element found a moment ago may be gone
/// (WebDriver's "stale element reference").
async fn with<T>(
    c: &Client,
    css: &str,
    act: impl Fn(Element) -> BoxFuture<'static, Result<T, CmdError>>,
) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        match act(wait_for(c, css).await).await {
            Ok(value) => return value,
            Err(e) if e.is_stale_element_reference() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("`{css}`: {e}"),
        }
    }
}

async fn click(c: &Client, css: &str) {
    with(c, css, |e| {
        Box::pin(async move { e.click().await.map(|_| ()) })
    })
    .await
}

/// The text of `css`, read from one rendering of it.
async fn text_of(c: &Client, css: &str) -> String {
    with(c, css, |e| Box::pin(async move { e.text().await })).await
}

/// The attribute `name` of `css`, read from one rendering of it.
async fn attr_of(c: &Client, css: &str, name: &'static str) -> Option<String> {
    with(c, css, move |e| Box::pin(async move { e.attr(name).await })).await
}

/// Starts `workflow` on `input` with the console's form; the new run's id.
async fn start_with_form(c: &Client, workflow: &str, input: &str) -> String {
    click(c, "#nav-runs").await;
    wait_for(c, "#runs-view:not([hidden])").await;
    wait_for(c, "#start-workflow")
        .await
        .select_by_value(workflow)
        .await
        .unwrap();
    let textarea = wait_for(c, "#start-input").await;
    textarea.clear().await.unwrap();
    textarea.send_keys(input).await.unwrap();
    // The previous run's link goes away when the form is sent.
    c.execute(
        "document.getElementById('start-result').replaceChildren()",
        vec![],
    )
    .await
    .unwrap();
    click(c, "#start-button").await;
    text_of(c, "#start-result a").await
}

/// What a person sees of the page: the visible text of `main` (what is
/// hidden or not rendered is left out) and the text of each element of the
/// console's error class that is shown and says something.
struct Seen {
    text: String,
    errors: Vec<String>,
}

/// Screenshots the page to `target/test-artifacts/console-{name}.png` and
/// reads what it shows; fails on a blank page.
async fn look(c: &Client, name: &str) -> Seen {
    // The live views re-render a few times a second: let this one settle.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let shot = c.screenshot().await.unwrap();
    assert!(shot.starts_with(b"\x89PNG"), "a PNG screenshot");
    let path = artifacts().join(format!("console-{name}.png"));
    std::fs::write(&path, shot).unwrap();
    let seen = c
        .execute(
            r#"const shown = (e) => e.getClientRects().length > 0;
               return {
                 text: document.querySelector("main").innerText.trim(),
                 errors: [...document.querySelectorAll(".error")]
                   .filter(shown)
                   .map((e) => e.innerText.trim())
                   .filter((t) => t !== ""),
               };"#,
            vec![],
        )
        .await
        .unwrap();
    let text = seen["text"].as_str().unwrap_or_default().to_owned();
    let errors = seen["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_owned())
        .collect();
    assert!(
        !text.is_empty(),
        "{name}: the page shows nothing (screenshot: {})",
        path.display()
    );
    Seen { text, errors }
}

/// [`look`], and no error shown.
async fn look_fine(c: &Client, name: &str) -> String {
    let seen = look(c, name).await;
    assert!(
        seen.errors.is_empty(),
        "{name}: the page shows errors {:?}; it said:\n{}",
        seen.errors,
        seen.text
    );
    seen.text
}

/// The option the start form's select shows (its label), if any, and
/// whether the select can be used.
async fn start_choice(c: &Client) -> (Option<String>, bool) {
    let choice = c
        .execute(
            r#"const s = document.getElementById("start-workflow");
               const o = s.selectedOptions[0];
               return [o ? o.textContent : null, o ? o.value : null,
                       s.getClientRects().length > 0 && !s.disabled];"#,
            vec![],
        )
        .await
        .unwrap();
    let label = choice[0].as_str().map(str::to_owned);
    assert_eq!(choice[0], choice[1], "the label shown is what Start sends");
    (label, choice[2] == json!(true))
}

/// Opens the console at `base`, gives the token it asks for, and waits
/// for the runs page.
async fn sign_in(c: &Client, base: &str) {
    c.goto(&format!("{base}/")).await.unwrap();
    wait_for(c, "#login:not([hidden])").await;
    wait_for(c, "#token").await.send_keys(TOKEN).await.unwrap();
    click(c, "#login-button").await;
    wait_for(c, "#runs-view:not([hidden])").await;
}

/// Whether `css` is there and displayed.
async fn displayed(c: &Client, css: &str) -> bool {
    with(c, css, |e| Box::pin(async move { e.is_displayed().await })).await
}

/// The classes of the step's node in the graph, once it has `status`.
async fn step_with_status(c: &Client, step: &str, status: &str) -> String {
    attr_of(
        c,
        &format!(r#"#graph g.step[data-step="{step}"][data-status="{status}"]"#),
        "class",
    )
    .await
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_starts_follows_and_cancels_runs() {
    let serve = Serve::start(config, &["--token", TOKEN]);
    let driver = ChromeDriver::start().await;
    let c = driver.browser().await;
    c.goto(&format!("{}/", serve.base)).await.unwrap();

    // Asked for the token: the console's first data request got 401.
    wait_for(&c, "#login:not([hidden])").await;
    wait_for(&c, "#token").await.send_keys(TOKEN).await.unwrap();
    click(&c, "#login-button").await;
    wait_for(&c, "#runs-view:not([hidden])").await;
    wait_for(&c, r#"#live[data-state="live"]"#).await;

    // A run started from the form, with an input a page must not execute.
    let hostile = r#"{"text": "<img src=x onerror=\"document.title='pwned'\">"}"#;
    let pair = start_with_form(&c, "pair", hostile).await;
    // It shows up in the list and, without a reload, turns succeeded: the
    // list follows the event stream.
    let row = format!(r#"#runs-body tr[data-run-id="{pair}"]"#);
    wait_for(&c, &row).await;
    wait_for(&c, &format!(r#"{row}[data-status="succeeded"]"#)).await;
    assert_eq!(text_of(&c, &format!("{row} td.workflow")).await, "pair");

    // Its graph: two nodes coloured by status, one edge for `needs`.
    click(&c, &format!("{row} a.run-link")).await;
    wait_for(&c, "#run-view:not([hidden])").await;
    wait_for(&c, r#"#run-status[data-status="succeeded"]"#).await;
    let first = step_with_status(&c, "first", "succeeded").await;
    assert!(
        first.split(' ').any(|class| class == "status-succeeded"),
        "{first}"
    );
    step_with_status(&c, "second", "succeeded").await;
    wait_for(
        &c,
        r#"#graph path.edge[data-from="first"][data-to="second"]"#,
    )
    .await;
    assert_eq!(
        c.find_all(Locator::Css("#graph g.step"))
            .await
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        c.find_all(Locator::Css("#graph path.edge"))
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(attr_of(&c, "#retry-run", "disabled").await.is_some());

    // A step's detail: its output shown as text, its log records.
    click(&c, r#"#graph g.step[data-step="second"]"#).await;
    let text = text_of(&c, "#step-detail:not([hidden])").await;
    assert!(
        text.contains(r#"<img src=x onerror=\"document.title='pwned'\">"#),
        "{text}"
    );
    let images = with(&c, "#step-detail:not([hidden])", |detail| {
        Box::pin(async move { Ok(detail.find_all(Locator::Css("img")).await?.len()) })
    })
    .await;
    assert_eq!(images, 0, "the hostile input stayed text");
    assert_ne!(c.title().await.unwrap(), "pwned");
    wait_for(&c, "#step-detail ul.logs li.log").await;
    wait_for(&c, "#step-detail h4 + p.muted").await; // no capability calls

    // A sleeping run, cancelled from its page.
    let nap = start_with_form(&c, "nap", "{}").await;
    click(&c, "#start-result a").await;
    wait_for(
        &c,
        r#"#run-view:not([hidden]) #run-status[data-status="running"]"#,
    )
    .await;
    step_with_status(&c, "nap", "running").await;
    step_with_status(&c, "after", "pending").await;
    // Paused from its page (its running step runs on), and resumed.
    click(&c, "#pause-run:not([disabled])").await;
    wait_for(&c, r#"#run-status[data-status="paused"]"#).await;
    step_with_status(&c, "nap", "running").await;
    assert!(attr_of(&c, "#pause-run", "disabled").await.is_some());
    click(&c, "#resume-run:not([disabled])").await;
    wait_for(&c, r#"#run-status[data-status="running"]"#).await;
    assert!(attr_of(&c, "#resume-run", "disabled").await.is_some());
    // The timeline shows the pause as a band over the lanes.
    wait_for(&c, "#timeline rect.pause").await;
    wait_for(&c, r#"#timeline rect.attempt[data-step="nap"]"#).await;
    // The step's capability call shows once it returns; while it runs, the
    // step is what the graph shows.
    click(&c, "#cancel-run:not([disabled])").await;
    wait_for(&c, r#"#run-status[data-status="cancelled"]"#).await;
    let cancelled = step_with_status(&c, "nap", "cancelled").await;
    assert!(cancelled.contains("status-cancelled"), "{cancelled}");
    step_with_status(&c, "after", "cancelled").await;
    wait_for(&c, "#retry-run:not([disabled])").await;
    let record = serve
        .rpc("workflow.get", json!({"run_id": nap}), Some(TOKEN))
        .await;
    assert_eq!(record["result"]["status"], "cancelled", "{record}");

    let shot = c.screenshot().await.unwrap();
    assert!(shot.starts_with(b"\x89PNG"), "a PNG screenshot");
    std::fs::write(artifacts().join("console.png"), shot).unwrap();

    // A failed run that undid its booking: the compensation is a step of
    // the run, drawn after the step it undoes, and the timeline marks the
    // time spent compensating.
    start_with_form(&c, "trip", "{}").await;
    click(&c, "#start-result a").await;
    wait_for(
        &c,
        r#"#run-view:not([hidden]) #run-status[data-status="failed"]"#,
    )
    .await;
    let undo = step_with_status(&c, "book.compensate", "succeeded").await;
    assert!(undo.contains("compensation"), "{undo}");
    wait_for(
        &c,
        r#"#graph path.edge[data-from="book"][data-to="book.compensate"]"#,
    )
    .await;
    wait_for(&c, "#timeline rect.compensating").await;
    assert!(attr_of(&c, "#retry-run", "disabled").await.is_some());
    wait_for(&c, r#"#timeline rect.attempt[data-step="book.compensate"]"#).await;
    let shot = c.screenshot().await.unwrap();
    std::fs::write(artifacts().join("console-compensation.png"), shot).unwrap();

    // The list, filtered by status and workflow.
    click(&c, "#nav-runs").await;
    wait_for(&c, &format!(r#"#runs-body tr[data-run-id="{nap}"]"#)).await;
    wait_for(&c, "#filter-status")
        .await
        .select_by_value("cancelled")
        .await
        .unwrap();
    wait_for(
        &c,
        &format!(r#"#runs-body tr[data-run-id="{nap}"]:only-child"#),
    )
    .await;
    wait_for(&c, "#filter-status")
        .await
        .select_by_value("")
        .await
        .unwrap();
    wait_for(&c, "#filter-workflow")
        .await
        .select_by_value("pair")
        .await
        .unwrap();
    wait_for(
        &c,
        &format!(r#"#runs-body tr[data-run-id="{pair}"]:only-child"#),
    )
    .await;

    // Connections: the fixture's session, from host.status.
    click(&c, "#nav-connections").await;
    let cells = with(
        &c,
        r#"#connections-body tr[data-connection="fixture"][data-state="ready"]"#,
        |row| {
            Box::pin(async move {
                let mut texts = Vec::new();
                for cell in row.find_all(Locator::Css("td")).await? {
                    texts.push(cell.text().await?);
                }
                Ok(texts)
            })
        },
    )
    .await;
    assert_eq!(cells[3], "1", "sessions opened");
    assert_eq!(cells[6], "live", "notifications");
    std::fs::write(
        artifacts().join("console-connections.png"),
        c.screenshot().await.unwrap(),
    )
    .unwrap();

    // The token went in headers only: no URL the page loaded carries it.
    let urls = c
        .execute(
            "return performance.getEntriesByType('resource').map(e => e.name).concat([location.href])",
            vec![],
        )
        .await
        .unwrap();
    assert!(!urls.to_string().contains(TOKEN), "{urls}");
    assert!(urls.to_string().contains("/rpc"), "{urls}");

    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_the_shell_loads_but_data_requests_are_refused() {
    let serve = Serve::start(config, &["--token", TOKEN]);

    // The shell and its assets: no token needed, strict headers.
    for path in ["/", "/console/app.js", "/console/app.css"] {
        let response = http_client()
            .get(format!("{}{path}", serve.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{path}");
        let headers = response.headers();
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["referrer-policy"], "no-referrer");
    }

    // Its data requests: 401 without the token or with a wrong one.
    for token in [None, Some("wrong")] {
        let mut request = http_client()
            .post(format!("{}/rpc", serve.base))
            .header("Content-Type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"host.status"}"#);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        assert_eq!(request.send().await.unwrap().status().as_u16(), 401);
        for path in ["/events", "/metrics"] {
            assert_eq!(serve.get(path, token).await.0, 401, "{path}");
        }
    }

    // In the browser: the page loads, shows no data and asks for the token;
    // a wrong one is refused and asked for again.
    let driver = ChromeDriver::start().await;
    let c = driver.browser().await;
    c.goto(&format!("{}/", serve.base)).await.unwrap();
    wait_for(&c, "#login:not([hidden])").await;
    assert!(
        c.find_all(Locator::Css("#runs-body tr"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        !wait_for(&c, "#runs-view")
            .await
            .is_displayed()
            .await
            .unwrap(),
        "no runs without the token"
    );
    wait_for(&c, "#token")
        .await
        .send_keys("wrong")
        .await
        .unwrap();
    click(&c, "#login-button").await;
    let error = wait_for(&c, "#login-error").await;
    let deadline = Instant::now() + WAIT;
    while !error.text().await.unwrap().contains("refused") {
        assert!(Instant::now() < deadline, "the wrong token is refused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(wait_for(&c, "#login").await.is_displayed().await.unwrap());
    c.close().await.unwrap();
}

/// A first visit as a new user makes it: the token, then the start form as
/// it comes (its first workflow shown selected), Start, and the run in the
/// table until it finishes; its page; connections; a choice kept across a
/// reload; a run that does not exist. Each page is screenshotted and must
/// show something and no error (but the one the missing run is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_visit_starts_a_run_from_the_form_alone() {
    let serve = Serve::start(two_workflows, &["--token", TOKEN]);
    let status = serve.rpc("host.status", json!({}), Some(TOKEN)).await;
    let names: Vec<String> = serde_json::from_value(status["result"]["workflows"].clone()).unwrap();
    assert_eq!(names.len(), 2, "{status}");
    let driver = ChromeDriver::start().await;
    let c = driver.browser().await;
    c.goto(&format!("{}/", serve.base)).await.unwrap();

    wait_for(&c, "#login:not([hidden])").await;
    let login = look_fine(&c, "first-visit-login").await;
    assert!(login.contains("Token"), "{login}");
    wait_for(&c, "#token").await.send_keys(TOKEN).await.unwrap();
    click(&c, "#login-button").await;
    wait_for(&c, "#runs-view:not([hidden])").await;
    wait_for(&c, "#runs-empty:not([hidden])").await;

    // The form as it comes: a workflow is shown selected, Start can send it.
    let (shown, usable) = start_choice(&c).await;
    assert_eq!(shown.as_deref(), Some(names[0].as_str()), "{names:?}");
    assert!(usable, "the workflow select can be used");
    assert!(attr_of(&c, "#start-button", "disabled").await.is_none());
    let fresh = look_fine(&c, "first-visit-runs-empty").await;
    assert!(fresh.contains("No runs."), "{fresh}");

    // Start, touching nothing else: the run shows up and finishes, with the
    // input the form built from the workflow's `input_schema`.
    click(&c, "#start-button").await;
    let run = text_of(&c, "#start-result a").await;
    let row = format!(r#"#runs-body tr[data-run-id="{run}"]"#);
    wait_for(&c, &format!(r#"{row}[data-status="succeeded"]"#)).await;
    let record = serve
        .rpc("workflow.get", json!({"run_id": run}), Some(TOKEN))
        .await;
    assert_eq!(
        record["result"]["input"],
        json!({"name": "world", "times": 1}),
        "{record}"
    );
    assert_eq!(text_of(&c, &format!("{row} td.workflow")).await, names[0]);
    assert!(!displayed(&c, "#runs-empty").await);
    let runs = look_fine(&c, "first-visit-runs").await;
    assert!(runs.contains(&run), "{runs}");

    // Its page: the graph of its step, the input it was started with.
    click(&c, &format!("{row} a.run-link")).await;
    wait_for(&c, r#"#run-status[data-status="succeeded"]"#).await;
    wait_for(&c, r#"#graph g.step[data-status="succeeded"]"#).await;
    assert!(displayed(&c, "#run-steps").await);
    let page = look_fine(&c, "first-visit-run").await;
    assert!(page.contains(&run) && page.contains("Input"), "{page}");

    // No connections: said so, not an empty table alone.
    click(&c, "#nav-connections").await;
    wait_for(&c, "#connections-empty:not([hidden])").await;
    let connections = look_fine(&c, "first-visit-connections").await;
    assert!(
        connections.contains("No connections are configured."),
        "{connections}"
    );

    // Another workflow chosen stays chosen when the page is reloaded.
    click(&c, "#nav-runs").await;
    wait_for(&c, "#start-workflow")
        .await
        .select_by_value(&names[1])
        .await
        .unwrap();
    c.refresh().await.unwrap();
    wait_for(&c, "#runs-view:not([hidden])").await;
    wait_for(&c, &format!(r#"#runs-body tr[data-run-id="{run}"]"#)).await;
    assert_eq!(start_choice(&c).await.0.as_deref(), Some(names[1].as_str()));

    // A run that does not exist, opened after a real one: its own id, the
    // reason, nothing of the run seen before, no actions, no empty graph.
    c.goto(&format!("{}/#/runs/{run}", serve.base))
        .await
        .unwrap();
    wait_for(&c, r#"#run-status[data-status="succeeded"]"#).await;
    c.goto(&format!("{}/#/runs/no-such-run", serve.base))
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while !text_of(&c, "#run-error").await.contains("unknown run") {
        assert!(Instant::now() < deadline, "the missing run is reported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(text_of(&c, "#run-id").await, "no-such-run");
    assert_eq!(text_of(&c, "#run-summary").await, "");
    assert!(attr_of(&c, "#cancel-run", "disabled").await.is_some());
    assert!(attr_of(&c, "#retry-run", "disabled").await.is_some());
    assert!(!displayed(&c, "#run-steps").await, "no empty graph");
    let missing = look(&c, "first-visit-unknown-run").await;
    assert_eq!(missing.errors, ["unknown run `no-such-run`"]);
    assert!(!missing.text.contains(&run), "{}", missing.text);

    c.close().await.unwrap();
}

/// A server with nothing yet: each page says what is missing instead of
/// showing empty controls, and Start cannot be pressed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_workflows_runs_or_connections_each_page_says_so() {
    let serve = Serve::start(nothing, &[]);
    let driver = ChromeDriver::start().await;
    let c = driver.browser().await;
    c.goto(&format!("{}/", serve.base)).await.unwrap();

    wait_for(&c, "#runs-view:not([hidden])").await;
    wait_for(&c, "#runs-empty:not([hidden])").await;
    assert!(displayed(&c, "#no-workflows").await);
    assert!(attr_of(&c, "#start-button", "disabled").await.is_some());
    assert_eq!(start_choice(&c).await, (None, false));
    let runs = look_fine(&c, "empty-runs").await;
    assert!(
        runs.contains("defines no workflows") && runs.contains("No runs."),
        "{runs}"
    );

    click(&c, "#nav-connections").await;
    wait_for(&c, "#connections-empty:not([hidden])").await;
    let connections = look_fine(&c, "empty-connections").await;
    assert!(
        connections.contains("No connections are configured."),
        "{connections}"
    );
    c.close().await.unwrap();
}

/// `deploy`: an echo step, then an approval (`wait = "approve"`); and a
/// nightly schedule of it, for the schedules list.
fn approval(dir: &Path) -> PathBuf {
    let echo = plugin("echo");
    let path = dir.join("wf.toml");
    std::fs::write(
        &path,
        format!(
            r#"[[workflows.deploy.steps]]
id = "prepare"
component = {echo:?}

[[workflows.deploy.steps]]
id = "approve"
needs = ["prepare"]
wait = "approve"
input = '.steps.prepare.output'

[[workflows.deploy.schedules]]
name = "nightly"
cron = "0 3 * * *"
timezone = "Europe/Paris"
"#
        ),
    )
    .unwrap();
    path
}

/// A run waiting for approval is listed as waiting, with what it waits for;
/// its step offers Approve and Reject, and a click with a comment resumes
/// it, the comment and the decision becoming the step's output. The
/// schedules are listed with their next fire time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_is_approved_with_a_click() {
    let serve = Serve::start(approval, &["--token", TOKEN]);
    let started = serve
        .rpc(
            "workflow.start",
            json!({"workflow": "deploy", "input": {"release": "7.1"}}),
            Some(TOKEN),
        )
        .await;
    let run_id = started["result"]["run_id"].as_str().unwrap().to_owned();
    let driver = ChromeDriver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &serve.base).await;

    let schedule = r#"#schedules-body tr[data-schedule="nightly"]"#;
    wait_for(&c, schedule).await;
    let next = text_of(&c, &format!("{schedule} td.next-at")).await;
    assert!(!next.is_empty() && next != "never", "{next}");
    let waiting = format!(r#"#waiting-body tr[data-run-id="{run_id}"]"#);
    wait_for(&c, &waiting).await;
    assert!(text_of(&c, &waiting).await.contains("approve"));
    look_fine(&c, "waiting").await;

    click(&c, &format!("{waiting} a.run-link")).await;
    wait_for(&c, "#run-view:not([hidden])").await;
    step_with_status(&c, "approve", "waiting").await;
    wait_for(&c, "#signal-comment")
        .await
        .send_keys("ship it")
        .await
        .unwrap();
    look_fine(&c, "approval").await;
    click(&c, "#approve-step").await;
    wait_for(&c, r#"#run-status[data-status="succeeded"]"#).await;
    let got = serve
        .rpc("workflow.get", json!({"run_id": run_id}), Some(TOKEN))
        .await;
    assert_eq!(
        got["result"]["steps"][1]["output"],
        json!({"approved": true, "comment": "ship it"}),
        "{got}"
    );
    c.close().await.unwrap();
}

/// `release`: a child step that runs `approval`, whose one step is the
/// durable `approval` node (it asks, sleeps 8 s, waits for `approve`).
fn durable(dir: &Path) -> PathBuf {
    let approval = plugin("approval");
    let path = dir.join("wf.toml");
    std::fs::write(
        &path,
        format!(
            r#"[connections.fixture]
command = "wf-host"
args = ["fixture-server"]

[[workflows.approval.steps]]
id = "ask"
component = {approval:?}
allow = ["fixture.echo"]

[[workflows.release.steps]]
id = "child"
workflow = "approval"
input = '{{request: .input.release, notify: "fixture.echo", sleep_ms: 8000}}'
"#
        ),
    )
    .unwrap();
    path
}

/// A child step and a durable node that wait are shown `waiting`, with what
/// for: the parent's step links to its child run; the child's durable step
/// says until when it sleeps, then offers Approve and Reject for the signal
/// its node waits for. The step's journal lists its calls and waits in order,
/// with the clock reads before them. A click resumes the node, and both runs
/// succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_durable_node_and_child_run_are_shown_and_approved() {
    let serve = Serve::start(durable, &["--token", TOKEN]);
    let driver = ChromeDriver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &serve.base).await;
    // Started once the browser is ready: the node sleeps 8 s, and the page
    // is to see it asleep.
    let started = serve
        .rpc(
            "workflow.start",
            json!({"workflow": "release", "input": {"release": "7.2"}}),
            Some(TOKEN),
        )
        .await;
    let run_id = started["result"]["run_id"].as_str().unwrap().to_owned();
    c.goto(&format!("{}/#/runs/{run_id}", serve.base))
        .await
        .unwrap();
    wait_for(&c, "#run-view:not([hidden])").await;
    step_with_status(&c, "child", "waiting").await;
    let link = wait_for(&c, ".wait-box a.run-link").await;
    let child = link.text().await.unwrap();
    assert!(text_of(&c, ".wait-box").await.contains("approval"));
    look_fine(&c, "durable-parent").await;

    click(&c, ".wait-box a.run-link").await;
    wait_for(&c, "#run-id").await;
    let deadline = Instant::now() + WAIT;
    while text_of(&c, "#run-id").await != child {
        assert!(Instant::now() < deadline, "the link did not open {child}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    step_with_status(&c, "ask", "waiting").await;
    assert!(
        text_of(&c, "#step-detail").await.contains("Sleeps until"),
        "{}",
        text_of(&c, "#step-detail").await
    );
    wait_for(&c, "#signal-comment")
        .await
        .send_keys("go")
        .await
        .unwrap();
    // The journal: the call, the sleep, the wait, each in its turn, and
    // the clock and random reads before the first call.
    let journal = text_of(&c, "table.calls").await;
    let order: Vec<usize> = ["fixture.echo", "wf:sleep", "wf:wait-signal"]
        .iter()
        .map(|name| {
            journal
                .find(name)
                .unwrap_or_else(|| panic!("{name}: {journal}"))
        })
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{journal}");
    // The timeline: the step's attempt, and its waits as parks.
    wait_for(&c, r#"#timeline rect.attempt[data-step="ask"]"#).await;
    wait_for(&c, r#"#timeline rect.park[data-step="ask"]"#).await;
    let reads = text_of(&c, "table.calls tr.call td.tape").await;
    assert!(reads.contains("wall") && reads.contains("seed"), "{reads}");
    look_fine(&c, "durable-waiting").await;
    click(&c, "#approve-step").await;
    wait_for(&c, r#"#run-status[data-status="succeeded"]"#).await;

    let done = serve
        .rpc(
            "workflow.wait",
            json!({"run_id": run_id, "timeout_ms": 30000}),
            Some(TOKEN),
        )
        .await;
    assert_eq!(done["result"]["status"], "succeeded", "{done}");
    assert_eq!(
        done["result"]["output"]["decision"],
        json!({"approved": true, "comment": "go"})
    );
    c.close().await.unwrap();
}

/// `gated`: an echo, a wait for `go`, then an echo whose input `v` says
/// which definition mapped it.
fn gated(v: u32) -> impl Fn(&Path) -> PathBuf {
    move |dir: &Path| {
        let echo = plugin("echo");
        let path = dir.join("wf.toml");
        std::fs::write(
            &path,
            format!(
                r#"[[workflows.gated.steps]]
id = "first"
component = {echo:?}

[[workflows.gated.steps]]
id = "gate"
needs = ["first"]
wait = "go"

[[workflows.gated.steps]]
id = "last"
needs = ["gate"]
component = {echo:?}
input = '{{v: {v}}}'
"#
            ),
        )
        .unwrap();
        path
    }
}

/// A run on a definition older than the one in force says so on its page,
/// and Migrate moves it: its later step then maps as the definition in
/// force says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_run_is_migrated_with_a_click() {
    let serve = Serve::start(gated(1), &["--token", TOKEN]);
    let started = serve
        .rpc("workflow.start", json!({"workflow": "gated"}), Some(TOKEN))
        .await;
    let run_id = started["result"]["run_id"].as_str().unwrap().to_owned();
    gated(2)(serve.dir.path());
    let reloaded = serve.rpc("host.reload", json!({}), Some(TOKEN)).await;
    assert_eq!(
        reloaded["result"]["changed"],
        json!(["gated"]),
        "{reloaded}"
    );
    let status = serve.rpc("host.status", json!({}), Some(TOKEN)).await;
    let run = serve
        .rpc("workflow.get", json!({"run_id": run_id}), Some(TOKEN))
        .await;
    assert_ne!(
        status["result"]["definitions"]["gated"]["current"], run["result"]["definition_hash"],
        "{status} {run}"
    );

    let driver = ChromeDriver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &serve.base).await;
    c.goto(&format!("{}/#/runs/{run_id}", serve.base))
        .await
        .unwrap();
    step_with_status(&c, "gate", "waiting").await;
    wait_for(&c, "#older-definition").await;
    look_fine(&c, "older-definition").await;
    click(&c, "#migrate-run:not([disabled])").await;
    let deadline = Instant::now() + WAIT;
    let older = "return document.querySelector('#older-definition') !== null";
    while c.execute(older, vec![]).await.unwrap() == json!(true) {
        assert!(Instant::now() < deadline, "still on the older definition");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(attr_of(&c, "#migrate-run", "disabled").await.is_some());
    serve
        .rpc(
            "workflow.signal",
            json!({"run_id": run_id, "signal": "go", "payload": {}}),
            Some(TOKEN),
        )
        .await;
    wait_for(&c, r#"#run-status[data-status="succeeded"]"#).await;
    let done = serve
        .rpc("workflow.get", json!({"run_id": run_id}), Some(TOKEN))
        .await;
    assert_eq!(done["result"]["output"], json!({"v": 2}), "{done}");
    c.close().await.unwrap();
}

/// A workflow whose step calls the official Python SDK server's `ask`
/// tool, which elicits `{answer}`.
fn asking(dir: &Path) -> PathBuf {
    let (program, args) = common::interop::Sdk::Python.command();
    let path = dir.join("wf.toml");
    std::fs::write(
        &path,
        format!(
            r#"[connections.py]
command = {program:?}
args = {args:?}

[workflows.asks]
component = {call:?}
allow = ["py.ask"]
"#,
            program = program.display().to_string(),
            call = plugin("call"),
        ),
    )
    .unwrap();
    path
}

/// A question the Python SDK server asks a step's call is shown on the
/// step as a form built from its requested schema; what a person types and
/// submits is the answer the tool gets, and the run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_from_upstream_is_answered_in_a_form() {
    let serve = Serve::start(asking, &["--token", TOKEN]);
    let started = serve
        .rpc(
            "workflow.start",
            json!({"workflow": "asks", "input": {"capability": "py.ask", "arguments": {"message": "Which colour?"}}}),
            Some(TOKEN),
        )
        .await;
    let run_id = started["result"]["run_id"].as_str().unwrap().to_owned();
    let driver = ChromeDriver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &serve.base).await;
    let row = format!(r#"#runs-body tr[data-run-id="{run_id}"]"#);
    wait_for(&c, &row).await;
    click(&c, &format!("{row} a.run-link")).await;
    wait_for(&c, "#run-view:not([hidden])").await;
    // The step with the question is shown by itself.
    wait_for(&c, ".question-box").await;
    assert_eq!(text_of(&c, ".question-message").await, "Which colour?");
    wait_for(&c, r#".question-box input[name="answer"]"#)
        .await
        .send_keys("teal")
        .await
        .unwrap();
    look_fine(&c, "question").await;
    click(&c, ".question-box .answer-accept").await;
    wait_for(&c, r#"#run-status[data-status="succeeded"]"#).await;
    let got = serve
        .rpc("workflow.get", json!({"run_id": run_id}), Some(TOKEN))
        .await;
    assert_eq!(
        got["result"]["output"]["content"][0]["text"], "answer: teal",
        "{got}"
    );
    c.close().await.unwrap();
}

/// [`config`] on a host that drives one run at most.
fn one_live_run(dir: &Path) -> PathBuf {
    let path = config(dir);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("[runtime]\nmax_live_runs = 1\n\n{text}")).unwrap();
    path
}

/// While the host drives as many runs as it may, the console says it is
/// busy in a banner (new starts are refused), and the banner goes once the
/// run ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_host_shows_a_banner_until_a_run_ends() {
    let serve = Serve::start(one_live_run, &["--token", TOKEN]);
    // Inside a two-minute upstream call: driven, so it counts.
    let started = serve
        .rpc("workflow.start", json!({"workflow": "nap"}), Some(TOKEN))
        .await;
    let run_id = started["result"]["run_id"].as_str().unwrap().to_owned();
    let refused = serve
        .rpc("workflow.start", json!({"workflow": "pair"}), Some(TOKEN))
        .await;
    assert_eq!(refused["error"]["code"], -32004, "{refused}");
    let driver = ChromeDriver::start().await;
    let c = driver.browser().await;
    sign_in(&c, &serve.base).await;

    wait_for(&c, r#"#banner[data-kind="busy"]:not([hidden])"#).await;
    let said = text_of(&c, "#banner").await;
    assert!(
        said.contains("Busy") && said.contains("1 run,") && said.contains("max_live_runs"),
        "{said}"
    );
    look_fine(&c, "busy").await;

    let cancelled = serve
        .rpc("workflow.cancel", json!({"run_id": run_id}), Some(TOKEN))
        .await;
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    wait_for(&c, "#banner[hidden]").await;
    c.close().await.unwrap();
}
