//! Instantiate + `run` of the `echo` node, next to a floor: a minimal async
//! wasmtime host in the same process (the same engine settings and component,
//! an `InstancePre`, a store with only WASI and stub capability imports, one
//! `instantiate_async` + `run` per sample). Then wf-host's modes: the
//! pooling allocator keeping
//! memory resident (`PAGEMAP_SCAN`, the default where the kernel has it), the
//! pooling allocator handing out freshly decommitted memory, and on-demand.
//!
//! `cargo bench -p wf-host --bench runtime` prints median and p99 per mode and
//! their ratio, measured side by side in one process.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, Linker, ResourceTable, Val};
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store,
};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wf_host::capability::NoBackend;
use wf_host::runtime::{Allocator, RunOptions, Runtime, RuntimeConfig, SlotReset};

const WARMUP: usize = 200;
const ROUNDS: usize = 10;
const PER_ROUND: usize = 500;

fn main() {
    let echo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/echo.wasm");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let no_scan = SlotReset {
        pagemap_scan: false,
        ..SlotReset::default()
    };
    let modes = [
        ("pooling", Allocator::Pooling, SlotReset::default()),
        ("pool-fresh", Allocator::Pooling, no_scan),
        ("on-demand", Allocator::OnDemand, SlotReset::default()),
    ];
    let runtimes: Vec<_> = modes
        .iter()
        .map(|(name, allocator, reset)| {
            let runtime = Runtime::new(
                RuntimeConfig {
                    allocator: *allocator,
                    reset: *reset,
                    ..Default::default()
                },
                Arc::new(NoBackend),
            )
            .unwrap();
            let node = runtime.load(&echo).unwrap();
            (*name, runtime, node)
        })
        .collect();

    let floor = FloorHost::new(&std::fs::read(&echo).unwrap());
    let mut floor_samples = Vec::new();
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); runtimes.len()];
    rt.block_on(async {
        for _ in 0..WARMUP {
            assert_eq!(floor.run("{\"k\":1}").await, "{\"k\":1}");
        }
        for (_, runtime, node) in &runtimes {
            for _ in 0..WARMUP {
                runtime
                    .run(node, "{\"k\":1}", RunOptions::default())
                    .await
                    .result
                    .unwrap();
            }
        }
        // Interleave rounds so drift on a noisy machine hits every mode alike.
        for _ in 0..ROUNDS {
            for _ in 0..PER_ROUND {
                let start = Instant::now();
                let out = floor.run("{\"k\":1}").await;
                floor_samples.push(start.elapsed());
                assert_eq!(out, "{\"k\":1}");
            }
            for (i, (_, runtime, node)) in runtimes.iter().enumerate() {
                for _ in 0..PER_ROUND {
                    let start = Instant::now();
                    let report = runtime.run(node, "{\"k\":1}", RunOptions::default()).await;
                    samples[i].push(start.elapsed());
                    report.result.unwrap();
                }
            }
        }
    });

    println!(
        "echo: instantiate + run, {} samples per mode",
        ROUNDS * PER_ROUND
    );
    floor_samples.sort();
    let floor_median = floor_samples[floor_samples.len() / 2];
    println!(
        "  {:<10} median {:>8.1} µs   p99 {:>8.1} µs",
        "floor",
        us(floor_median),
        us(floor_samples[floor_samples.len() * 99 / 100])
    );
    let mut medians = Vec::new();
    for ((name, _, _), s) in runtimes.iter().zip(&mut samples) {
        s.sort();
        let median = s[s.len() / 2];
        let p99 = s[s.len() * 99 / 100];
        medians.push(median);
        println!(
            "  {name:<10} median {:>8.1} µs   p99 {:>8.1} µs",
            us(median),
            us(p99)
        );
    }
    println!(
        "  pooling resets slots with PAGEMAP_SCAN: {}",
        runtimes[0].1.pagemap_scan()
    );
    println!(
        "  ratio pooling / floor (median): {:.2}x",
        medians[0].as_secs_f64() / floor_median.as_secs_f64()
    );
    println!(
        "  ratio pool-fresh / pooling (median): {:.2}x",
        medians[1].as_secs_f64() / medians[0].as_secs_f64()
    );
    println!(
        "  ratio on-demand / pooling (median): {:.2}x",
        medians[2].as_secs_f64() / medians[0].as_secs_f64()
    );
}

/// The floor's store: WASI and nothing else.
struct Floor {
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for Floor {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A minimal async host for `component`: wf-host's engine settings, WASI, and
/// capability imports that do nothing (echo only logs).
struct FloorHost {
    engine: Engine,
    pre: wasmtime::component::InstancePre<Floor>,
}

impl FloorHost {
    fn new(bytes: &[u8]) -> FloorHost {
        let mut config = Config::new();
        config.epoch_interruption(true);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(256)
            .max_memory_size(256 << 20);
        if PoolingAllocationConfig::is_pagemap_scan_available() {
            pool.pagemap_scan(Enabled::Yes)
                .linear_memory_keep_resident(16 << 20)
                .table_keep_resident(64 << 10)
                .async_stack_keep_resident(1 << 20);
        }
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).unwrap();
        let component = Component::new(&engine, bytes).unwrap();
        let mut linker: Linker<Floor> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        // Whichever version the component was built against.
        for (interface, extra) in [
            ("wf:node/capability@0.2.0", Some("call-tools")),
            ("wf:node/capability@0.1.0", None),
        ] {
            let mut capability = linker.instance(interface).unwrap();
            for name in [
                "call-tool",
                "read-resource",
                "get-prompt",
                "list-capabilities",
                "log",
            ]
            .into_iter()
            .chain(extra)
            {
                capability
                    .func_new_async(name, |_, _, _, _| Box::new(async { Ok(()) }))
                    .unwrap();
            }
        }
        let pre = linker.instantiate_pre(&component).unwrap();
        FloorHost { engine, pre }
    }

    async fn run(&self, input: &str) -> String {
        let wasi = wasmtime_wasi::WasiCtxBuilder::new().build();
        let mut store = Store::new(
            &self.engine,
            Floor {
                wasi,
                table: ResourceTable::new(),
            },
        );
        store.set_epoch_deadline(u64::MAX / 2);
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        let run = instance.get_func(&mut store, "run").unwrap();
        let mut results = [Val::Bool(false)];
        run.call_async(&mut store, &[Val::String(input.into())], &mut results)
            .await
            .unwrap();
        match &results[0] {
            Val::Result(Ok(Some(out))) => match &**out {
                Val::String(text) => text.clone(),
                other => panic!("run returned {other:?}"),
            },
            other => panic!("run returned {other:?}"),
        }
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
