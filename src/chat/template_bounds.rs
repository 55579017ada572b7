//! Work and memory bounds for chat-template rendering.
//!
//! Owns the per-render budget and everything that charges it. minijinja's fuel counts
//! instructions, not the work inside one: `([1]*10**12)|sum` is one instruction that runs for a
//! day, `s ~ s` doubles memory per instruction. So every operation whose cost depends on its
//! data is routed through a function here (`chat::template_compile` rewrites the operators
//! `+ * ~ in == != < <= > >= [] [:]` and list/map literals into calls of the `__cflow_*`
//! globals; every built-in filter, test and function is registered again wrapped), which
//!
//! * measures its operands (a bounded walk: [`weight`]; a string weighs its length, every other
//!   node [`NODE`] units, containers the sum of their items, with their nesting depth),
//! * refuses values heavier than [`MAX_VALUE_WEIGHT`] or nested deeper than [`MAX_DEPTH`]
//!   (deep values would recurse the native stack in Display, compare and drop), and amplifying
//!   arguments (repeat counts, `indent`/`format` widths, `tojson` indents) before any work,
//! * charges what it touched to the render's budget ([`WORK_BUDGET`] units, about 50 ms of
//!   work in a release build) and checks the wall-clock [`DEADLINE`].
//!
//! Exceeding a bound is an error whose detail starts with [`LIMIT_PREFIX`]; the render stops
//! with it and the caller (chat, the TUI) keeps its conversation.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Largest value (string bytes, or nodes × [`NODE`] + string bytes) an operation may produce.
pub const MAX_VALUE_WEIGHT: u64 = 1 << 20;
/// Weight of one non-string node (a number prints as up to ~24 bytes).
pub const NODE: u64 = 8;
/// Deepest nesting of lists/maps an operation may produce.
pub const MAX_DEPTH: u32 = 32;
/// Work units one render may spend in data-dependent operations (bytes touched, plus
/// [`NODE`] per node visited).
pub const WORK_BUDGET: u64 = 32 << 20;
/// Wall-clock limit of one render (a backstop: the budget and the fuel end hostile templates
/// long before it).
pub const DEADLINE: Duration = Duration::from_secs(1);
/// Bytes a render may emit in all (output plus captured `{% set %}` blocks and macro calls).
pub const MAX_EMITTED_BYTES: u64 = 4 << 20;
/// Largest width/precision in a `format` spec, `indent` width and `tojson` indent.
pub const MAX_WIDTH: u64 = 4096;
pub const MAX_JSON_INDENT: u64 = 64;
/// Error details of bound violations start with this.
pub const LIMIT_PREFIX: &str = "template limit: ";

struct Budget {
    left: Cell<u64>,
    /// Charges since the last clock read (the deadline is checked every 64 charges).
    ticks: Cell<u32>,
    emitted: Cell<u64>,
    deadline: Cell<Option<Instant>>,
}

thread_local! {
    static BUDGET: Budget = const {
        Budget {
            left: Cell::new(WORK_BUDGET),
            ticks: Cell::new(0),
            emitted: Cell::new(0),
            deadline: Cell::new(None),
        }
    };
}

/// A render in progress on this thread: resets the budget, restores "no render" on drop.
pub struct RenderScope(());

impl RenderScope {
    pub fn begin() -> RenderScope {
        BUDGET.with(|b| {
            b.left.set(WORK_BUDGET);
            b.emitted.set(0);
            b.deadline.set(Some(Instant::now() + DEADLINE));
        });
        RenderScope(())
    }
}

impl Drop for RenderScope {
    fn drop(&mut self) {
        BUDGET.with(|b| {
            b.left.set(WORK_BUDGET);
            b.deadline.set(None);
        });
    }
}

/// A bound violation.
pub fn limit(msg: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{LIMIT_PREFIX}{msg}"))
}

/// Spend `units` of the render's budget.
pub fn charge(units: u64) -> Result<(), Error> {
    BUDGET.with(|b| {
        let left = b.left.get();
        if units > left {
            b.left.set(0);
            return Err(limit(format!(
                "the template did more than {WORK_BUDGET} units of work (hostile or runaway \
                 template?)"
            )));
        }
        b.left.set(left - units);
        let t = b.ticks.get().wrapping_add(1);
        b.ticks.set(t);
        if t % 64 != 0 {
            return Ok(());
        }
        if let Some(d) = b.deadline.get() {
            if Instant::now() > d {
                return Err(limit(format!(
                    "rendering took longer than {} ms",
                    DEADLINE.as_millis()
                )));
            }
        }
        Ok(())
    })
}

fn too_heavy(what: &str) -> Error {
    limit(format!(
        "{what} would exceed {MAX_VALUE_WEIGHT} bytes (or nodes × {NODE})"
    ))
}

/// Work charged per call of a wrapped filter, test or function (argument handling and dispatch
/// cost about a microsecond: `range(100000)|map('string')` is 100,000 calls), and per bounded
/// operator.
pub const CALL_WORK: u64 = 1024;
pub const OP_WORK: u64 = 64;

/// Work charged per container node visited by [`weight`] (a node costs far more time than a
/// string byte).
pub const NODE_WORK: u64 = 16;

/// Weight and nesting depth of `v`, walking at most [`MAX_VALUE_WEIGHT`] units; the walk is
/// charged (string bytes plus [`NODE_WORK`] per node). Errors when `v` is heavier or deeper
/// than the limits (a cyclic namespace included).
pub fn weight(v: &Value) -> Result<(u64, u32), Error> {
    struct Walk {
        total: u64,
        nodes: u64,
        max_depth: u32,
        stack: Vec<(Value, u32)>,
    }
    impl Walk {
        fn visit(&mut self, v: &Value, depth: u32) -> Result<(), Error> {
            self.nodes += 1;
            self.total += match v.kind() {
                ValueKind::String => NODE + v.as_str().map_or(0, str::len) as u64,
                ValueKind::Bytes => NODE + v.as_bytes().map_or(0, <[u8]>::len) as u64,
                ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => {
                    if depth >= MAX_DEPTH {
                        return Err(limit(format!(
                            "values nested deeper than {MAX_DEPTH} levels"
                        )));
                    }
                    if let Some(n) = v.len() {
                        if (n as u64).saturating_mul(NODE) > MAX_VALUE_WEIGHT {
                            return Err(too_heavy("a sequence"));
                        }
                    }
                    self.stack.push((v.clone(), depth + 1));
                    NODE
                }
                _ => NODE,
            };
            self.max_depth = self.max_depth.max(depth);
            if self.total > MAX_VALUE_WEIGHT {
                return Err(too_heavy("a value"));
            }
            Ok(())
        }
    }
    let mut w = Walk {
        total: 0,
        nodes: 0,
        max_depth: 0,
        stack: Vec::new(),
    };
    let r = (|| {
        w.visit(v, 0)?;
        while let Some((c, depth)) = w.stack.pop() {
            // Fast paths for the containers minijinja builds (no per-item dispatch or clone).
            if let Some(items) = c.downcast_object_ref::<Vec<Value>>() {
                for it in items {
                    w.visit(it, depth)?;
                }
                continue;
            }
            if let Some(m) = c.downcast_object_ref::<std::collections::BTreeMap<Value, Value>>() {
                for (k, x) in m {
                    w.visit(k, depth)?;
                    w.visit(x, depth)?;
                }
                continue;
            }
            let is_map = c.kind() == ValueKind::Map;
            let Ok(items) = c.try_iter() else { continue };
            for item in items {
                if is_map {
                    let val = c.get_item(&item).unwrap_or_default();
                    w.visit(&item, depth)?;
                    w.visit(&val, depth)?;
                } else {
                    w.visit(&item, depth)?;
                }
            }
        }
        Ok::<(), Error>(())
    })();
    charge(w.total.saturating_add(w.nodes.saturating_mul(NODE_WORK)))?;
    r.map(|_| (w.total, w.max_depth))
}

/// Cost of touching `v` shallowly (strings are scanned, containers are not).
fn shallow(v: &Value) -> u64 {
    NODE + v.as_str().map_or(0, |s| s.len() as u64)
}

/// A `fmt::Write` that fails past `cap` bytes.
pub struct CappedString {
    pub s: String,
    cap: usize,
}

impl CappedString {
    pub fn new(cap: usize) -> Self {
        CappedString {
            s: String::new(),
            cap,
        }
    }
}

impl std::fmt::Write for CappedString {
    fn write_str(&mut self, x: &str) -> std::fmt::Result {
        if self.s.len() + x.len() > self.cap {
            return Err(std::fmt::Error);
        }
        self.s.push_str(x);
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// Delegation to minijinja's own operators (exact semantics) once the bounds are checked.

fn side_env() -> &'static Environment<'static> {
    static E: OnceLock<Environment<'static>> = OnceLock::new();
    E.get_or_init(Environment::new)
}

fn builtin(expr: &'static str, a: &Value, b: &Value, c: &Value, d: &Value) -> Result<Value, Error> {
    type Expr = minijinja::Expression<'static, 'static>;
    static CACHE: OnceLock<Vec<(&'static str, Expr)>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| {
        [
            "a + b", "a * b", "a in b", "a[b:c:d]", "a - b", "a / b", "a // b", "a % b", "a ** b",
            "-a",
        ]
        .into_iter()
        .filter_map(|s| side_env().compile_expression(s).ok().map(|e| (s, e)))
        .collect()
    });
    let e = cache
        .iter()
        .find(|(s, _)| *s == expr)
        .map(|(_, e)| e)
        .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "internal: no such operator"))?;
    e.eval(minijinja::context! { a => a, b => b, c => c, d => d })
}

/// Whether `e` is a bound violation (as opposed to an ordinary template error).
pub fn is_limit(e: &Error) -> bool {
    e.detail().is_some_and(|d| d.starts_with(LIMIT_PREFIX))
}

/// Evaluate a constant binary operator of the template source the way minijinja's constant
/// folding will (`None`: not foldable), within the bounds. `op`: `+ - * / // % ** ~ and or`
/// or a comparison (`== != < <= > >= in`).
pub fn fold_binop(op: &str, a: &Value, b: &Value) -> Result<Option<Value>, Error> {
    let u = Value::UNDEFINED;
    let r = match op {
        "+" => op_add(a, b),
        "*" => op_mul(a, b),
        "~" => op_concat(a, b),
        "-" => builtin("a - b", a, b, &u, &u),
        "/" => builtin("a / b", a, b, &u, &u),
        "//" => builtin("a // b", a, b, &u, &u),
        "%" => builtin("a % b", a, b, &u, &u),
        "**" => builtin("a ** b", a, b, &u, &u),
        "and" => Ok(if a.is_true() && b.is_true() {
            b.clone()
        } else {
            Value::from(false)
        }),
        "or" => Ok(if a.is_true() { a.clone() } else { b.clone() }),
        _ => fold_compare(op, a, b).map(Value::from),
    };
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_limit(&e) => Err(e),
        Err(_) => Ok(None),
    }
}

/// A constant comparison, as folded.
pub fn fold_compare(op: &str, a: &Value, b: &Value) -> Result<bool, Error> {
    let i = match op {
        "==" => 0,
        "!=" => 1,
        "<" => 2,
        "<=" => 3,
        ">" => 4,
        ">=" => 5,
        "in" => 6,
        _ => 7,
    };
    compare(i, a, b)
}

/// Constant negation, as folded.
pub fn fold_neg(a: &Value) -> Option<Value> {
    let u = Value::UNDEFINED;
    builtin("-a", a, &u, &u, &u).ok()
}

fn is_seq(v: &Value) -> bool {
    matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable)
}

fn op_add(a: &Value, b: &Value) -> Result<Value, Error> {
    charge(OP_WORK)?;
    if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
        let n = (x.len() + y.len()) as u64;
        if n > MAX_VALUE_WEIGHT {
            return Err(too_heavy("a string concatenation"));
        }
        charge(n)?;
    } else if is_seq(a) && is_seq(b) {
        let (wa, da) = weight(a)?;
        let (wb, db) = weight(b)?;
        if wa + wb > MAX_VALUE_WEIGHT || da.max(db) > MAX_DEPTH {
            return Err(too_heavy("a list concatenation"));
        }
        // Materialize: minijinja's lazy concatenation nests one iterator level per `+`, which
        // makes every later walk of `ns.l = ns.l + ...` chains slower and slower.
        let mut v: Vec<Value> = Vec::with_capacity(a.len().unwrap_or(0) + b.len().unwrap_or(0));
        v.extend(a.try_iter()?);
        v.extend(b.try_iter()?);
        charge(NODE * v.len() as u64)?;
        return Ok(Value::from(v));
    } else {
        charge(NODE)?;
    }
    let u = Value::UNDEFINED;
    builtin("a + b", a, b, &u, &u)
}

fn op_mul(a: &Value, b: &Value) -> Result<Value, Error> {
    let u = Value::UNDEFINED;
    charge(OP_WORK)?;
    let (other, n) = if a.kind() == ValueKind::Number {
        (b, a)
    } else {
        (a, b)
    };
    if other.kind() != ValueKind::Number {
        if let Some(times) = n.as_usize() {
            let w = match other.as_str() {
                Some(s) => s.len() as u64,
                None if is_seq(other) => weight(other)?.0,
                None => NODE,
            };
            let total = w.saturating_mul(times as u64);
            if total > MAX_VALUE_WEIGHT {
                return Err(too_heavy(&format!("repeating a value {times} times")));
            }
            charge(total)?;
        }
    }
    charge(NODE)?;
    builtin("a * b", a, b, &u, &u)
}

fn op_concat(a: &Value, b: &Value) -> Result<Value, Error> {
    let mut w = CappedString::new(MAX_VALUE_WEIGHT as usize);
    if write!(w, "{a}{b}").is_err() {
        return Err(too_heavy("a `~` concatenation"));
    }
    charge(w.s.len() as u64 + NODE)?;
    Ok(Value::from(w.s))
}

/// Extra work per unit of weight for element-wise comparisons (`==` on lists, `in`).
const COMPARE_FACTOR: u64 = 4;

fn op_in(needle: &Value, container: &Value) -> Result<Value, Error> {
    charge(OP_WORK)?;
    if container.as_str().is_some() {
        charge(shallow(container) + shallow(needle))?;
    } else {
        let (w, _) = weight(container)?;
        weight(needle)?;
        charge(w.saturating_mul(COMPARE_FACTOR))?;
        // minijinja's containment on a list, without the per-item dispatch.
        if let Some(items) = container.downcast_object_ref::<Vec<Value>>() {
            return Ok(Value::from(items.iter().any(|v| v == needle)));
        }
    }
    let u = Value::UNDEFINED;
    builtin("a in b", needle, container, &u, &u)
}

fn compare_cost(a: &Value, b: &Value) -> Result<(), Error> {
    charge(OP_WORK)?;
    for v in [a, b] {
        match v.kind() {
            ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => {
                let (w, _) = weight(v)?;
                charge(w.saturating_mul(COMPARE_FACTOR))?;
            }
            _ => charge(shallow(v))?,
        }
    }
    Ok(())
}

fn op_getitem(container: &Value, key: &Value) -> Result<Value, Error> {
    // Indexing a string walks its characters; an unsized iterable is walked to the index.
    let cost = match container.kind() {
        ValueKind::String => shallow(container),
        ValueKind::Iterable => NODE * container.len().unwrap_or(0) as u64 + NODE,
        _ => NODE,
    };
    charge(cost + shallow(key))?;
    container.get_item(key)
}

/// minijinja 2.24's backwards slice (`x[::-1]`) indexes out of bounds (a panic) on an empty
/// value, and underflows when `stop` lies past `start`: both give an empty result here, as in
/// Python. `None` when minijinja's own slicing is safe for these operands.
fn safe_backwards_slice(
    v: &Value,
    start: &Value,
    stop: &Value,
    step: &Value,
) -> Result<Option<Value>, Error> {
    // An omitted bound is `none`; an undefined variable is not (minijinja refuses to convert it,
    // and so does the builtin this falls through to).
    let as_opt = |x: &Value| -> Option<Option<i64>> {
        if x.is_none() {
            Some(None)
        } else {
            i64::try_from(x.clone()).ok().map(Some)
        }
    };
    let (Some(start), Some(stop), Some(Some(step))) = (as_opt(start), as_opt(stop), as_opt(step))
    else {
        return Ok(None);
    };
    if step >= 0 {
        return Ok(None);
    }
    if step < -(1i64 << 32) {
        return Err(limit("slice step is too large"));
    }
    let empty = || match v.kind() {
        ValueKind::String => Value::from(""),
        ValueKind::Bytes => Value::from_bytes(Vec::new()),
        _ => Value::from(Vec::<Value>::new()),
    };
    let end = match v.kind() {
        ValueKind::String => v.as_str().map_or(0, |s| s.chars().count()),
        ValueKind::Bytes => v.as_bytes().map_or(0, <[u8]>::len),
        ValueKind::Seq | ValueKind::Iterable => match v.len() {
            Some(n) => n,
            None => v.try_iter().map_or(0, |it| it.count()),
        },
        _ => return Ok(None),
    };
    if end == 0 {
        return Ok(Some(empty()));
    }
    let first = match start {
        None => end - 1,
        Some(s) if s >= end as i64 => end - 1,
        Some(s) if s >= 0 => s as usize,
        Some(s) => (end as i64 + s).max(0) as usize,
    };
    let last = match stop {
        None => 0,
        Some(t) if t < 0 => (end as i64 + t).max(0) as usize,
        Some(t) => t as usize,
    };
    if last != 0 && last > first {
        return Ok(Some(empty()));
    }
    Ok(None)
}

fn op_slice(v: &Value, start: &Value, stop: &Value, step: &Value) -> Result<Value, Error> {
    let cost = match v.kind() {
        ValueKind::String => shallow(v),
        _ => NODE * v.len().unwrap_or(0) as u64 + NODE,
    };
    charge(cost)?;
    if let Some(r) = safe_backwards_slice(v, start, stop, step)? {
        return Ok(r);
    }
    builtin("a[b:c:d]", v, start, stop, step)
}

fn build_list(items: &[Value]) -> Result<Value, Error> {
    let mut total = NODE;
    for it in items {
        let (w, d) = weight(it)?;
        total += w;
        if total > MAX_VALUE_WEIGHT {
            return Err(too_heavy("a list literal"));
        }
        if d + 1 >= MAX_DEPTH {
            return Err(limit(format!(
                "values nested deeper than {MAX_DEPTH} levels"
            )));
        }
    }
    Ok(Value::from(items.to_vec()))
}

/// Whether `v` (walked within the value bounds, charged) contains `target` itself.
fn reaches(v: &Value, target: &Value) -> Result<bool, Error> {
    weight(v)?;
    let mut stack = vec![v.clone()];
    let mut seen = 0u64;
    while let Some(c) = stack.pop() {
        if minijinja::tests::is_sameas(&c, target) {
            return Ok(true);
        }
        seen += 1;
        if seen > MAX_VALUE_WEIGHT / NODE {
            return Err(too_heavy("a namespace assignment"));
        }
        if matches!(
            c.kind(),
            ValueKind::Seq | ValueKind::Iterable | ValueKind::Map
        ) {
            let is_map = c.kind() == ValueKind::Map;
            if let Ok(items) = c.try_iter() {
                for it in items {
                    if is_map {
                        stack.push(c.get_item(&it).unwrap_or_default());
                    }
                    stack.push(it);
                }
            }
        }
    }
    Ok(false)
}

/// Before `{% set ns.attr = value %}`: refuse a value that contains the namespace (a reference
/// cycle: it would never be freed, and walking it never ends). Returns `[ns, value]` for the
/// `UnpackList(2)` that puts both back for the `SetAttr`.
fn setattr_check(value: &Value, ns: &Value) -> Result<Value, Error> {
    charge(OP_WORK)?;
    if ns.kind() == ValueKind::Map && reaches(value, ns)? {
        return Err(limit("a namespace cannot contain itself (reference cycle)"));
    }
    Ok(Value::from(vec![ns.clone(), value.clone()]))
}

fn build_map(kv: &[Value]) -> Result<Value, Error> {
    build_list(kv)?;
    Ok(kv
        .chunks(2)
        .map(|p| (p[0].clone(), p.get(1).cloned().unwrap_or_default()))
        .collect())
}

// ------------------------------------------------------------------------------------------
// Built-in filters, tests and functions, wrapped.

/// Filters that only look at their input shallowly (no walk of nested values).
const SHALLOW_FILTERS: &[&str] = &[
    "length", "count", "first", "last", "default", "d", "safe", "bool", "attr", "int", "float",
    "abs", "round",
];

/// Filters whose output nests deeper than their input: the result is measured too.
const NESTING_FILTERS: &[&str] = &[
    "batch",
    "slice",
    "groupby",
    "zip",
    "items",
    "dictsort",
    "chain",
    "map",
    "select",
    "reject",
    "selectattr",
    "rejectattr",
    "list",
    "reverse",
    "sort",
    "unique",
    "split",
    "lines",
];

fn kwarg_u64(args: &[Value], name: &str) -> Option<Value> {
    let last = args.last()?;
    if !last.is_kwargs() {
        return None;
    }
    let kw = Kwargs::try_from(last.clone()).ok()?;
    kw.peek::<Value>(name).ok()
}

fn positional(args: &[Value]) -> &[Value] {
    match args.last() {
        Some(l) if l.is_kwargs() => &args[..args.len() - 1],
        _ => args,
    }
}

fn width_ok(v: Option<&Value>, max: u64, what: &str) -> Result<(), Error> {
    let Some(v) = v else { return Ok(()) };
    if v.kind() == ValueKind::Number {
        let n = i128::try_from(v.clone()).unwrap_or(i128::MAX);
        if n.unsigned_abs() > max as u128 {
            return Err(limit(format!("{what} {n} is larger than {max}")));
        }
    } else if let Some(s) = v.as_str() {
        if s.len() as u64 > max {
            return Err(limit(format!("{what} is longer than {max} bytes")));
        }
    }
    Ok(())
}

/// Argument checks for the filters that can produce far more than they are given.
fn amplification(name: &str, args: &[Value], weights: &[(u64, u32)]) -> Result<(), Error> {
    let pos = positional(args);
    let w0 = weights.first().map_or(0, |w| w.0);
    match name {
        "indent" => {
            let width = pos.get(1).cloned().or_else(|| kwarg_u64(args, "width"));
            width_ok(width.as_ref(), MAX_WIDTH, "indent width")?;
            let lines = pos
                .first()
                .and_then(|v| v.as_str())
                .map_or(1, |s| s.matches('\n').count() as u64 + 1);
            let per = width.map_or(4, |w| match w.as_str() {
                Some(s) => s.len() as u64,
                None => i128::try_from(w).map_or(0, |n| n.unsigned_abs() as u64),
            });
            if lines.saturating_mul(per) + w0 > MAX_VALUE_WEIGHT {
                return Err(too_heavy("the indented text"));
            }
        }
        "format" => {
            if let Some(f) = pos.first().and_then(|v| v.as_str()) {
                let mut digits = 0u32;
                let mut in_spec = false;
                for c in f.chars() {
                    if c == '%' {
                        in_spec = !in_spec;
                        digits = 0;
                    } else if in_spec && c.is_ascii_digit() {
                        digits += 1;
                        if digits > 4 {
                            return Err(limit(format!(
                                "format width/precision larger than {MAX_WIDTH}"
                            )));
                        }
                    } else if in_spec && c.is_ascii_alphabetic() {
                        in_spec = false;
                    } else if in_spec && c == '*' {
                        return Err(limit("format width `*` is not supported"));
                    } else {
                        digits = 0;
                    }
                }
                let n: u64 = f.matches('%').count() as u64;
                if n.saturating_mul(MAX_WIDTH) > MAX_VALUE_WEIGHT {
                    return Err(too_heavy("the formatted text"));
                }
            }
        }
        "tojson" | "pprint" => {
            let indent = pos.get(1).cloned().or_else(|| kwarg_u64(args, "indent"));
            width_ok(indent.as_ref(), MAX_JSON_INDENT, "indent")?;
            let ind = indent
                .and_then(|v| i128::try_from(v).ok())
                .map_or(4, |n| n.unsigned_abs() as u64);
            let depth = weights.first().map_or(0, |w| w.1) as u64;
            // Every node may be written on its own line, indented `depth × indent`.
            let nodes = w0 / NODE + 1;
            if nodes.saturating_mul(depth * ind + 2) + w0 * 6 > 4 * MAX_VALUE_WEIGHT {
                return Err(too_heavy("the serialized value"));
            }
        }
        "join" => {
            let sep = pos
                .get(1)
                .map_or(0, |v| v.as_str().map_or(NODE, |s| s.len() as u64));
            let n = pos.first().and_then(|v| v.len()).unwrap_or(0) as u64;
            if n.saturating_mul(sep) + w0 > MAX_VALUE_WEIGHT {
                return Err(too_heavy("the joined text"));
            }
        }
        "replace" => {
            let (Some(s), Some(old)) = (
                pos.first().and_then(|v| v.as_str()),
                pos.get(1).and_then(|v| v.as_str()),
            ) else {
                return Ok(());
            };
            let new = pos.get(2).and_then(|v| v.as_str()).map_or(0, str::len) as u64;
            charge(s.len() as u64)?;
            let hits = if old.is_empty() {
                s.chars().count() as u64 + 1
            } else {
                s.matches(old).count() as u64
            };
            if hits.saturating_mul(new) + s.len() as u64 > MAX_VALUE_WEIGHT {
                return Err(too_heavy("the replaced text"));
            }
        }
        "batch" | "slice" => {
            width_ok(pos.get(1), MAX_VALUE_WEIGHT / NODE, "count")?;
        }
        _ => {}
    }
    Ok(())
}

fn check_result(name: &str, v: &Value) -> Result<(), Error> {
    if let Some(s) = v.as_str() {
        if s.len() as u64 > MAX_VALUE_WEIGHT {
            return Err(too_heavy(&format!("the result of `{name}`")));
        }
        charge(s.len() as u64)
    } else if NESTING_FILTERS.contains(&name) || !SHALLOW_FILTERS.contains(&name) {
        weight(v).map(|_| ())
    } else {
        charge(NODE)
    }
}

/// Extra work per unit of input weight for filters that compare or hash every item (sorting
/// is n log n comparisons, each far slower than a byte copy).
fn filter_work_factor(name: &str) -> u64 {
    match name {
        "sort" | "dictsort" | "groupby" | "unique" => 16,
        "min" | "max" | "sum" | "join" | "map" | "select" | "reject" | "selectattr"
        | "rejectattr" | "tojson" | "pprint" | "string" | "escape" | "e" => 4,
        _ => 0,
    }
}

fn pre_charge(name: &str, args: &[Value]) -> Result<Vec<(u64, u32)>, Error> {
    if SHALLOW_FILTERS.contains(&name) {
        let mut w = Vec::new();
        for a in args {
            let s = shallow(a);
            charge(s)?;
            w.push((s, 0));
        }
        Ok(w)
    } else {
        let w: Vec<(u64, u32)> = args.iter().map(weight).collect::<Result<_, _>>()?;
        let f = filter_work_factor(name);
        if f > 0 {
            charge(w.iter().map(|x| x.0).sum::<u64>().saturating_mul(f))?;
        }
        Ok(w)
    }
}

fn builtin_filters() -> Vec<(&'static str, Value)> {
    use minijinja::filters as f;
    vec![
        ("safe", Value::from_function(f::safe)),
        ("escape", Value::from_function(f::escape)),
        ("e", Value::from_function(f::escape)),
        ("lower", Value::from_function(f::lower)),
        ("upper", Value::from_function(f::upper)),
        ("title", Value::from_function(f::title)),
        ("capitalize", Value::from_function(f::capitalize)),
        ("replace", Value::from_function(f::replace)),
        ("length", Value::from_function(f::length)),
        ("count", Value::from_function(f::length)),
        ("dictsort", Value::from_function(f::dictsort)),
        ("items", Value::from_function(f::items)),
        ("reverse", Value::from_function(f::reverse)),
        ("trim", Value::from_function(f::trim)),
        ("join", Value::from_function(f::join)),
        ("split", Value::from_function(f::split)),
        ("lines", Value::from_function(f::lines)),
        ("default", Value::from_function(f::default)),
        ("d", Value::from_function(f::default)),
        ("round", Value::from_function(f::round)),
        ("abs", Value::from_function(f::abs)),
        ("int", Value::from_function(f::int)),
        ("float", Value::from_function(f::float)),
        ("attr", Value::from_function(f::attr)),
        ("first", Value::from_function(f::first)),
        ("last", Value::from_function(f::last)),
        ("min", Value::from_function(f::min)),
        ("max", Value::from_function(f::max)),
        ("sort", Value::from_function(f::sort)),
        ("list", Value::from_function(f::list)),
        ("string", Value::from_function(f::string)),
        ("bool", Value::from_function(f::bool)),
        ("batch", Value::from_function(f::batch)),
        ("slice", Value::from_function(f::slice)),
        ("sum", Value::from_function(f::sum)),
        ("indent", Value::from_function(f::indent)),
        ("select", Value::from_function(f::select)),
        ("reject", Value::from_function(f::reject)),
        ("selectattr", Value::from_function(f::selectattr)),
        ("rejectattr", Value::from_function(f::rejectattr)),
        ("map", Value::from_function(f::map)),
        ("groupby", Value::from_function(f::groupby)),
        ("unique", Value::from_function(f::unique)),
        ("chain", Value::from_function(f::chain)),
        ("zip", Value::from_function(f::zip)),
        ("pprint", Value::from_function(f::pprint)),
        ("format", Value::from_function(f::format)),
        ("tojson", Value::from_function(f::tojson)),
    ]
}

/// Tests whose cost depends on the size of their arguments (compare, contain, prefix).
const DEEP_TESTS: &[&str] = &[
    "in",
    "eq",
    "equalto",
    "==",
    "ne",
    "!=",
    "lt",
    "lessthan",
    "<",
    "le",
    "<=",
    "gt",
    "greaterthan",
    ">",
    "ge",
    ">=",
    "startingwith",
    "endingwith",
    "lower",
    "upper",
];

fn builtin_tests() -> Vec<(&'static str, Value)> {
    use minijinja::tests as t;
    vec![
        ("undefined", Value::from_function(t::is_undefined)),
        ("defined", Value::from_function(t::is_defined)),
        ("none", Value::from_function(t::is_none)),
        ("safe", Value::from_function(t::is_safe)),
        ("escaped", Value::from_function(t::is_safe)),
        ("boolean", Value::from_function(t::is_boolean)),
        ("odd", Value::from_function(t::is_odd)),
        ("even", Value::from_function(t::is_even)),
        ("divisibleby", Value::from_function(t::is_divisibleby)),
        ("number", Value::from_function(t::is_number)),
        ("integer", Value::from_function(t::is_integer)),
        ("int", Value::from_function(t::is_integer)),
        ("float", Value::from_function(t::is_float)),
        ("string", Value::from_function(t::is_string)),
        ("sequence", Value::from_function(t::is_sequence)),
        ("iterable", Value::from_function(t::is_iterable)),
        ("mapping", Value::from_function(t::is_mapping)),
        ("startingwith", Value::from_function(t::is_startingwith)),
        ("endingwith", Value::from_function(t::is_endingwith)),
        ("lower", Value::from_function(t::is_lower)),
        ("upper", Value::from_function(t::is_upper)),
        ("sameas", Value::from_function(t::is_sameas)),
        ("eq", Value::from_function(t::is_eq)),
        ("equalto", Value::from_function(t::is_eq)),
        ("==", Value::from_function(t::is_eq)),
        ("ne", Value::from_function(t::is_ne)),
        ("!=", Value::from_function(t::is_ne)),
        ("lt", Value::from_function(t::is_lt)),
        ("lessthan", Value::from_function(t::is_lt)),
        ("<", Value::from_function(t::is_lt)),
        ("le", Value::from_function(t::is_le)),
        ("<=", Value::from_function(t::is_le)),
        ("gt", Value::from_function(t::is_gt)),
        ("greaterthan", Value::from_function(t::is_gt)),
        (">", Value::from_function(t::is_gt)),
        ("ge", Value::from_function(t::is_ge)),
        (">=", Value::from_function(t::is_ge)),
        ("in", Value::from_function(t::is_in)),
        ("true", Value::from_function(t::is_true)),
        ("false", Value::from_function(t::is_false)),
        ("filter", Value::from_function(t::is_filter)),
        ("test", Value::from_function(t::is_test)),
    ]
}

/// Names of the operator functions `chat::template_compile` calls.
pub const OP_ADD: &str = "__cflow_add";
pub const OP_MUL: &str = "__cflow_mul";
pub const OP_CONCAT: &str = "__cflow_concat";
pub const OP_IN: &str = "__cflow_in";
pub const OP_GETITEM: &str = "__cflow_getitem";
pub const OP_SLICE: &str = "__cflow_slice";
pub const OP_LIST: &str = "__cflow_list";
pub const OP_MAP: &str = "__cflow_map";
pub const OP_EQ: &str = "__cflow_eq";
pub const OP_NE: &str = "__cflow_ne";
pub const OP_LT: &str = "__cflow_lt";
pub const OP_LTE: &str = "__cflow_lte";
pub const OP_GT: &str = "__cflow_gt";
pub const OP_GTE: &str = "__cflow_gte";
pub const OP_SETATTR_CHECK: &str = "__cflow_setattr_check";
/// Chained comparisons (`a < b < c`): return `[result, b]` for an `UnpackList(2)`.
pub const OP_CHAIN: [&str; 8] = [
    "__cflow_chain_eq",
    "__cflow_chain_ne",
    "__cflow_chain_lt",
    "__cflow_chain_lte",
    "__cflow_chain_gt",
    "__cflow_chain_gte",
    "__cflow_chain_in",
    "__cflow_chain_notin",
];

fn two(args: &[Value]) -> Result<(&Value, &Value), Error> {
    match args {
        [a, b] => Ok((a, b)),
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            "internal: operator needs two operands",
        )),
    }
}

fn compare(i: usize, a: &Value, b: &Value) -> Result<bool, Error> {
    Ok(match i {
        0 => {
            compare_cost(a, b)?;
            a == b
        }
        1 => {
            compare_cost(a, b)?;
            a != b
        }
        2 => {
            compare_cost(a, b)?;
            a < b
        }
        3 => {
            compare_cost(a, b)?;
            a <= b
        }
        4 => {
            compare_cost(a, b)?;
            a > b
        }
        5 => {
            compare_cost(a, b)?;
            a >= b
        }
        // `a in b` / `a not in b` in a chain: the container is the right operand.
        6 => op_in(a, b)?.is_true(),
        _ => !op_in(a, b)?.is_true(),
    })
}

/// Register the bounded operators, filters, tests, functions and formatter on `env`.
pub fn install(env: &mut Environment<'static>) {
    env.add_function(OP_ADD, |args: &[Value]| {
        two(args).and_then(|(a, b)| op_add(a, b))
    });
    env.add_function(OP_MUL, |args: &[Value]| {
        two(args).and_then(|(a, b)| op_mul(a, b))
    });
    env.add_function(OP_CONCAT, |args: &[Value]| {
        two(args).and_then(|(a, b)| op_concat(a, b))
    });
    env.add_function(OP_IN, |args: &[Value]| {
        two(args).and_then(|(a, b)| op_in(a, b))
    });
    env.add_function(OP_GETITEM, |args: &[Value]| {
        two(args).and_then(|(a, b)| op_getitem(a, b))
    });
    env.add_function(OP_SLICE, |args: &[Value]| match args {
        [v, a, b, c] => op_slice(v, a, b, c),
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            "internal: slice needs four operands",
        )),
    });
    env.add_function(OP_LIST, |args: &[Value]| build_list(args));
    env.add_function(OP_SETATTR_CHECK, |args: &[Value]| {
        two(args).and_then(|(v, ns)| setattr_check(v, ns))
    });
    env.add_function(OP_MAP, |args: &[Value]| build_map(args));
    for (i, name) in [OP_EQ, OP_NE, OP_LT, OP_LTE, OP_GT, OP_GTE]
        .into_iter()
        .enumerate()
    {
        env.add_function(name, move |args: &[Value]| {
            let (a, b) = two(args)?;
            compare(i, a, b).map(Value::from)
        });
    }
    for (i, name) in OP_CHAIN.into_iter().enumerate() {
        env.add_function(name, move |args: &[Value]| {
            let (a, b) = two(args)?;
            let r = compare(i, a, b)?;
            Ok(Value::from(vec![Value::from(r), b.clone()]))
        });
    }
    for (name, f) in builtin_filters() {
        env.add_filter(name, move |state: &State, args: &[Value]| {
            charge(CALL_WORK)?;
            let w = pre_charge(name, args)?;
            amplification(name, args, &w)?;
            let r = f.call(state, args)?;
            check_result(name, &r)?;
            Ok(r)
        });
    }
    for (name, f) in builtin_tests() {
        env.add_test(name, move |state: &State, args: &[Value]| {
            charge(CALL_WORK)?;
            if DEEP_TESTS.contains(&name) {
                for a in args {
                    let (w, _) = weight(a)?;
                    charge(w.saturating_mul(COMPARE_FACTOR))?;
                }
            } else {
                charge(args.iter().map(shallow).sum())?;
            }
            Ok(f.call(state, args)?.is_true())
        });
    }
    let functions: [(&'static str, Value); 4] = [
        ("range", Value::from_function(minijinja::functions::range)),
        ("dict", Value::from_function(minijinja::functions::dict)),
        (
            "namespace",
            Value::from_function(minijinja::functions::namespace),
        ),
        ("debug", Value::from_function(minijinja::functions::debug)),
    ];
    for (name, f) in functions {
        env.add_function(name, move |state: &State, args: &[Value]| {
            charge(CALL_WORK)?;
            for a in args {
                weight(a)?;
            }
            let r = f.call(state, args)?;
            if name == "range" {
                charge(NODE * r.len().unwrap_or(0) as u64)?;
            } else {
                weight(&r)?;
            }
            Ok(r)
        });
    }
    env.set_formatter(|out, state, value| {
        let (w, _) = weight(value)?;
        let emitted = BUDGET.with(|b| {
            let e = b.emitted.get() + w;
            b.emitted.set(e);
            e
        });
        if emitted > MAX_EMITTED_BYTES {
            return Err(limit(format!(
                "the template emitted more than {MAX_EMITTED_BYTES} bytes"
            )));
        }
        minijinja::escape_formatter(out, state, value)
    });
}

/// Charge a Python-style string method on `s` that produces `out_bytes` (estimated) bytes.
pub fn charge_method(s: &str, out_bytes: u64) -> Result<(), Error> {
    if out_bytes > MAX_VALUE_WEIGHT {
        return Err(too_heavy("the method's result"));
    }
    charge(s.len() as u64 + out_bytes + NODE)
}
