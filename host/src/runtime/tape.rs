//! A durable node's clocks and randomness, read through its journal's
//! [`Tape`]: the wall and monotonic clocks read as the run before read them
//! (then live), and both random generators derived from one seed the
//! journal keeps. Only durable nodes get them; others read the host's.
//!
//! The random numbers are a ChaCha stream from a 32-byte seed drawn from
//! the OS once per node run: as unpredictable as the host's own, and
//! reproducible by whoever can read the run's journal.

use std::sync::Arc;
use std::time::Duration;

use rand_wasi::{Rng, RngExt, SeedableRng, rngs::StdRng};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtxBuilder};

use crate::capability::Tape;

struct Wall(Arc<dyn Tape>);

impl HostWallClock for Wall {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        let live = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.0.wall(live)
    }
}

struct Monotonic {
    tape: Arc<dyn Tape>,
    start: std::time::Instant,
}

impl HostMonotonicClock for Monotonic {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        let live = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.tape.monotonic(live)
    }
}

/// Gives `builder` the clocks and generators of `tape`.
pub(super) fn taped(builder: &mut WasiCtxBuilder, tape: Arc<dyn Tape>) {
    let mut live = [0u8; 32];
    rand_wasi::rng().fill_bytes(&mut live);
    let mut base = StdRng::from_seed(tape.seed(live));
    let secure = StdRng::from_rng(&mut base);
    let insecure = StdRng::from_rng(&mut base);
    let insecure_seed: u128 = base.random();
    builder
        .wall_clock(Wall(tape.clone()))
        .monotonic_clock(Monotonic {
            tape,
            start: std::time::Instant::now(),
        })
        .secure_random(secure)
        .insecure_random(insecure)
        .insecure_random_seed(insecure_seed);
}
