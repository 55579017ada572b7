//! Telemetry: the `Event`/`Command` types shared by engine, UI, recorder and replay; PMU counters;
//! the machine profile and its memory-bandwidth probe; trace recording, replay and Chrome-trace
//! export and CSV tables; the controlled A/B statistics over recorded tokens; the staged-I/O overlap model.

pub mod ab;
pub mod chrome;
pub mod contention;
pub mod csv;
pub mod event;
pub mod machine;
pub mod membw;
pub mod overlap_model;
pub mod player;
pub mod pmu;
pub mod recorder;
pub mod replay;

pub use event::*;
