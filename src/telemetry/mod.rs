//! Telemetry: the `Event`/`Command` types shared by engine, UI, recorder and replay; PMU counters;
//! the machine profile; trace recording, replay and Chrome-trace export.

pub mod event;

pub use event::*;
