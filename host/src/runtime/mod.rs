//! The node runtime: one shared engine, components checked once and kept ready
//! to instantiate, and a fresh, locked-down instance for every run.

mod cache;
mod stdio;
mod tape;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
    UpdateDeadline,
};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

pub use cache::{CacheError, CacheStats, ComponentCache, default_cache_dir};
use stdio::CapturedOutput;

use crate::bindings::{NodeError, NodePre};
use crate::capability::{
    CallJournal, CapabilityBackend, CapabilityCtx, LogBuffer, LogRecord, truncate_utf8,
};
use crate::grants::Grants;

/// The WIT world every node must target.
pub const WORLD: &str = "wf:node/node@0.2.0";

/// The interfaces of ours a node may import: the current ones, and those of
/// earlier versions, whose nodes run unchanged.
pub const CAPABILITY_INTERFACES: &[&str] = &[
    "wf:node/capability@0.2.0",
    DURABLE_INTERFACE,
    "wf:node/capability@0.1.0",
];

/// The interface of waits that outlive the instance: a node that imports it
/// is a durable node.
pub const DURABLE_INTERFACE: &str = "wf:node/durable@0.2.0";

/// How often the epoch ticks. Deadlines and cancellation are checked at this
/// granularity while guest code runs.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// How much guest stdout and stderr is kept per run and stream.
const CAPTURE_CAP: usize = 1 << 20;

/// How much of a node error's `code` and `message` a run keeps.
const NODE_ERROR_CODE_CAP: usize = 128;
const NODE_ERROR_MESSAGE_CAP: usize = 64 << 10;

/// What one component instance may hold in the pool. Our largest real guests
/// (CPython via componentize-py, QuickJS via jco) fit with room to spare; a
/// component past these fails to instantiate instead of draining the pool.
const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 128;
const MAX_MEMORIES_PER_COMPONENT: u32 = 8;
const MAX_TABLES_PER_COMPONENT: u32 = 32;

/// Per-run limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time for one run, including time spent in capability calls
    /// and waiting for a free run slot.
    pub timeout: Duration,
    /// Linear memory per run, in bytes: the sum over all of the component's
    /// memories.
    pub max_memory: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(30),
            max_memory: 256 << 20,
        }
    }
}

/// Which instance allocator the engine uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Allocator {
    /// Pre-reserved slots: the fastest instantiation. The default.
    #[default]
    Pooling,
    /// Memory mapped per instance on demand.
    OnDemand,
}

/// How to build a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where precompiled components are kept; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// Limits for runs that do not set their own.
    pub limits: Limits,
    /// The largest `max_memory` any run may ask for; the pool reserves slots of
    /// this size. Defaults to `limits.max_memory`.
    pub memory_ceiling: Option<u64>,
    pub allocator: Allocator,
    /// Runs that execute at once; later runs wait for a slot (the wait counts
    /// against their deadline). At most `pool_instances` with the pooling
    /// allocator.
    pub max_concurrent_runs: usize,
    /// The largest input JSON a run accepts, in bytes.
    pub max_input: usize,
    /// The largest output JSON a run keeps, in bytes.
    pub max_output: usize,
    /// Component instance slots the pooling allocator reserves; its core
    /// instance, memory and table slots scale with it.
    pub pool_instances: u32,
    /// How the pooling allocator resets a slot between runs.
    pub reset: SlotReset,
}

/// How the pooling allocator resets memory between runs.
///
/// By default every run gets freshly decommitted memory: page faults and TLB
/// shoot-downs on every run. Where Linux's `PAGEMAP_SCAN` ioctl is there
/// (kernel 6.7+), the low `keep_resident` bytes of a slot's memory stay
/// mapped and only the pages the run touched are restored to their original
/// contents, byte for byte. Without the ioctl the settings are not used:
/// keeping memory resident without it costs more than it saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotReset {
    /// Use `PAGEMAP_SCAN` where the kernel has it.
    pub pagemap_scan: bool,
    /// Linear memory kept resident per slot, in bytes.
    pub keep_resident: u64,
    /// Table bytes kept resident per slot.
    pub table_keep_resident: u64,
    /// Async stack bytes kept resident per slot.
    pub stack_keep_resident: u64,
}

impl Default for SlotReset {
    fn default() -> Self {
        SlotReset {
            pagemap_scan: true,
            keep_resident: 16 << 20,
            table_keep_resident: 64 << 10,
            stack_keep_resident: 1 << 20,
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: None,
            limits: Limits::default(),
            memory_ceiling: None,
            allocator: Allocator::default(),
            max_concurrent_runs: DEFAULT_MAX_CONCURRENT_RUNS,
            max_input: DEFAULT_MAX_IO,
            max_output: DEFAULT_MAX_IO,
            pool_instances: DEFAULT_POOL_INSTANCES,
            reset: SlotReset::default(),
        }
    }
}

/// Default for [`RuntimeConfig::max_concurrent_runs`].
pub const DEFAULT_MAX_CONCURRENT_RUNS: usize = 64;
/// Default for [`RuntimeConfig::max_input`] and [`RuntimeConfig::max_output`].
pub const DEFAULT_MAX_IO: usize = 4 << 20;
/// Default for [`RuntimeConfig::pool_instances`].
pub const DEFAULT_POOL_INSTANCES: u32 = 256;

/// Why a component could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("component `{path}` not found")]
    NotFound { path: PathBuf },
    #[error("cannot read component `{path}`: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "`{name}` is not a WebAssembly file (it does not start with the `\\0asm` header); wf-host runs components built for the `{WORLD}` world"
    )]
    NotWasm { name: String },
    #[error(
        "`{name}` is a core WebAssembly module, not a component; build it for `wasm32-wasip2`, or wrap it with `wasm-tools component new {name} -o node.wasm` (add `--adapt wasi_snapshot_preview1=<adapter.wasm>` if it imports WASI preview 1)"
    )]
    CoreModule { name: String },
    #[error("`{name}` is not a valid component: {detail}")]
    Invalid { name: String, detail: String },
    #[error("`{name}` does not target the `{WORLD}` world: {detail}")]
    WrongWorld { name: String, detail: String },
    #[error("cannot set up the WebAssembly engine: {0}")]
    Engine(String),
}

/// Why a run did not produce output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The node's `run` returned an error.
    #[error("node returned error `{code}`: {message}")]
    Node { code: String, message: String },
    /// The input is not JSON, or is larger than the runtime accepts.
    #[error("input {0}")]
    InvalidInput(String),
    #[error("node returned invalid JSON: {0}")]
    InvalidOutput(String),
    #[error(
        "node returned {size} bytes of output; the limit is {limit} bytes (`[runtime] max_output`)"
    )]
    OutputTooLarge { size: usize, limit: usize },
    #[error("run exceeded its time limit of {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    #[error("run exceeded its memory limit of {}", bytesize::ByteSize(*.0))]
    MemoryLimit(u64),
    #[error("run was cancelled")]
    Cancelled,
    /// Every instance slot of a kind is taken; retrying later may succeed.
    #[error("the host is at capacity ({0}); retry later")]
    Busy(String),
    #[error("node trapped: {0}")]
    Trap(String),
}

impl RunError {
    /// A short code: the node's own code, or `timeout`, `memory-limit`, …
    pub fn code(&self) -> &str {
        match self {
            RunError::Node { code, .. } => code,
            RunError::InvalidInput(_) => "invalid-input",
            RunError::InvalidOutput(_) => "invalid-output",
            RunError::OutputTooLarge { .. } => "output-too-large",
            RunError::Timeout(_) => "timeout",
            RunError::MemoryLimit(_) => "memory-limit",
            RunError::Cancelled => "cancelled",
            RunError::Busy(_) => "busy",
            RunError::Trap(_) => "trap",
        }
    }
}

/// A loaded component, checked against the world and ready to instantiate.
#[derive(Clone)]
pub struct Node {
    name: Arc<str>,
    pre: NodePre<NodeState>,
    /// It imports [`DURABLE_INTERFACE`]: it may wait, and then runs again
    /// answered from its journal, so it must run the same way each time.
    durable: bool,
}

impl Node {
    /// The node's name: the component's file stem.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the node may wait past its instance (`wf:node/durable`).
    pub fn is_durable(&self) -> bool {
        self.durable
    }
}

/// Options for one run.
#[derive(Clone)]
pub struct RunOptions {
    /// Tags logs and capability calls; generated when empty.
    pub run_id: String,
    /// Overrides the runtime's default limits.
    pub limits: Option<Limits>,
    /// Cancels the run: the guest is interrupted at the next epoch tick, and an
    /// in-flight capability call is dropped (which cancels it upstream).
    pub cancel: CancellationToken,
    /// What the node may reach. Nothing by default.
    pub grants: Arc<Grants>,
    /// Records every capability call and keys tool calls for idempotency (a
    /// workflow step's attempt). None for a plain run.
    pub journal: Option<Arc<dyn CallJournal>>,
    /// The span the node's capability calls are children of (a workflow
    /// step's); none for a plain run, whose calls are trace roots.
    pub span: tracing::Span,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            run_id: String::new(),
            limits: None,
            cancel: CancellationToken::new(),
            grants: Arc::default(),
            journal: None,
            span: tracing::Span::none(),
        }
    }
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub run_id: String,
    /// The node's output JSON text, exactly as the node returned it.
    pub result: Result<String, RunError>,
    /// Guest stdout and stderr (bounded).
    pub stdout: String,
    pub stderr: String,
    /// The node's `log` calls (bounded).
    pub logs: Vec<LogRecord>,
    pub elapsed: Duration,
}

/// Store state for one run: WASI, the resource table and our capability ctx side
/// by side, each host impl borrowing only its slice.
pub struct NodeState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    capability: CapabilityCtx,
}

impl WasiView for NodeState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Caps the run's linear memory, summed over every memory of the component, and
/// remembers that it did, so the trap can name the limit. Wasmtime asks before
/// creating a memory (from 0) and before each growth, so `total` is exact.
struct MemoryLimiter {
    max_memory: u64,
    /// Bytes of linear memory the run holds now.
    total: u64,
    /// The last approved growth, taken back if wasmtime then fails to grow.
    last_growth: u64,
    hit: bool,
}

impl MemoryLimiter {
    fn new(max_memory: u64) -> Self {
        MemoryLimiter {
            max_memory,
            total: 0,
            last_growth: 0,
            hit: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("memory limit exceeded")]
struct MemoryLimitHit;

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let growth = (desired as u64).saturating_sub(current as u64);
        let total = self.total.saturating_add(growth);
        if total > self.max_memory {
            self.hit = true;
            return Err(MemoryLimitHit.into());
        }
        self.total = total;
        self.last_growth = growth;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.total -= std::mem::take(&mut self.last_growth);
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

#[derive(Debug, thiserror::Error)]
enum Interrupt {
    #[error("deadline reached")]
    Deadline,
    #[error("cancelled")]
    Cancelled,
}

/// Counters that tests and status pages read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RuntimeStats {
    pub cache: CacheStats,
    /// Components compiled from source (cache misses and cacheless loads).
    pub compiles: u64,
    pub runs: u64,
    /// Runs waiting for a slot (`max_concurrent_runs` are executing).
    pub queued: u64,
    /// Runs executing now.
    pub running: u64,
}

/// Loads and runs nodes. Cheap to share behind an `Arc`; every run gets a fresh
/// instance in its own store.
pub struct Runtime {
    engine: Engine,
    linker: Linker<NodeState>,
    cache: Option<ComponentCache>,
    backend: Arc<dyn CapabilityBackend>,
    limits: Limits,
    /// One permit per run allowed to execute at once; runs past it queue here
    /// rather than fail on a full instance pool.
    run_slots: Arc<tokio::sync::Semaphore>,
    max_input: usize,
    max_output: usize,
    compiles: AtomicU64,
    runs: AtomicU64,
    queued: AtomicU64,
    running: AtomicU64,
    /// Whether slots are reset with `PAGEMAP_SCAN` (see [`SlotReset`]).
    pagemap_scan: bool,
    _ticker: EpochTicker,
}

impl Runtime {
    /// Builds the engine, the linker and the epoch ticker.
    ///
    /// # Errors
    /// [`LoadError::Engine`] when wasmtime rejects the configuration, e.g. when
    /// the pooling allocator cannot reserve its memory.
    pub fn new(
        config: RuntimeConfig,
        backend: Arc<dyn CapabilityBackend>,
    ) -> Result<Self, LoadError> {
        let ceiling = config
            .memory_ceiling
            .unwrap_or(config.limits.max_memory)
            .max(config.limits.max_memory);
        let mut wasm_config = Config::new();
        wasm_config.epoch_interruption(true);
        let mut max_concurrent_runs = config.max_concurrent_runs.max(1);
        let mut pagemap_scan = false;
        if config.allocator == Allocator::Pooling {
            let instances = config.pool_instances.max(1);
            let mut pool = PoolingAllocationConfig::default();
            pool.total_component_instances(instances)
                .total_core_instances(instances.saturating_mul(8))
                .total_memories(instances.saturating_mul(2))
                .total_tables(instances.saturating_mul(2))
                .total_stacks(instances)
                .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
                .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
                .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
                .max_memory_size(usize::try_from(ceiling).unwrap_or(usize::MAX));
            if config.reset.pagemap_scan && PoolingAllocationConfig::is_pagemap_scan_available() {
                let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
                pool.pagemap_scan(wasmtime::Enabled::Yes)
                    .linear_memory_keep_resident(size(config.reset.keep_resident))
                    .table_keep_resident(size(config.reset.table_keep_resident))
                    .async_stack_keep_resident(size(config.reset.stack_keep_resident));
                pagemap_scan = true;
            }
            wasm_config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
            // More runs at once than component slots could only fail.
            max_concurrent_runs = max_concurrent_runs.min(instances as usize);
        }
        let engine = Engine::new(&wasm_config).map_err(|e| LoadError::Engine(format!("{e:#}")))?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        crate::bindings::wf::node::capability::add_to_linker::<_, HasSelf<CapabilityCtx>>(
            &mut linker,
            |state: &mut NodeState| &mut state.capability,
        )
        .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        crate::bindings::wf::node::durable::add_to_linker::<_, HasSelf<CapabilityCtx>>(
            &mut linker,
            |state: &mut NodeState| &mut state.capability,
        )
        .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        // Nodes built against 0.1.0 run unchanged.
        crate::bindings::v0_1_0::wf::node::capability::add_to_linker::<_, HasSelf<CapabilityCtx>>(
            &mut linker,
            |state: &mut NodeState| &mut state.capability,
        )
        .map_err(|e| LoadError::Engine(format!("{e:#}")))?;

        let cache = config
            .cache_dir
            .and_then(|dir| match ComponentCache::open(dir, &engine) {
                Ok(cache) => Some(cache),
                Err(e) => {
                    tracing::warn!("{e}; running without the precompile cache");
                    None
                }
            });
        let ticker = EpochTicker::start(engine.clone());
        Ok(Runtime {
            engine,
            linker,
            cache,
            backend,
            limits: config.limits,
            run_slots: Arc::new(tokio::sync::Semaphore::new(max_concurrent_runs)),
            max_input: config.max_input,
            max_output: config.max_output,
            compiles: AtomicU64::new(0),
            runs: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            running: AtomicU64::new(0),
            pagemap_scan,
            _ticker: ticker,
        })
    }

    /// Whether the pooling allocator resets slots with `PAGEMAP_SCAN`,
    /// keeping memory resident between runs.
    pub fn pagemap_scan(&self) -> bool {
        self.pagemap_scan
    }

    /// Where the nodes' capability calls go.
    pub fn backend(&self) -> &Arc<dyn CapabilityBackend> {
        &self.backend
    }

    /// The runtime's default limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The precompile cache, if enabled.
    pub fn cache(&self) -> Option<&ComponentCache> {
        self.cache.as_ref()
    }

    pub fn stats(&self) -> RuntimeStats {
        RuntimeStats {
            cache: self
                .cache
                .as_ref()
                .map(|c| c.counters.snapshot())
                .unwrap_or_default(),
            compiles: self.compiles.load(Ordering::Relaxed),
            runs: self.runs.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            running: self.running.load(Ordering::Relaxed),
        }
    }

    /// Loads the component at `path`.
    ///
    /// # Errors
    /// A [`LoadError`] naming the file and what is wrong with it.
    pub fn load(&self, path: &Path) -> Result<Node, LoadError> {
        let bytes = read_component(path)?;
        let display = path.display().to_string();
        self.load_bytes_as(&node_name(path), &display, &bytes)
    }

    /// Loads a component from memory. `name` names the node in logs and errors.
    ///
    /// # Errors
    /// As [`Runtime::load`].
    pub fn load_bytes(&self, name: &str, bytes: &[u8]) -> Result<Node, LoadError> {
        self.load_bytes_as(name, name, bytes)
    }

    fn load_bytes_as(&self, name: &str, display: &str, bytes: &[u8]) -> Result<Node, LoadError> {
        let display = display.to_owned();
        // Text (WAT) is accepted too; it is what tests and quick experiments use.
        let is_text = !bytes.starts_with(b"\0asm");
        if !is_text && wasmparser::Parser::is_core_wasm(bytes) {
            return Err(LoadError::CoreModule { name: display });
        }
        if !is_text && !wasmparser::Parser::is_component(bytes) {
            return Err(LoadError::NotWasm { name: display });
        }
        if is_text && std::str::from_utf8(bytes).map_or(true, |t| !t.trim_start().starts_with('('))
        {
            return Err(LoadError::NotWasm { name: display });
        }
        let compile = || -> wasmtime::Result<Component> {
            match &self.cache {
                Some(cache) if !is_text => {
                    let before = cache.counters.misses.load(Ordering::Relaxed);
                    let component = cache.load_or_compile(&self.engine, bytes)?;
                    if cache.counters.misses.load(Ordering::Relaxed) != before {
                        self.compiles.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(component)
                }
                _ => {
                    self.compiles.fetch_add(1, Ordering::Relaxed);
                    Component::new(&self.engine, bytes)
                }
            }
        };
        let component = compile().map_err(|e| {
            let detail = format!("{e:#}");
            if is_text && detail.contains("expected `(`") {
                LoadError::NotWasm {
                    name: display.clone(),
                }
            } else {
                LoadError::Invalid {
                    name: display.clone(),
                    detail,
                }
            }
        })?;
        check_world(&self.engine, &component).map_err(|detail| LoadError::WrongWorld {
            name: display.clone(),
            detail,
        })?;
        let instance_pre =
            self.linker
                .instantiate_pre(&component)
                .map_err(|e| LoadError::WrongWorld {
                    name: display.clone(),
                    detail: describe_link_error(&e),
                })?;
        let pre = NodePre::new(instance_pre).map_err(|e| LoadError::WrongWorld {
            name: display.clone(),
            detail: format!("{e:#}"),
        })?;
        let durable = component
            .component_type()
            .imports(&self.engine)
            .any(|(name, _)| name == DURABLE_INTERFACE);
        Ok(Node {
            name: name.into(),
            pre,
            durable,
        })
    }

    /// Runs `node` once on `input` (JSON text) in a fresh instance.
    ///
    /// At most `max_concurrent_runs` runs execute at once; a run past that waits
    /// for a slot, and the wait counts against its deadline and can be cancelled.
    ///
    /// Never panics or poisons the runtime: every failure, including traps,
    /// timeouts and the memory cap, is reported in [`RunReport::result`], and
    /// the next run starts clean.
    pub async fn run(&self, node: &Node, input: &str, opts: RunOptions) -> RunReport {
        let started = Instant::now();
        self.runs.fetch_add(1, Ordering::Relaxed);
        let run_id = if opts.run_id.is_empty() {
            next_run_id()
        } else {
            opts.run_id.clone()
        };
        let limits = opts.limits.unwrap_or(self.limits);
        let deadline = started + limits.timeout;
        let stdout = CapturedOutput::new(CAPTURE_CAP);
        let stderr = CapturedOutput::new(CAPTURE_CAP);
        let logs = Arc::new(std::sync::Mutex::new(LogBuffer::default()));

        let span = tracing::info_span!("run", run = %run_id, node = %node.name);

        let result = {
            use tracing::Instrument;
            let capability = CapabilityCtx {
                backend: self.backend.clone(),
                grants: opts.grants.clone(),
                run_id: run_id.as_str().into(),
                node: node.name.clone(),
                logs: logs.clone(),
                journal: opts.journal.clone(),
                calls: Default::default(),
                span: opts.span.clone(),
            };
            let run = RunContext {
                limits,
                deadline,
                cancel: &opts.cancel,
                stdout: &stdout,
                stderr: &stderr,
            };
            self.run_inner(node, input, run, capability)
                .instrument(span.clone())
                .await
        };

        let (stdout, stderr) = (stdout.contents(), stderr.contents());
        for (stream, text) in [("stdout", &stdout), ("stderr", &stderr)] {
            for line in text.lines() {
                tracing::info!(target: "wf_host::guest", parent: &span, stream, "{line}");
            }
        }
        match &result {
            Ok(_) => tracing::debug!(parent: &span, elapsed = ?started.elapsed(), "run succeeded"),
            Err(e) => {
                tracing::info!(parent: &span, elapsed = ?started.elapsed(), "run failed: {e}")
            }
        }
        let logs = std::mem::take(&mut *logs.lock().unwrap_or_else(|e| e.into_inner()));
        RunReport {
            run_id,
            result,
            stdout,
            stderr,
            logs: logs.into_records(),
            elapsed: started.elapsed(),
        }
    }

    async fn run_inner(
        &self,
        node: &Node,
        input: &str,
        run: RunContext<'_>,
        capability: CapabilityCtx,
    ) -> Result<String, RunError> {
        let RunContext {
            limits,
            deadline,
            cancel,
            stdout,
            stderr,
        } = run;
        if input.len() > self.max_input {
            return Err(RunError::InvalidInput(format!(
                "is {} bytes; the limit is {} bytes (`[runtime] max_input`)",
                input.len(),
                self.max_input
            )));
        }
        check_json(input).map_err(|e| RunError::InvalidInput(format!("is not valid JSON: {e}")))?;

        // Wait for a run slot; time in the queue is time of the run. The
        // slot is asked first (`biased`): a run that gets one at once arms
        // no timer.
        let slot = {
            let _queued = Gauge::raise(&self.queued);
            tokio::select! {
                biased;
                permit = self.run_slots.clone().acquire_owned() => permit.expect("the run semaphore is never closed"),
                _ = tokio::time::sleep_until(deadline.into()) => return Err(RunError::Timeout(limits.timeout)),
                _ = cancel.cancelled() => return Err(RunError::Cancelled),
            }
        };
        let _running = Gauge::raise(&self.running);

        // Nothing is granted: no preopened dirs, no env, no args, empty stdin, no
        // sockets or name lookups. Only stdout/stderr, captured.
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false);
        // A durable node reads its clocks and randomness through its
        // journal, so that it runs the same way again.
        if node.durable
            && let Some(tape) = capability.journal.as_ref().and_then(|j| j.tape())
        {
            tape::taped(&mut wasi, tape);
        }
        let wasi = wasi.build();
        let state = NodeState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(limits.max_memory),
            capability,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);

        let guest_cancel = cancel.clone();
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if guest_cancel.is_cancelled() {
                return Err(Interrupt::Cancelled.into());
            }
            if Instant::now() >= deadline {
                return Err(Interrupt::Deadline.into());
            }
            // Yield so a run never holds an executor thread for long.
            Ok(UpdateDeadline::Yield(1))
        });

        // Whether the run ever waited (on a host call, say): see `retire`.
        let mut waited = false;
        let outcome = {
            let call = async {
                let instance = node.pre.instantiate_async(&mut store).await?;
                instance.call_run(&mut store, input).await
            };
            let mut call = std::pin::pin!(call);
            let call = std::future::poll_fn(|cx| {
                let poll = call.as_mut().poll(cx);
                waited |= poll.is_pending();
                poll
            });
            // The epoch callback interrupts guest code; this select covers
            // time spent awaiting host calls (an upstream MCP request), which
            // no epoch can reach. The run is polled first (`biased`), so the
            // deadline's timer is armed only when the run waits: one that
            // never awaits a host call arms none (arming one can cost a
            // wake-up of tokio's I/O driver).
            tokio::select! {
                biased;
                outcome = call => outcome,
                _ = tokio::time::sleep_until(deadline.into()) => return Err(RunError::Timeout(limits.timeout)),
                _ = cancel.cancelled() => return Err(RunError::Cancelled),
            }
        };

        let memory_hit = store.data().limiter.hit;
        if waited {
            retire(store, slot);
        } else {
            drop((store, slot));
        }

        match outcome {
            Ok(Ok(output)) => {
                if output.len() > self.max_output {
                    return Err(RunError::OutputTooLarge {
                        size: output.len(),
                        limit: self.max_output,
                    });
                }
                check_json(&output).map_err(RunError::InvalidOutput)?;
                Ok(output)
            }
            Ok(Err(NodeError { code, message })) => Err(RunError::Node {
                code: truncate_utf8(code, NODE_ERROR_CODE_CAP),
                message: truncate_utf8(message, NODE_ERROR_MESSAGE_CAP),
            }),
            Err(trap) => Err(classify_trap(&trap, memory_hit, limits)),
        }
    }
}

/// Drops the store of a finished run that waited (on a host call, say) off
/// the caller's path, so the caller has its answer before the instance is
/// torn down: on a task of the current tokio runtime, which runs when a worker
/// next has a moment. The task holds the run's slot until the instance is
/// gone, so `max_concurrent_runs` still bounds the instances alive.
///
/// After a wait the instance's memory is cold, and tearing it down (the slot's
/// memory reset, the WASI context) took 16 µs here against 4 µs hot, on the
/// path of every answer. A run that never waited is still hot and drops its
/// store at once: a task costs more than that. Outside a tokio runtime the
/// store is dropped here.
fn retire(store: Store<NodeState>, slot: tokio::sync::OwnedSemaphorePermit) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                drop(store);
                drop(slot);
            });
        }
        Err(_) => drop((store, slot)),
    }
}

/// What one run is held to, and where its stdio goes.
struct RunContext<'a> {
    limits: Limits,
    deadline: Instant,
    cancel: &'a CancellationToken,
    stdout: &'a CapturedOutput,
    stderr: &'a CapturedOutput,
}

/// Counts something while alive: raised on creation, lowered on drop, so a
/// cancelled or failed run never leaves a count behind.
struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    fn raise(counter: &'a AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Gauge(counter)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The bytes of the component file at `path`.
///
/// # Errors
/// [`LoadError::NotFound`] or [`LoadError::Read`], naming the file.
pub fn read_component(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => LoadError::NotFound {
            path: path.to_owned(),
        },
        _ => LoadError::Read {
            path: path.to_owned(),
            source,
        },
    })
}

/// A node's name: its component file's stem.
pub fn node_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

fn classify_trap(trap: &wasmtime::Error, memory_hit: bool, limits: Limits) -> RunError {
    if memory_hit || trap.downcast_ref::<MemoryLimitHit>().is_some() {
        return RunError::MemoryLimit(limits.max_memory);
    }
    if let Some(full) = trap
        .chain()
        .find_map(|e| e.downcast_ref::<wasmtime::PoolConcurrencyLimitError>())
    {
        return RunError::Busy(full.to_string());
    }
    match trap.downcast_ref::<Interrupt>() {
        Some(Interrupt::Deadline) => RunError::Timeout(limits.timeout),
        Some(Interrupt::Cancelled) => RunError::Cancelled,
        None => RunError::Trap(format!("{trap:#}")),
    }
}

/// Every import must be WASI or our own `capability` interface, and `run` must be
/// exported; say exactly which one is off.
fn check_world(engine: &Engine, component: &Component) -> Result<(), String> {
    let ty = component.component_type();
    for (name, _) in ty.imports(engine) {
        if name.starts_with("wasi:") || CAPABILITY_INTERFACES.contains(&name) {
            continue;
        }
        if name.starts_with("wf:node/") {
            return Err(format!(
                "it imports `{name}`, but this host provides `wf:node/capability@0.2.0`, `wf:node/durable@0.2.0` and `wf:node/capability@0.1.0`; rebuild it against this host's `wit/`"
            ));
        }
        return Err(format!(
            "it imports `{name}`, which wf-host does not provide; a node may import only `wf:node/capability@0.2.0`, `wf:node/durable@0.2.0` (or `wf:node/capability@0.1.0`) and WASI"
        ));
    }
    if component.get_export_index(None, "run").is_none() {
        return Err("it has no export `run`; a node exports `run: func(input: string) -> result<string, node-error>`".into());
    }
    Ok(())
}

fn describe_link_error(e: &wasmtime::Error) -> String {
    format!("{e:#}")
}

fn check_json(text: &str) -> Result<(), String> {
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn next_run_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("run-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Advances the engine's epoch on a dedicated thread; stops and is joined on drop.
struct EpochTicker {
    // Dropping the sender wakes the thread at once; no need to wait a tick.
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine) -> Self {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("wf-epoch".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(EPOCH_TICK) {
                    engine.increment_epoch();
                }
            })
            .expect("spawning the epoch thread");
        EpochTicker {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
