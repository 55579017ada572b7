//! Export a replayed trace as Chrome Trace Event JSON (open in Perfetto or chrome://tracing).
//!
//! Layout (all times in µs with ns precision, `pid` 1), one track (tid) per thread, each named
//! by a `thread_name` metadata event. Slice names never carry a token index (it is in args), so
//! Perfetto's slice aggregation groups them.
//! * tid 1 "engine thread": per token a `token` span (index in args) containing per-layer
//!   `L{l}` spans (the layer index names them: per-layer aggregation), each holding
//!   `attention`, `dense`, `router`, `experts` spans (zero-length phases omitted), then
//!   `lm_head`. **Placement:** the Stats event's `t_ns` is taken as the token's end and the
//!   phases are laid *back* from it: the token starts at `t_ns − max(ns_total, Σ phases)` and its
//!   phases run forward from there in layer order. If that start would precede the previous
//!   token's end (clock skew, or phases summing to more than the gap between Stats events), the
//!   token is shifted to start at the previous end, so spans on one tid always nest.
//!   Prefill is a `prefill` span ending at the Prefill event's `t_ns` (same clamping).
//! * tid 2 "expert reads": one `expert read` span per layer with
//!   [`LayerIo`](super::event::LayerIo) (layer in args), starting when that layer's router phase
//!   ends (the reads are submitted then) and lasting `io_ns`, the readers' busy time (serialized
//!   if they would overlap: placement is inferred, durations are measured).
//! * tid 3 "disk wait": `disk wait` spans of `wait_ns` at the start of that layer's experts phase
//!   (the engine thread blocked on expert reads).
//! * tid 4 "prefetch thread": a `prefetch hints` instant per token with
//!   [`PrefetchStat`](super::event::PrefetchStat) in args (the trace records the prefetch thread's
//!   commands and hits, not its timing).
//! * tid 100 + i "pool thread i" (i = 0: the engine thread's own share of the pool's tasks) for
//!   each thread in [`TokenStats::pool_threads`]: a `pool tasks` span per token, starting with
//!   the token and lasting that thread's measured busy time (clamped to the token), with
//!   `busy_ns`, `tasks` and `busy_share` (of the token's time) in args. Traces without
//!   `pool_threads` (older ones, or recorded without timings) have no pool tracks.
//! * Counters (`ph:"C"`) at each token end: `MiB/token` by stream, `pmu software`, and
//!   `pmu <phase>` per phase with hardware or software values.
//! * Instant events (`ph:"i"`, thread scope) at token ends named `token` with index/id/text args;
//!   global instants for config changes, resets and Done.
//! * Metadata (`ph:"M"`) naming the process and threads (a pool thread's name when it first
//!   appears).

use super::event::{Event, Stamped, TokenStats};
use super::replay::Replay;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;

const PID: u32 = 1;
/// Thread ids used in the export.
pub const TID_COMPUTE: u32 = 1;
pub const TID_IO: u32 = 2;
pub const TID_WAIT: u32 = 3;
pub const TID_PREFETCH: u32 = 4;
/// Pool thread `i` is tid `TID_POOL + i`.
pub const TID_POOL: u32 = 100;

fn us(ns: u64) -> f64 {
    // Exact to the ns in decimal: ts/dur print as at most 3 fractional digits.
    ns as f64 / 1000.0
}

fn span(name: &str, cat: &str, tid: u32, start_ns: u64, dur_ns: u64, args: Value) -> Value {
    json!({"name": name, "cat": cat, "ph": "X", "pid": PID, "tid": tid,
           "ts": us(start_ns), "dur": us(dur_ns), "args": args})
}

struct Builder {
    out: Vec<Value>,
    compute_end: u64,
    io_end: u64,
    wait_end: u64,
    /// Pool threads whose track was named so far.
    pool_named: usize,
}

impl Builder {
    fn token(&mut self, t_end: u64, st: &TokenStats, text: Option<&(u32, String)>) {
        let phases_sum: u64 = st
            .layers
            .iter()
            .map(|l| l.ns_attn + l.ns_dense + l.ns_router + l.ns_experts)
            .sum::<u64>()
            + st.ns_lm_head;
        let dur = st.ns_total.max(phases_sum);
        let start = t_end.saturating_sub(dur).max(self.compute_end);
        // One name for every token (its index is in args), so that Perfetto's slice
        // aggregation groups them.
        let name = "token";
        let mut args = json!({"index": st.index, "pos": st.pos, "ns_total": st.ns_total});
        if let Some((id, t)) = text {
            args["id"] = json!(id);
            args["text"] = json!(t);
        }
        self.out
            .push(span(name, "token", TID_COMPUTE, start, dur, args.clone()));
        let mut t = start;
        for (l, layer) in st.layers.iter().enumerate() {
            let ldur = layer.ns_attn + layer.ns_dense + layer.ns_router + layer.ns_experts;
            if ldur > 0 {
                self.out.push(span(
                    &format!("L{l}"),
                    "layer",
                    TID_COMPUTE,
                    t,
                    ldur,
                    json!({"attn_bytes": layer.bytes.attn, "dense_bytes": layer.bytes.dense,
                           "expert_bytes": layer.bytes.experts}),
                ));
            }
            let mut router_end = t;
            let mut experts_start = t;
            for (pname, ns) in [
                ("attention", layer.ns_attn),
                ("dense", layer.ns_dense),
                ("router", layer.ns_router),
                ("experts", layer.ns_experts),
            ] {
                if pname == "experts" {
                    experts_start = t;
                }
                if ns > 0 {
                    let a = if pname == "router" && !layer.routing.is_empty() {
                        json!({"layer": l, "routing": layer.routing})
                    } else {
                        json!({"layer": l})
                    };
                    self.out.push(span(pname, "phase", TID_COMPUTE, t, ns, a));
                    t += ns;
                }
                if pname == "router" {
                    router_end = t;
                }
            }
            if let Some(io) = &layer.io {
                if io.io_ns > 0 {
                    let s = router_end.max(self.io_end);
                    self.out.push(span(
                        "expert read",
                        "io",
                        TID_IO,
                        s,
                        io.io_ns,
                        json!({"layer": l, "bytes": io.bytes, "compute_ns": io.compute_ns,
                               "wait_ns": io.wait_ns}),
                    ));
                    self.io_end = s + io.io_ns;
                }
                if io.wait_ns > 0 {
                    let s = experts_start.max(self.wait_end);
                    self.out.push(span(
                        "disk wait",
                        "io",
                        TID_WAIT,
                        s,
                        io.wait_ns,
                        json!({"layer": l}),
                    ));
                    self.wait_end = s + io.wait_ns;
                }
            }
        }
        if st.ns_lm_head > 0 {
            self.out.push(span(
                "lm_head",
                "phase",
                TID_COMPUTE,
                t,
                st.ns_lm_head,
                json!({"lm_head_bytes": st.lm_head_bytes}),
            ));
        }
        let end = start + dur;
        self.compute_end = end;
        self.pool_threads(start, dur, st);
        if let Some(p) = &st.prefetch {
            self.out.push(
                json!({"name": "prefetch hints", "ph": "i", "s": "t", "pid": PID,
                "tid": TID_PREFETCH, "ts": us(start), "args": {"index": st.index,
                "sent": p.sent, "dropped": p.dropped, "predicted": p.predicted, "hits": p.hits,
                "wasted_bytes": p.wasted_bytes}}),
            );
        }

        // Token boundary and counters at the token end.
        self.out
            .push(json!({"name": name, "ph": "i", "s": "t", "pid": PID,
            "tid": TID_COMPUTE, "ts": us(end), "args": args}));
        use crate::util::MIB;
        let (mut a, mut d, mut e) = (0u64, 0u64, 0u64);
        for l in &st.layers {
            a += l.bytes.attn;
            d += l.bytes.dense;
            e += l.bytes.experts;
        }
        self.counter(
            "MiB/token",
            end,
            json!({"attn": a as f64 / MIB, "dense": d as f64 / MIB,
                   "experts": e as f64 / MIB, "lm_head": st.lm_head_bytes as f64 / MIB}),
        );
        if let Some(p) = &st.pmu {
            if !p.software.is_empty() {
                let m: serde_json::Map<String, Value> = p
                    .software
                    .iter()
                    .map(|(k, v)| (k.clone(), json!(v)))
                    .collect();
                self.counter("pmu software", end, Value::Object(m));
            }
            for (ph, vals) in &p.phases {
                let m: serde_json::Map<String, Value> =
                    vals.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                self.counter(&format!("pmu {ph}"), end, Value::Object(m));
            }
        }
    }

    /// One `pool tasks` span per pool thread of the token (see the module doc).
    fn pool_threads(&mut self, start: u64, dur: u64, st: &TokenStats) {
        for (i, p) in st.pool_threads().iter().enumerate() {
            let tid = TID_POOL.saturating_add(i.min(u32::MAX as usize) as u32);
            if i >= self.pool_named {
                let name = if i == 0 {
                    "pool thread 0 (engine)".to_string()
                } else {
                    format!("pool thread {i}")
                };
                self.out.push(meta("thread_name", Some(tid), &name));
                self.out
                    .push(json!({"name": "thread_sort_index", "ph": "M", "pid": PID,
                    "tid": tid, "args": {"sort_index": tid}}));
                self.pool_named = i + 1;
            }
            if p.tasks == 0 && p.busy_ns == 0 {
                continue;
            }
            let share = if st.ns_total > 0 {
                p.busy_ns as f64 / st.ns_total as f64
            } else {
                0.0
            };
            self.out.push(span(
                "pool tasks",
                "pool",
                tid,
                start,
                p.busy_ns.min(dur),
                json!({"index": st.index, "busy_ns": p.busy_ns, "tasks": p.tasks,
                       "busy_share": share}),
            ));
        }
    }

    fn counter(&mut self, name: &str, t_ns: u64, args: Value) {
        self.out
            .push(json!({"name": name, "ph": "C", "pid": PID, "ts": us(t_ns), "args": args}));
    }

    fn global_instant(&mut self, name: &str, t_ns: u64, args: Value) {
        self.out
            .push(json!({"name": name, "ph": "i", "s": "g", "pid": PID,
            "tid": TID_COMPUTE, "ts": us(t_ns), "args": args}));
    }
}

fn meta(name: &str, tid: Option<u32>, value: &str) -> Value {
    let mut v = json!({"name": name, "ph": "M", "pid": PID, "args": {"name": value}});
    if let Some(t) = tid {
        v["tid"] = json!(t);
    }
    v
}

/// Build the trace events (without writing). Useful for tests and for embedding.
pub fn chrome_events(r: &Replay) -> Vec<Value> {
    let mut all = Vec::new();
    let _ = for_each_event(r, &mut |v| {
        all.push(v);
        Ok(())
    });
    all
}

/// Hands every trace event to `sink` as it is produced: the spans of one input event are built,
/// passed on and dropped, so memory does not grow with the trace (only the replay itself is
/// held). Stops at the first error of `sink`.
pub fn for_each_event(
    r: &Replay,
    sink: &mut dyn FnMut(Value) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let m = &r.header.model;
    let mut b = Builder {
        out: vec![
            meta(
                "process_name",
                None,
                &format!(
                    "cflow {}{}",
                    m.name,
                    if m.synthetic { " (synthetic)" } else { "" }
                ),
            ),
            meta("thread_name", Some(TID_COMPUTE), "engine thread"),
            meta("thread_name", Some(TID_IO), "expert reads"),
            meta("thread_name", Some(TID_WAIT), "disk wait"),
            meta("thread_name", Some(TID_PREFETCH), "prefetch thread"),
        ],
        compute_end: 0,
        io_end: 0,
        wait_end: 0,
        pool_named: 0,
    };
    // Token text by index, from the Token event preceding its Stats.
    let mut pending: HashMap<u32, (u32, String)> = HashMap::new();
    for Stamped { t_ns, event } in r {
        for v in b.out.drain(..) {
            sink(v)?;
        }
        match event {
            Event::Token { index, id, text } => {
                pending.insert(*index, (*id, text.clone()));
            }
            Event::Stats(st) => {
                let tok = pending.remove(&st.index);
                b.token(*t_ns, st, tok.as_ref());
            }
            Event::Prefill { n_tokens, ns } => {
                let start = t_ns.saturating_sub(*ns).max(b.compute_end);
                b.out.push(span(
                    "prefill",
                    "prefill",
                    TID_COMPUTE,
                    start,
                    *ns,
                    json!({"n_tokens": n_tokens}),
                ));
                b.compute_end = start + ns;
            }
            Event::Config(c) => b.global_instant("config", *t_ns, json!(c)),
            Event::Reset => b.global_instant("reset", *t_ns, json!({})),
            Event::Snapshot { ctx_pos } => {
                b.global_instant("snapshot", *t_ns, json!({ "ctx_pos": ctx_pos }))
            }
            Event::Done {
                reason,
                n_tokens,
                decode_ns,
                ..
            } => b.global_instant(
                "done",
                *t_ns,
                json!({"reason": reason, "n_tokens": n_tokens, "decode_ns": decode_ns}),
            ),
            Event::Error { message, fatal } => {
                b.global_instant("error", *t_ns, json!({"message": message, "fatal": fatal}))
            }
            Event::Settings(g) => b.global_instant("settings", *t_ns, json!(g)),
            Event::Session { .. }
            | Event::Prompt { .. }
            | Event::Notice { .. }
            | Event::History { .. } => {}
        }
    }
    for v in b.out.drain(..) {
        sink(v)?;
    }
    Ok(())
}

/// Write the Chrome Trace Event JSON object (`{"traceEvents": [...], ...}`) to `out`.
/// Streamed: each event is written as it is built ([`for_each_event`]), never the whole array
/// in memory (it took ~75× the trace's size).
pub fn export_chrome(r: &Replay, out: &mut impl Write) -> std::io::Result<()> {
    out.write_all(b"{\"traceEvents\":[")?;
    let mut first = true;
    for_each_event(r, &mut |v| {
        if !first {
            out.write_all(b",")?;
        }
        first = false;
        serde_json::to_writer(&mut *out, &v).map_err(std::io::Error::other)
    })?;
    let other = json!({
        "format": "cflow-trace chrome export",
        "trace_version": r.header.version,
        "created": r.header.created,
        "model": r.header.model.name,
    });
    out.write_all(b"],\"displayTimeUnit\":\"ms\",\"otherData\":")?;
    serde_json::to_writer(&mut *out, &other).map_err(std::io::Error::other)?;
    out.write_all(b"}\n")?;
    out.flush()
}
