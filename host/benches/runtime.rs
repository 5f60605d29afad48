//! Instantiate + `run` of the `echo` node: the pooling allocator keeping
//! memory resident (`PAGEMAP_SCAN`, the default where the kernel has it), the
//! pooling allocator handing out freshly decommitted memory, and on-demand.
//!
//! `cargo bench -p wf-host --bench runtime` prints median and p99 per mode and
//! their ratio, measured side by side in one process.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); runtimes.len()];
    rt.block_on(async {
        for (_, runtime, node) in &runtimes {
            for _ in 0..WARMUP {
                runtime
                    .run(node, "{\"k\":1}", RunOptions::default())
                    .await
                    .result
                    .unwrap();
            }
        }
        // Interleave rounds so drift on a noisy machine hits both modes alike.
        for _ in 0..ROUNDS {
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
        "  ratio pool-fresh / pooling (median): {:.2}x",
        medians[1].as_secs_f64() / medians[0].as_secs_f64()
    );
    println!(
        "  ratio on-demand / pooling (median): {:.2}x",
        medians[2].as_secs_f64() / medians[0].as_secs_f64()
    );
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
