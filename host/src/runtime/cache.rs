//! The precompile cache: compiled components on disk, keyed by the component's
//! content hash and the engine's compatibility hash.
//!
//! An entry is `<sha256 of the artifact><artifact>`. The checksum is verified
//! before the artifact is handed to wasmtime, because `Component::deserialize`
//! trusts its input: a truncated or corrupt file must be rebuilt, never loaded.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

const CHECKSUM_LEN: usize = 32;

/// Counters for what the cache did. Tests assert on them instead of timings.
#[derive(Debug, Default)]
pub struct CacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Entries that failed their checksum or were refused by the engine.
    pub rejected: AtomicU64,
    /// Entries written.
    pub stored: AtomicU64,
}

/// A point-in-time copy of [`CacheCounters`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub rejected: u64,
    pub stored: u64,
}

impl CacheCounters {
    pub fn snapshot(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            stored: self.stored.load(Ordering::Relaxed),
        }
    }
}

/// Where an entry for a component lives, and how to load or store it.
#[derive(Debug)]
pub struct ComponentCache {
    dir: PathBuf,
    engine_key: String,
    pub(crate) counters: CacheCounters,
}

impl ComponentCache {
    /// A cache under `dir` for artifacts of `engine`. The directory is created on
    /// first store.
    pub fn new(dir: PathBuf, engine: &Engine) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        ComponentCache {
            dir,
            engine_key: format!("{:016x}", hasher.finish()),
            counters: CacheCounters::default(),
        }
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
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), "could not write precompile cache entry: {e}")
            }
        }
        Ok(component)
    }

    fn load(&self, engine: &Engine, path: &Path) -> Option<Component> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
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
        std::fs::create_dir_all(&self.dir)?;
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
