//! A phase of a token timed on the engine thread: [`Probe::start`] when it begins,
//! [`Probe::ns`] when it ends, so that the decode loop reads as its stages and not as timer
//! arithmetic. Timing is off with `--no-timings` (`EngineOptions::timings`); the phase's counters
//! are attributed separately, by `Pmu::phase`.

use std::time::Instant;

/// A started phase (or nothing, when timings are off).
#[derive(Clone, Copy, Debug)]
pub(super) struct Probe(Option<Instant>);

impl Probe {
    /// Starts timing a phase when `timings` is on.
    pub(super) fn start(timings: bool) -> Probe {
        Probe(timings.then(Instant::now))
    }

    /// Nanoseconds since the start; `None` when timings are off.
    pub(super) fn ns(&self) -> Option<u64> {
        self.0.map(|t| t.elapsed().as_nanos() as u64)
    }
}
