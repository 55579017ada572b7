//! CSV tables of a replayed trace for notebooks (`export --csv PREFIX`): per-token stats, the
//! A/B samples and the routing, one RFC 4180 file per table (`PREFIX.tokens.csv`,
//! `PREFIX.ab.csv`, `PREFIX.routing.csv`). The column sets are stable and documented in
//! docs/CSV.md; column names reuse the JSON keys of docs/JSON.md, with their unit as a suffix
//! (`_ms`, `_mib`, `_gb_s`). A missing value (a field older traces do not have) is an empty cell,
//! which pandas reads as NaN.
//!
//! Written by hand rather than with the `csv` crate: the output side of RFC 4180 is one quoting
//! rule ([`field`]), and nothing here reads CSV.

use super::ab::{Setting, BLOCK, WARMUP};
use super::event::{EngineConfigInfo, Event, Stamped, TokenStats};
use super::replay::Replay;
use crate::util::MIB;
use std::collections::HashMap;
use std::io::{self, Write};

/// One CSV table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// One row per measured token (`stats` event).
    Tokens,
    /// One row per A/B sample: a measured token with the full setting it ran with.
    Ab,
    /// One row per (token, routed layer, rank): the experts each layer selected.
    Routing,
}

impl Table {
    pub const ALL: [Table; 3] = [Table::Tokens, Table::Ab, Table::Routing];

    /// The table's name, also the file name's middle part (`PREFIX.NAME.csv`).
    pub fn name(self) -> &'static str {
        match self {
            Table::Tokens => "tokens",
            Table::Ab => "ab",
            Table::Routing => "routing",
        }
    }

    /// The header row, in order (the stable column set; see docs/CSV.md).
    pub fn columns(self) -> &'static [&'static str] {
        match self {
            Table::Tokens => &TOKEN_COLUMNS,
            Table::Ab => &AB_COLUMNS,
            Table::Routing => &ROUTING_COLUMNS,
        }
    }
}

const TOKEN_COLUMNS: [&str; 41] = [
    "prompt",
    "index",
    "pos",
    "id",
    "text",
    "t_ms",
    "total_ms",
    "attention_ms",
    "dense_ms",
    "router_ms",
    "experts_ms",
    "lm_head_ms",
    "io_ms",
    "io_wait_ms",
    "attention_mib",
    "dense_mib",
    "experts_mib",
    "lm_head_mib",
    "total_mib",
    "expert_read_mib",
    "effective_gb_s",
    "pool_threads",
    "pool_busy_ms",
    "prefetch_hints_sent",
    "prefetch_hints_dropped",
    "prefetch_predicted",
    "prefetch_hits",
    "prefetch_wasted_mib",
    "expert_cache_hits",
    "expert_cache_misses",
    "expert_cache_cached_mib",
    "expert_cache_capacity_mib",
    // The setting as run (`TokenStats::ran`; empty in older traces).
    "prefetch",
    "fetch",
    "layout",
    "expert_tier",
    "schedule",
    "threads",
    "weights",
    "act",
    "kv",
];

const AB_COLUMNS: [&str; 18] = [
    "prompt",
    "index",
    "pos",
    "total_ms",
    "key",
    "prefetch",
    "fetch",
    "layout",
    "expert_tier",
    "schedule",
    "threads",
    "weights",
    "act",
    "kv",
    "expert_cache_capacity_mib",
    "ctx_bucket",
    "run",
    "block",
];

const ROUTING_COLUMNS: [&str; 7] = [
    "prompt", "index", "pos", "layer", "rank", "expert", "weight",
];

/// One field, quoted when it holds a comma, a quote, CR or LF (RFC 4180; quotes doubled).
pub fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn row(out: &mut dyn Write, cells: &[String]) -> io::Result<()> {
    let line: Vec<String> = cells.iter().map(|c| field(c)).collect();
    out.write_all(line.join(",").as_bytes())?;
    out.write_all(b"\n")
}

fn ms(ns: u64) -> String {
    num(ns as f64 / 1e6)
}

fn mib(bytes: u64) -> String {
    num(bytes as f64 / MIB)
}

/// A float as the shortest text that reads back to the same value; empty when not finite.
fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        String::new()
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

/// The measured tokens of a trace in order, with what is needed around them: the prompt count
/// so far, the token's id and text (from its `token` event), the `stats` event's time and the
/// configuration in force.
struct Tok<'a, 'b> {
    prompt: Option<u32>,
    t_ns: u64,
    token: Option<&'b (u32, String)>,
    st: &'a TokenStats,
    cfg: Option<&'a EngineConfigInfo>,
}

fn for_each_token<'a>(
    r: &'a Replay,
    mut f: impl FnMut(Tok<'a, '_>) -> io::Result<()>,
) -> io::Result<()> {
    let mut prompts: Option<u32> = None;
    let mut cfg: Option<&EngineConfigInfo> = Some(&r.header.config);
    let mut texts: HashMap<u32, (u32, String)> = HashMap::new();
    for Stamped { t_ns, event } in r {
        match event {
            Event::Session { config, .. } => cfg = Some(config),
            Event::Config(c) => cfg = Some(c),
            Event::Prompt { .. } => {
                prompts = Some(prompts.map_or(0, |p| p + 1));
                texts.clear();
            }
            Event::Token { index, id, text } => {
                texts.insert(*index, (*id, text.clone()));
            }
            Event::Stats(st) => {
                let token = texts.remove(&st.index);
                f(Tok {
                    prompt: prompts,
                    t_ns: *t_ns,
                    token: token.as_ref(),
                    st,
                    cfg,
                })?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Writes `table` of `r` to `out` (header row first); returns the number of data rows.
pub fn write_table(r: &Replay, table: Table, out: &mut dyn Write) -> io::Result<u64> {
    let cols: Vec<String> = table.columns().iter().map(|c| c.to_string()).collect();
    row(out, &cols)?;
    let mut n = 0u64;
    match table {
        Table::Tokens => for_each_token(r, |t| {
            n += 1;
            row(out, &token_row(&t))
        })?,
        Table::Routing => for_each_token(r, |t| {
            for (l, layer) in t.st.layers.iter().enumerate() {
                for (rank, (e, w)) in layer.routing.iter().enumerate() {
                    n += 1;
                    row(
                        out,
                        &[
                            opt(t.prompt),
                            t.st.index.to_string(),
                            t.st.pos.to_string(),
                            l.to_string(),
                            rank.to_string(),
                            e.to_string(),
                            if w.is_finite() {
                                format!("{w}")
                            } else {
                                String::new()
                            },
                        ],
                    )?;
                }
            }
            Ok(())
        })?,
        Table::Ab => {
            for s in ab_samples(r) {
                n += 1;
                row(out, &ab_row(&s))?;
            }
        }
    }
    out.flush()?;
    Ok(n)
}

fn token_row(t: &Tok) -> Vec<String> {
    let st = t.st;
    let sum = |f: &dyn Fn(&super::event::LayerStat) -> u64| st.layers.iter().map(f).sum::<u64>();
    let (a, d, e) = (
        sum(&|l| l.bytes.attn),
        sum(&|l| l.bytes.dense),
        sum(&|l| l.bytes.experts),
    );
    let has_io = st.layers.iter().any(|l| l.io.is_some());
    let io = |f: &dyn Fn(&super::event::LayerIo) -> u64| {
        has_io.then(|| {
            st.layers
                .iter()
                .filter_map(|l| l.io.as_ref())
                .map(f)
                .sum::<u64>()
        })
    };
    let total = a + d + e + st.lm_head_bytes;
    let gb_s = (st.ns_total > 0).then(|| total as f64 / st.ns_total as f64);
    let pool = (!st.pool_threads().is_empty())
        .then(|| st.pool_threads().iter().map(|p| p.busy_ns).sum::<u64>());
    let pf = st.prefetch.as_ref();
    let ec = st.expert_cache.as_ref();
    let ran = st.ran.as_ref();
    let mut v = vec![
        opt(t.prompt),
        st.index.to_string(),
        st.pos.to_string(),
        opt(t.token.map(|x| x.0)),
        t.token.map(|x| x.1.clone()).unwrap_or_default(),
        ms(t.t_ns),
        ms(st.ns_total),
        ms(sum(&|l| l.ns_attn)),
        ms(sum(&|l| l.ns_dense)),
        ms(sum(&|l| l.ns_router)),
        ms(sum(&|l| l.ns_experts)),
        ms(st.ns_lm_head),
        io(&|x| x.io_ns).map(ms).unwrap_or_default(),
        io(&|x| x.wait_ns).map(ms).unwrap_or_default(),
        mib(a),
        mib(d),
        mib(e),
        mib(st.lm_head_bytes),
        mib(total),
        io(&|x| x.bytes).map(mib).unwrap_or_default(),
        gb_s.map(num).unwrap_or_default(),
        opt((!st.pool_threads().is_empty()).then_some(st.pool_threads().len())),
        pool.map(ms).unwrap_or_default(),
        opt(pf.map(|p| p.sent)),
        opt(pf.map(|p| p.dropped)),
        opt(pf.map(|p| p.predicted)),
        opt(pf.map(|p| p.hits)),
        pf.map(|p| mib(p.wasted_bytes)).unwrap_or_default(),
        opt(ec.map(|c| c.hits)),
        opt(ec.map(|c| c.misses)),
        ec.map(|c| mib(c.cached_bytes)).unwrap_or_default(),
        ec.map(|c| mib(c.capacity_bytes))
            .or_else(|| ran.map(|r| r.expert_cache_mib.to_string()))
            .unwrap_or_default(),
    ];
    // Setting as run; capacity from the cache stat when present, else the report.
    v.extend([
        opt(ran.map(|r| r.prefetch)),
        opt(ran.and_then(|r| r.fetch)),
        opt(ran.map(|r| r.layout)),
        opt(ran.and_then(|r| r.tier)),
        opt(ran.map(|r| r.schedule)),
        opt(ran.map(|r| r.threads)),
        ran.map(|r| r.weights.clone()).unwrap_or_default(),
        ran.map(|r| r.act.clone()).unwrap_or_default(),
        ran.map(|r| r.kv.clone()).unwrap_or_default(),
    ]);
    debug_assert_eq!(v.len(), TOKEN_COLUMNS.len());
    v
}

/// One A/B sample: a token with a comparison key (see `telemetry::ab`).
pub struct AbSample {
    pub prompt: Option<u32>,
    pub index: u32,
    pub pos: u32,
    pub ms: f64,
    /// "ran" (the engine's report) or "config" (older traces: the configuration in force).
    pub key: &'static str,
    pub setting: Setting,
    /// Runs: consecutive positions under one setting, numbered from 0 in trace order.
    pub run: u32,
    /// Block number (trace-wide, from 0) as `ab::run_blocks` cuts runs; None for a run's warm-up
    /// token and for runs too short to make a block.
    pub block: Option<u32>,
}

/// The trace's A/B samples, as the TUI's A/B pane records them (`AbBook::record`: tokens with a
/// key and a finite positive time), with their run and block.
pub fn ab_samples(r: &Replay) -> Vec<AbSample> {
    let mut v: Vec<AbSample> = Vec::new();
    let _ = for_each_token(r, |t| {
        let ms = t.st.ns_total as f64 / 1e6;
        if !(ms.is_finite() && ms > 0.0) {
            return Ok(());
        }
        if let Some(setting) = Setting::of_stats(t.st, t.cfg) {
            v.push(AbSample {
                prompt: t.prompt,
                index: t.st.index,
                pos: t.st.pos,
                ms,
                key: if t.st.ran.is_some() { "ran" } else { "config" },
                setting,
                run: 0,
                block: None,
            });
        }
        Ok(())
    });
    // Runs and blocks, the same cut as `AbBook::blocks` / `ab::run_blocks`.
    let (mut run, mut next_block, mut start) = (0u32, 0u32, 0usize);
    for i in 0..=v.len() {
        let breaks = i == v.len()
            || (i > start
                && (v[i].setting != v[i - 1].setting || v[i].pos != v[i - 1].pos.wrapping_add(1)));
        if !breaks {
            continue;
        }
        let body = (i - start).saturating_sub(WARMUP);
        let nb = body / BLOCK;
        for (j, s) in v[start..i].iter_mut().enumerate() {
            s.run = run;
            s.block = (j >= WARMUP && nb > 0)
                .then(|| next_block + (((j - WARMUP) / BLOCK).min(nb - 1)) as u32);
        }
        next_block += nb as u32;
        run += 1;
        start = i;
    }
    v
}

fn ab_row(s: &AbSample) -> Vec<String> {
    let k = &s.setting;
    vec![
        opt(s.prompt),
        s.index.to_string(),
        s.pos.to_string(),
        num(s.ms),
        s.key.to_string(),
        k.prefetch.to_string(),
        opt(k.fetch),
        k.layout.to_string(),
        opt(k.tier),
        opt(k.schedule),
        k.threads.to_string(),
        k.weights.clone(),
        k.act.clone(),
        k.kv.clone(),
        k.expert_cache_mib.to_string(),
        k.ctx.to_string(),
        s.run.to_string(),
        opt(s.block),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_quoted_only_when_needed() {
        assert_eq!(field("the"), "the");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("\n"), "\"\n\"");
        assert_eq!(field(""), "");
    }

    #[test]
    fn column_names_are_unique_per_table() {
        for t in Table::ALL {
            let mut c: Vec<&str> = t.columns().to_vec();
            c.sort();
            c.dedup();
            assert_eq!(c.len(), t.columns().len(), "{}", t.name());
        }
    }
}
