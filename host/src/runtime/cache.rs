//! The precompile cache: compiled components on disk, keyed by the component's
//! content hash and the engine's compatibility hash.
//!
//! An entry is `<sha256 of the artifact><artifact>`. The checksum is verified
//! before the artifact is handed to wasmtime, because `Component::deserialize`
//! trusts its input: a truncated or corrupt file must be rebuilt, never loaded.
//!
//! An entry is native code, and the checksum proves only that it is intact, not
//! who wrote it. So the directory must be this user's alone: it is created with
//! mode 0700, and a directory (or entry) that another user owns or that group or
//! others may write is refused. Entries of other engine versions are pruned, and
//! at most [`MAX_ENTRIES`] are kept, the newest.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

const CHECKSUM_LEN: usize = 32;

/// How many entries of this engine version the cache keeps; the oldest (by
/// modification time) are removed first.
pub const MAX_ENTRIES: usize = 256;

/// Why a cache directory is not used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot create the precompile cache directory `{}`: {source}", dir.display())]
    Create {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("the precompile cache path `{}` is not a directory", dir.display())]
    NotADirectory { dir: PathBuf },
    #[error(
        "the precompile cache directory `{}` is owned by uid {owner}, not by this user (uid {me}); its entries are native code, so only this user's own directory is used",
        dir.display()
    )]
    NotOwned { dir: PathBuf, owner: u32, me: u32 },
    #[error(
        "the precompile cache directory `{}` may be written by group or others (mode {mode:o}); its entries are native code; run `chmod go-w` on it",
        dir.display()
    )]
    Writable { dir: PathBuf, mode: u32 },
}

/// Counters for what the cache did. Tests assert on them instead of timings.
#[derive(Debug, Default)]
pub struct CacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Entries that failed their checksum or were refused by the engine.
    pub rejected: AtomicU64,
    /// Entries written.
    pub stored: AtomicU64,
    /// Entries removed: other engine versions, or past [`MAX_ENTRIES`].
    pub pruned: AtomicU64,
}

/// A point-in-time copy of [`CacheCounters`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub rejected: u64,
    pub stored: u64,
    pub pruned: u64,
}

impl CacheCounters {
    pub fn snapshot(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            stored: self.stored.load(Ordering::Relaxed),
            pruned: self.pruned.load(Ordering::Relaxed),
        }
    }
}

/// Where an entry for a component lives, and how to load or store it.
#[derive(Debug)]
pub struct ComponentCache {
    dir: PathBuf,
    engine_key: String,
    max_entries: usize,
    pub(crate) counters: CacheCounters,
}

impl ComponentCache {
    /// A cache under `dir` for artifacts of `engine`. Creates the directory
    /// (mode 0700) if it is missing.
    ///
    /// # Errors
    /// A [`CacheError`] when the directory cannot be created, or another user
    /// owns it, or group or others may write it.
    pub fn open(dir: PathBuf, engine: &Engine) -> Result<Self, CacheError> {
        check_private_dir(&dir)?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(ComponentCache {
            dir,
            engine_key: format!("{:016x}", hasher.finish()),
            max_entries: MAX_ENTRIES,
            counters: CacheCounters::default(),
        })
    }

    /// The directory entries live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry path for a component with these bytes.
    pub fn entry_path(&self, wasm: &[u8]) -> PathBuf {
        let content = hex::encode(Sha256::digest(wasm));
        self.dir
            .join(format!("{content}-{}.cwasm", self.engine_key))
    }

    /// Loads the component from the cache, or compiles and stores it.
    ///
    /// # Errors
    /// Only compile errors; cache I/O failures are logged and fall back to a
    /// plain compile.
    pub fn load_or_compile(&self, engine: &Engine, wasm: &[u8]) -> wasmtime::Result<Component> {
        let path = self.entry_path(wasm);
        match self.load(engine, &path) {
            Some(component) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(component);
            }
            None => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        let artifact = engine.precompile_component(wasm)?;
        // SAFETY: the artifact was produced just now by this engine.
        let component = unsafe { Component::deserialize(engine, &artifact)? };
        match self.store(&path, &artifact) {
            Ok(()) => {
                self.counters.stored.fetch_add(1, Ordering::Relaxed);
                self.prune(&path);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), "could not write precompile cache entry: {e}")
            }
        }
        Ok(component)
    }

    fn load(&self, engine: &Engine, path: &Path) -> Option<Component> {
        let read = || -> std::io::Result<Result<Vec<u8>, String>> {
            let mut file = std::fs::File::open(path)?;
            // Checked on the open handle, so the file cannot be swapped after.
            if let Err(why) = check_private(&file.metadata()?) {
                return Ok(Err(why));
            }
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes)?;
            Ok(Ok(bytes))
        };
        let bytes = match read() {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(why)) => {
                self.reject(path, &why);
                return None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), "cannot read precompile cache entry: {e}");
                return None;
            }
        };
        if bytes.len() < CHECKSUM_LEN
            || Sha256::digest(&bytes[CHECKSUM_LEN..]).as_slice() != &bytes[..CHECKSUM_LEN]
        {
            self.reject(path, "checksum mismatch (corrupt or truncated)");
            return None;
        }
        // SAFETY: the checksum proves these are the bytes this cache wrote, and
        // wasmtime checks the artifact's engine compatibility header itself.
        match unsafe { Component::deserialize(engine, &bytes[CHECKSUM_LEN..]) } {
            Ok(component) => Some(component),
            Err(e) => {
                self.reject(path, &format!("refused by the engine: {e}"));
                None
            }
        }
    }

    fn reject(&self, path: &Path, why: &str) {
        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(path = %path.display(), "discarding precompile cache entry: {why}; recompiling");
        let _ = std::fs::remove_file(path);
    }

    fn store(&self, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
        // Created at open; made again if someone removed it since (mode 0700).
        create_private_dir(&self.dir)?;
        // Write to a unique temporary file, then rename, so readers never see a
        // half-written entry and concurrent writers do not interleave.
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        tmp.write_all(&Sha256::digest(artifact))?;
        tmp.write_all(artifact)?;
        tmp.as_file().sync_all()?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}

impl ComponentCache {
    /// Removes entries of other engine versions, stale temporary files, and
    /// the oldest entries past `max_entries`. `keep` (just written) stays.
    fn prune(&self, keep: &Path) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let ours = format!("-{}.cwasm", self.engine_key);
        let mut current = Vec::new();
        for entry in dir.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(meta) = entry.metadata() else { continue };
            let modified = meta.modified().unwrap_or(std::time::SystemTime::UNIX_EPOCH);
            let stale_tmp =
                name.starts_with(".tmp") && modified.elapsed().is_ok_and(|age| age > STALE_TMP);
            if name.ends_with(&ours) {
                if path != keep {
                    current.push((modified, path));
                }
            } else if name.ends_with(".cwasm") || stale_tmp {
                self.remove(&path);
            }
        }
        // Newest first; what is past the budget (counting `keep`) goes.
        current.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
        for (_, path) in current.iter().skip(self.max_entries.saturating_sub(1)) {
            self.remove(path);
        }
    }

    fn remove(&self, path: &Path) {
        if std::fs::remove_file(path).is_ok() {
            self.counters.pruned.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A temporary file this old is left over from a crashed writer.
const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(3600);

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Creates `dir` if missing and checks that it is this user's alone.
fn check_private_dir(dir: &Path) -> Result<(), CacheError> {
    create_private_dir(dir).map_err(|source| CacheError::Create {
        dir: dir.to_owned(),
        source,
    })?;
    let meta = std::fs::metadata(dir).map_err(|source| CacheError::Create {
        dir: dir.to_owned(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(CacheError::NotADirectory {
            dir: dir.to_owned(),
        });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(CacheError::NotOwned {
                dir: dir.to_owned(),
                owner: meta.uid(),
                me,
            });
        }
        if meta.mode() & 0o022 != 0 {
            return Err(CacheError::Writable {
                dir: dir.to_owned(),
                mode: meta.mode() & 0o7777,
            });
        }
    }
    Ok(())
}

/// An entry must be this user's and writable by no one else.
fn check_private(meta: &std::fs::Metadata) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(format!("owned by uid {}, not this user", meta.uid()));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "writable by group or others (mode {:o})",
                meta.mode() & 0o7777
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    Ok(())
}

/// The default cache directory: `$WF_HOST_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/wf-host`, else `$HOME/.cache/wf-host`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("WF_HOST_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("wf-host"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("wf-host"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_the_newest_entries_and_drops_other_engines() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::default();
        let mut cache = ComponentCache::open(dir.path().join("c"), &engine).unwrap();
        cache.max_entries = 3;
        let ours = |n: usize| {
            cache
                .dir
                .join(format!("{n:064x}-{}.cwasm", cache.engine_key))
        };
        let base = std::time::SystemTime::now() - std::time::Duration::from_secs(1000);
        for n in 0..5 {
            let f = std::fs::File::create(ours(n)).unwrap();
            f.set_modified(base + std::time::Duration::from_secs(n as u64 * 10))
                .unwrap();
        }
        let other = cache.dir.join(format!("{:064x}-0000000000000000.cwasm", 9));
        std::fs::write(&other, b"old engine").unwrap();
        let unrelated = cache.dir.join("notes.txt");
        std::fs::write(&unrelated, b"kept").unwrap();

        let keep = ours(0); // just written, though its mtime is the oldest
        cache.prune(&keep);
        let mut left: Vec<_> = std::fs::read_dir(&cache.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        left.sort();
        let mut expected = vec![ours(0), ours(3), ours(4), unrelated];
        expected.sort();
        assert_eq!(left, expected);
        assert_eq!(cache.counters.snapshot().pruned, 3);
    }
}
