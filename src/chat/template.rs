//! Chat templates.
//!
//! Owns: rendering a conversation (`[{role, content}]`) into the prompt text a model expects,
//! using the model's Jinja chat template (HF `tokenizer.chat_template` / GGUF
//! `tokenizer.chat_template`) through minijinja, with a ChatML fallback when the model has none.
//! Rendering is bounded in time and memory: minijinja fuel caps executed instructions (a hostile
//! infinite loop becomes [`TemplateError::OutOfFuel`], not a hang), the recursion limit caps
//! macro depth, and the work inside each instruction (operators, filters, tests, functions,
//! emitted text) is measured and capped by `chat::template_bounds` on bytecode rewritten by
//! `chat::template_compile` ([`TemplateError::Limit`]): `([1]*10**12)|sum`, `s ~ s` doubling,
//! `indent(10**9)` or `'%1000000000d'|format` end in an error within milliseconds. The template
//! source and the rendered output are size-capped.
//!
//! Environment matches HF's: `trim_blocks`, `lstrip_blocks`, variables `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, function `raise_exception(msg)`, plus common
//! Python string/dict methods (`strip`, `startswith`, `split`, `items`, `get`, ...).

use super::template_bounds::{self as bounds, charge_method, LIMIT_PREFIX};
use super::template_compile;
use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde::{Deserialize, Serialize};

/// Maximum template source size.
pub const MAX_TEMPLATE_BYTES: usize = 256 * 1024;
/// Maximum rendered prompt size (a prompt this long is far beyond any context this tool runs).
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// Instruction budget per render. Real templates need a few dozen instructions per message
/// (ChatML renders 4,096 messages well within it, see the tests); hostile ones stop after a few
/// tens of ms in a release build. Was 2 M (a fuzzed template of nested loops ran > 10 s under
/// AddressSanitizer), then 500 k (~150 ms for a loop capturing raw text on a loaded machine).
pub const FUEL: u64 = 200_000;
/// Nesting limit (macros, includes, recursive loops).
pub const RECURSION_LIMIT: usize = 64;

/// The ChatML template used when a model ships none.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Template failures.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template is too large ({0} bytes, limit {MAX_TEMPLATE_BYTES})")]
    TooLarge(usize),
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    #[error("chat template ran out of fuel after {FUEL} instructions (infinite loop?)")]
    OutOfFuel,
    #[error("chat template output exceeds {MAX_OUTPUT_BYTES} bytes")]
    OutputTooLarge,
    #[error("chat template exceeded a limit: {0}")]
    Limit(String),
    #[error("chat template failed: {0}")]
    Render(String),
}

const RAISE_PREFIX: &str = "raise_exception: ";

fn classify(e: &Error) -> TemplateError {
    if e.kind() == ErrorKind::OutOfFuel {
        return TemplateError::OutOfFuel;
    }
    if let Some(d) = e.detail() {
        if let Some(msg) = d.strip_prefix(RAISE_PREFIX) {
            return TemplateError::Raised(msg.to_string());
        }
        if let Some(msg) = d.strip_prefix(LIMIT_PREFIX) {
            let at = e.line().map(|l| format!(" (line {l})")).unwrap_or_default();
            return TemplateError::Limit(format!("{msg}{at}"));
        }
    }
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    if matches!(e.kind(), ErrorKind::SyntaxError) {
        TemplateError::Syntax(s)
    } else {
        TemplateError::Render(s)
    }
}

fn arg_str(args: &[Value], i: usize) -> Option<&str> {
    args.get(i).and_then(|v| v.as_str())
}

/// Python-compatible methods on strings and maps that HF templates commonly use.
fn py_method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    let unknown = || Err(Error::from(ErrorKind::UnknownMethod));
    if let Some(s) = value.as_str() {
        let chars = arg_str(args, 0);
        let trim_set = |c: char| chars.map_or(c.is_whitespace(), |set| set.contains(c));
        // Work: a scan of `s` (and of the trim set per character); output up to 3x for case
        // changes, the replacement count for `replace`.
        let set_len = chars.map_or(1, str::len) as u64;
        let out_est = match method {
            "upper" | "lower" | "title" | "capitalize" => 3 * s.len() as u64,
            "replace" => match (arg_str(args, 0), arg_str(args, 1)) {
                (Some(a), Some(b)) if !a.is_empty() => {
                    charge_method(s, 0)?;
                    (s.matches(a).count() as u64).saturating_mul(b.len() as u64) + s.len() as u64
                }
                _ => 0,
            },
            "split" => 2 * s.len() as u64 + 8,
            "strip" | "lstrip" | "rstrip" => s.len() as u64 * set_len.min(64),
            _ => 0,
        };
        charge_method(s, out_est)?;
        return Ok(match method {
            "strip" => Value::from(s.trim_matches(trim_set)),
            "lstrip" => Value::from(s.trim_start_matches(trim_set)),
            "rstrip" => Value::from(s.trim_end_matches(trim_set)),
            "upper" => Value::from(s.to_uppercase()),
            "lower" => Value::from(s.to_lowercase()),
            "title" => return state.apply_filter("title", std::slice::from_ref(value)),
            "capitalize" => return state.apply_filter("capitalize", std::slice::from_ref(value)),
            "startswith" => Value::from(chars.is_some_and(|p| s.starts_with(p))),
            "endswith" => Value::from(chars.is_some_and(|p| s.ends_with(p))),
            "replace" => match (arg_str(args, 0), arg_str(args, 1)) {
                (Some(a), Some(b)) if !a.is_empty() => Value::from(s.replace(a, b)),
                _ => value.clone(),
            },
            "split" => {
                let parts: Vec<Value> = match chars {
                    Some(sep) if !sep.is_empty() => s.split(sep).map(Value::from).collect(),
                    _ => s.split_whitespace().map(Value::from).collect(),
                };
                Value::from(parts)
            }
            _ => return unknown(),
        });
    }
    if value.kind() == ValueKind::Map {
        bounds::charge(bounds::NODE * value.len().unwrap_or(0) as u64 + bounds::NODE)?;
        return match method {
            "items" => state.apply_filter("items", std::slice::from_ref(value)),
            "keys" => Ok(Value::from(value.try_iter()?.collect::<Vec<_>>())),
            "values" => {
                let vals: Result<Vec<Value>, Error> =
                    value.try_iter()?.map(|k| value.get_item(&k)).collect();
                Ok(Value::from(vals?))
            }
            "get" => {
                let key = args.first().cloned().unwrap_or_default();
                let v = value.get_item(&key)?;
                Ok(if v.is_undefined() {
                    args.get(1).cloned().unwrap_or(Value::from(()))
                } else {
                    v
                })
            }
            _ => unknown(),
        };
    }
    unknown()
}

/// For differential tests against [`render_unbounded_reference`]: true when `src` names one of
/// the globals the bounded renderer wraps (`range`, `dict`, `namespace`) without calling it
/// (`range ~ 1`, `dict|length`). Such a value prints as its wrapper, so the two renders may
/// legitimately differ even when the printed name is not in the output (the fuzz harness found
/// the length of `range ~ (100000)` iterated character by character: 1456 vs 1118).
#[doc(hidden)]
pub fn names_wrapped_function_as_value(src: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    ["range", "dict", "namespace"].iter().any(|name| {
        src.match_indices(name).any(|(i, _)| {
            if src[..i].chars().next_back().is_some_and(ident) {
                return false;
            }
            let rest = src[i + name.len()..].trim_start();
            !rest.starts_with('(') && !rest.chars().next().is_some_and(ident)
        })
    })
}

/// Render `source` with plain minijinja (same environment: whitespace rules, Python methods,
/// `raise_exception`, fuel) but none of the work bounds. For differential tests of the
/// bounded renderer only: a hostile template can run away here.
#[doc(hidden)]
pub fn render_unbounded_reference(
    source: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, TemplateError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(RECURSION_LIMIT);
    env.set_unknown_method_callback(py_method);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{RAISE_PREFIX}{msg}"),
        ))
    });
    env.add_template("chat", source).map_err(|e| classify(&e))?;
    let tmpl = env.get_template("chat").map_err(|e| classify(&e))?;
    // Plain minijinja can panic (e.g. `''[::-1]`): that is an error here.
    super::guard::guarded(|| {
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
        })
    })
    .map_err(|p| TemplateError::Render(format!("minijinja panicked: {p}")))?
    .map_err(|e| classify(&e))
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    is_fallback: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bytes", &self.source.len())
            .field("is_fallback", &self.is_fallback)
            .finish()
    }
}

impl ChatTemplate {
    /// Compile `source`. `bos_token` / `eos_token` are the token texts exposed to the template.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(TemplateError::TooLarge(source.len()));
        }
        // The bounded operators are globals named `__cflow_*`: a template naming them could
        // shadow them (found by the fuzz oracle).
        if source.contains("__cflow_") {
            return Err(TemplateError::Syntax(
                "the name prefix `__cflow_` is reserved".into(),
            ));
        }
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        bounds::install(&mut env);
        env.set_fuel(Some(FUEL));
        env.set_recursion_limit(RECURSION_LIMIT);
        env.set_unknown_method_callback(py_method);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("{RAISE_PREFIX}{msg}"),
            ))
        });
        // Compile once now so that syntax errors surface at load (renders compile again: the
        // bytecode borrows the source).
        template_compile::compile(source).map_err(|e| classify(&e))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            is_fallback: false,
        })
    }

    /// The ChatML fallback.
    pub fn chatml() -> Self {
        match Self::new(CHATML_TEMPLATE, "", "<|im_end|>") {
            Ok(mut t) => {
                t.is_fallback = true;
                t
            }
            // The constant template always compiles (covered by tests); keep a usable value anyway.
            Err(_) => ChatTemplate {
                env: Environment::new(),
                source: String::new(),
                bos_token: String::new(),
                eos_token: String::new(),
                is_fallback: true,
            },
        }
    }

    /// The model's template if it has one, ChatML otherwise.
    pub fn from_optional(
        source: Option<&str>,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self, TemplateError> {
        match source {
            Some(s) if !s.trim().is_empty() => Self::new(s, bos_token, eos_token),
            _ => {
                let mut t = Self::chatml();
                t.bos_token = bos_token.to_string();
                if !eos_token.is_empty() {
                    t.eos_token = eos_token.to_string();
                }
                Ok(t)
            }
        }
    }

    /// Whether this is the ChatML fallback.
    pub fn is_fallback(&self) -> bool {
        self.is_fallback
    }

    /// Template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render the conversation.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        // Backstop: minijinja itself can panic on some inputs (fuzz/chat_template found one: a
        // backwards slice of an empty list indexed out of bounds in minijinja 2.24, now bounded
        // in `template_bounds`). A template is untrusted input: a panic is an error, not a crash.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.render_inner(messages, add_generation_prompt)
        }))
        .unwrap_or_else(|p| {
            let why = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(TemplateError::Render(format!(
                "the template engine failed: {why}"
            )))
        })
    }

    fn render_inner(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let compiled = template_compile::compile(&self.source).map_err(|e| classify(&e))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let _scope = bounds::RenderScope::begin();
        let mut out = String::new();
        {
            let mut output = minijinja::machinery::make_string_output(&mut out);
            minijinja::machinery::Vm::new(&self.env)
                .eval(
                    &compiled.root,
                    ctx,
                    &compiled.blocks,
                    &mut output,
                    minijinja::AutoEscape::None,
                )
                .map_err(|e| classify(&e))?;
        }
        if out.len() > MAX_OUTPUT_BYTES {
            return Err(TemplateError::OutputTooLarge);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_wrapped_function_named_as_a_value_is_recognised() {
        use super::names_wrapped_function_as_value as f;
        assert!(f("{% for i in range~(100000) %}{% endfor %}"));
        assert!(f("{{ dict|length }}"));
        assert!(f("{{ namespace }}"));
        assert!(!f("{% for i in range(3) %}{% endfor %}"));
        assert!(!f("{{ range (3) }}{{ dict(a=1) }}"));
        assert!(!f("{{ ranges }}{{ my_range }}{{ dicts }}"));
    }

    use super::*;

    fn conv() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("user", "Hi!"),
            ChatMessage::new("assistant", "Hello."),
            ChatMessage::new("user", "Tell me a joke."),
        ]
    }

    #[test]
    fn chatml_fallback() {
        let t = ChatTemplate::from_optional(None, "", "").unwrap();
        assert!(t.is_fallback());
        let s = t.render(&conv(), true).unwrap();
        assert_eq!(
            s,
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nTell me a joke.<|im_end|>\n<|im_start|>assistant\n"
        );
        let s = t.render(&conv()[..1], false).unwrap();
        assert_eq!(s, "<|im_start|>user\nHi!<|im_end|>\n");
    }

    #[test]
    fn hostile_infinite_loop_runs_out_of_fuel() {
        let src = "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let start = std::time::Instant::now();
        let e = t.render(&conv(), true).unwrap_err();
        assert!(matches!(e, TemplateError::OutOfFuel), "{e}");
        assert!(start.elapsed().as_secs() < 10);
    }

    #[test]
    fn fuzz_found_nested_loops_with_break_run_out_of_fuel() {
        // Found by fuzz/chat_template (a >10 s timeout under ASan): nested loops whose inner
        // loop `break`s early. Must end in an error within the fuel, for both render calls.
        let src = include_bytes!("../../tests/fixtures/fuzz/chat_template_timeout_nested_loops");
        let src = std::str::from_utf8(src).unwrap();
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        for gen in [true, false] {
            let t0 = std::time::Instant::now();
            let r = t.render(&conv(), gen);
            eprintln!(
                "render(gen={gen}): {:?} in {:?}",
                r.as_ref().err(),
                t0.elapsed()
            );
            assert!(r.is_err());
        }
    }

    #[test]
    fn the_fuel_is_ample_for_real_conversations() {
        // 4,096 messages: more than any context this tool runs can hold (each takes >= 2 tokens).
        let msgs: Vec<ChatMessage> = (0..4096)
            .map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, "hello"))
            .collect();
        let t = ChatTemplate::new(CHATML_TEMPLATE, "", "<|im_end|>").unwrap();
        let s = t.render(&msgs, true).unwrap();
        assert_eq!(s.matches("<|im_start|>").count(), 4097);
        // A heavier template (system-first, string methods, a namespace) on 512 messages.
        let src = "{% set ns = namespace(first=true) %}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] | trim }}{% elif m['role'] == 'user' %}{{ '[INST] ' ~ (m['content'] | trim | upper) ~ ' [/INST]' }}{% else %}{{ ' ' ~ m['content'].strip() ~ eos_token }}{% endif %}{% set ns.first = false %}{% endfor %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let s = t.render(&msgs[..512], false).unwrap();
        assert_eq!(s.matches("[INST] HELLO [/INST]").count(), 256);
    }

    #[test]
    fn hostile_recursion_is_bounded() {
        let src = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let e = t.render(&conv(), true).unwrap_err();
        assert!(
            matches!(e, TemplateError::Render(_) | TemplateError::OutOfFuel),
            "{e}"
        );
        let src = "{% for m in messages recursive %}{{ loop([m, m]) }}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert!(t.render(&conv(), true).is_err());
    }

    #[test]
    fn raise_exception_and_syntax_errors() {
        let src = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('System message required') }}{% endif %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        match t.render(&conv(), true).unwrap_err() {
            TemplateError::Raised(m) => assert_eq!(m, "System message required"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(TemplateError::Syntax(_))
        ));
        assert!(matches!(
            ChatTemplate::new(&"x".repeat(MAX_TEMPLATE_BYTES + 1), "", ""),
            Err(TemplateError::TooLarge(_))
        ));
    }

    #[test]
    fn python_methods_and_vars() {
        let src = "{{ bos_token }}{% for m in messages %}{{ m['content'].strip().upper() }}|{{ m.role.startswith('us') }}|{{ m.get('nope', 'd') }};{% endfor %}{{ eos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let s = t
            .render(&[ChatMessage::new("user", "  hey  ")], false)
            .unwrap();
        assert_eq!(s, "<s>HEY|True|d;</s>");
    }

    /// Templates that used to run for hours, abort on a huge allocation or take gigabytes
    /// (found by review), and more of the same class. Each must end in an error, fast.
    const HOSTILE: &[&str] = &[
        "{{ ([1]*1000000000000)|sum }}",
        "{{ ([1]*1000000000000)|last }}",
        "{{ ([1]*1000000000000)|list|length }}",
        "{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}{{ ns.l|last }}",
        "{{ messages|tojson(indent=1000000000) }}",
        "{{ '%1000000000d'|format(1) }}",
        "{{ '%.1000000000f'|format(1.5) }}",
        "{{ 'x'|indent(1000000000) }}",
        "{{ ('a\n' * 1000000)|indent(100) }}",
        "{% set s = 'x' * 100000000 %}{{ s|length }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
        "{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
        "{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = {'k': ns.x} %}{% endfor %}{{ ns.x == ns.x }}",
        "{% set ns = namespace(x=1) %}{% for i in range(100) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|tojson }}",
        "{% set ns = namespace(x=[1]) %}{% for i in range(100) %}{% set ns.x = ns.x|batch(1)|list %}{% endfor %}{{ ns.x }}",
        "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns == ns }}{{ ns }}",
        "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns|tojson }}",
        "{% set a = namespace() %}{% set b = namespace(x=a) %}{% set a.y = [1, {'k': b}] %}{{ a }}",
        "{% set x %}{% for i in range(100000) %}0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789{% endfor %}{% endset %}{{ x|length }}",
        "{% macro m() %}0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789{% endmacro %}{% for i in range(100000) %}{% set y = m() %}{% endfor %}",
        "{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}",
        "{{ ([1]*1000000)|join('x'*1000000) }}",
        "{{ ('a'*1000)|replace('', 'x'*10000) }}",
        "{{ ('a'*1000).replace('a', 'x'*10000) }}",
        "{% set big = range(100000)|list %}{% for i in range(100000) %}{% set y = big[::-1] %}{% endfor %}",
        "{% set big = range(100000)|list %}{% for i in range(100000) %}{% if big == big %}{% endif %}{% endfor %}",
        "{% set big = range(100000)|list %}{% for i in range(100000) %}{% if big == big == big %}{% endif %}{% endfor %}",
        "{% set big = range(100000)|list %}{% for i in range(100000) %}{% if 99999 in big %}{% endif %}{% endfor %}",
        "{% set big = range(100000)|list %}{% for i in range(100000) %}{% set y = big|sort|unique|list %}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% set c = s[999999] %}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% set c = s.upper() %}{% endfor %}",
        "{{ (range(100000)|list) * 40 }}",
        "{{ messages * 1000000000 }}",
        "{{ [messages] * 100000 }}",
        "{% set l = range(100000)|list %}{{ l|pprint }}{{ [l, l, l, l, l, l, l, l, l, l, l, l]|pprint }}",
        "{{ dict(a=[1]*1000000000) }}",
        "{{ ('x'*3000000)|center(1000000000) }}",
        "{{ range(100000)|map('string')|join * 100 }}",
    ];

    #[test]
    fn hostile_templates_end_in_an_error_fast() {
        for src in HOSTILE {
            // Constant expressions are evaluated (bounded) when the template is compiled.
            let t0 = std::time::Instant::now();
            let t = match ChatTemplate::new(src, "<s>", "</s>") {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("{:>10.1?} {src}: at load: {e}", t0.elapsed());
                    assert!(matches!(e, TemplateError::Limit(_)), "{src}: {e}");
                    assert!(
                        t0.elapsed() < std::time::Duration::from_millis(400),
                        "{src}"
                    );
                    continue;
                }
            };
            for gen in [true, false] {
                let t0 = std::time::Instant::now();
                let r = t.render(&conv(), gen);
                let dt = t0.elapsed();
                eprintln!("{dt:>10.1?} {src}: {:?}", r.as_ref().err());
                assert!(r.is_err(), "{src}: rendered {} bytes", r.unwrap().len());
                // Release builds take a few ms; the bound is loose for a loaded machine.
                assert!(dt < std::time::Duration::from_millis(400), "{src}: {dt:?}");
            }
        }
    }

    #[test]
    fn limit_errors_say_what_was_exceeded() {
        // A constant expression: refused when the template is loaded.
        match ChatTemplate::new("{{ ([1]*1000000000000)|sum }}", "", "").unwrap_err() {
            TemplateError::Limit(m) => assert!(m.contains("repeating a value"), "{m}"),
            e => panic!("{e:?}"),
        }
        // The same with a run-time operand: refused when rendered.
        let t =
            ChatTemplate::new("{{ ([1] * (10 ** messages|length * 10000))|sum }}", "", "").unwrap();
        match t.render(&conv(), true).unwrap_err() {
            TemplateError::Limit(m) => assert!(m.contains("repeating a value"), "{m}"),
            e => panic!("{e:?}"),
        }
        let t = ChatTemplate::new("{{ 'x'|indent(1000000000) }}", "", "").unwrap();
        match t.render(&conv(), true).unwrap_err() {
            TemplateError::Limit(m) => assert!(m.contains("indent width"), "{m}"),
            e => panic!("{e:?}"),
        }
        // minijinja panics on a backwards slice of an empty value (found by fuzz/chat_template):
        // an empty result, as in Python.
        let t = ChatTemplate::new(
            "{% set e = range(10*0)|list %}[{{ e[::-1]|list }}][{{ ''[::-1] }}][{{ [1,2][0:1:-1]|list }}][{{ 'ab'[0:1:-1] }}]",
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&conv(), true).unwrap(), "[[]][][[]][]");
        // A namespace holding itself would be a reference cycle (never freed): refused.
        let t =
            ChatTemplate::new("{% set ns = namespace() %}{% set ns.me = ns %}ok", "", "").unwrap();
        match t.render(&conv(), true).unwrap_err() {
            TemplateError::Limit(m) => assert!(m.contains("cycle"), "{m}"),
            e => panic!("{e:?}"),
        }
        // After a failed render the same template object renders a benign conversation again
        // (the budget is per render).
        let t = ChatTemplate::new(
            "{% if messages|length > 5 %}{{ ([1]*(messages|length * 10**12))|sum }}{% endif %}{{ messages|length }}",
            "",
            "",
        )
        .unwrap();
        let many: Vec<ChatMessage> = (0..6).map(|_| ChatMessage::new("user", "x")).collect();
        assert!(t.render(&many, true).is_err());
        assert_eq!(t.render(&conv(), true).unwrap(), "3");
    }

    /// Benign templates exercising every rewritten operator, filter, test and function: the
    /// bounded renderer must give exactly plain minijinja's output.
    const BENIGN: &[&str] = &[
        "{{ 1 + 2 }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ 1.5 + 2 }}|{{ 'ab' * 2 }}|{{ [1, 2] * 2 }}|{{ 2 * 'x' }}|{{ 3 * 4 }}",
        "{{ 'x' ~ 1 ~ none ~ [1, 'a'] }}|{{ 1 in [1] }}|{{ 'a' in 'abc' }}|{{ 'k' in {'k': 1} }}|{{ 2 not in [1] }}",
        "{{ 1 < 2 < 3 }}|{{ 3 > 2 > 5 }}|{{ 1 == 1 != 2 }}|{{ 'b' in 'abc' in 'xabcx' }}|{{ 1 <= 1 >= 0 }}|{{ 1 not in [2] not in [[3]] }}",
        "{{ messages[-1].content }}|{{ messages[1:]|length }}|{{ 'hello'[::-1] }}|{{ messages[0]['role'] }}|{{ (messages|list)[:2]|map(attribute='role')|join(',') }}|{{ 'abc'[1] }}",
        "{{ {'a': 1, 'b': [1, 2], 'c': {'d': none}}|tojson }}|{{ {'b': 1, 'a': 2}|dictsort }}|{{ {'b': 1, 'a': 2}|items|list }}",
        "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% for k, v in {'x': 1}|items %}{{ k }}={{ v }}{% endfor %}",
        "{% macro m(x, y=2) %}[{{ x }}{{ y }}{{ caller() if caller else '' }}]{% endmacro %}{{ m(1) }}{% call m(3, 4) %}c{% endcall %}",
        "{% for m in messages %}{{ loop.index }}{{ m.role }}{% if not loop.last %},{% endif %}{% else %}none{% endfor %}",
        "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}|{{ messages|rejectattr('role', 'eq', 'user')|list|length }}",
        "{{ '%s-%d-%.2f'|format('a', 3, 1.5) }}|{{ 'a\nb'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ x|default('d') }}|{{ none|default('n', true) }}",
        "{{ range(3)|list }}|{{ range(1, 10, 3)|list }}|{{ dict(a=1, b=[2]) }}|{% set ns = namespace(c=0) %}{% for i in range(4) %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }}",
        "{{ 'Hello World'|lower }}{{ 'hi'|upper }}{{ 'hi there'|title }}{{ 'hi'|capitalize }}{{ ' x '|trim }}{{ 'a,b'|split(',') }}{{ 'a\nb'|lines }}",
        "{{ [3, 1, 2]|sort }}{{ [3, 1, 2]|sort(reverse=true) }}{{ [1, 1, 2]|unique|list }}{{ [1, 2]|reverse|list }}{{ [1, 2, 3]|sum }}{{ [1, 5]|max }}{{ [1, 5]|min }}{{ [1, 2, 3]|first }}{{ [1, 2, 3]|last }}",
        "{{ [1, 2, 3, 4, 5]|batch(2)|list }}{{ [1, 2, 3, 4, 5]|slice(2)|list }}{{ [1, 2]|chain([3])|list }}{{ [1, 2]|zip(['a', 'b'])|list }}",
        "{{ messages|groupby('role')|map(attribute='grouper')|list }}{{ 1.7|round }}{{ -3|abs }}{{ '4'|int + 1 }}{{ '2.5'|float }}{{ 1|bool }}{{ 'x'|string }}{{ '<a>'|escape }}{{ [1, 2]|length }}{{ 'abc'|count }}",
        "{{ [1, {'a': 'b'}]|pprint }}|{{ {'a': [1, 2]}|tojson(indent=2) }}|{{ 'a'|safe }}|{{ messages|map(attribute='content')|map('upper')|list }}",
        "{{ 1 is odd }}{{ 2 is even }}{{ 4 is divisibleby 2 }}{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 1 is number }}{{ 1 is integer }}{{ 1.0 is float }}{{ 'a' is string }}{{ [1] is sequence }}{{ [1] is iterable }}{{ {} is mapping }}",
        "{{ 'abc' is startingwith 'a' }}{{ 'abc' is endingwith 'c' }}{{ 'a' is lower }}{{ 'A' is upper }}{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ 1 is le 1 }}{{ 2 is gt 1 }}{{ 2 is ge 2 }}{{ 1 is in [1] }}{{ true is true }}{{ false is false }}{{ 'upper' is filter }}{{ 'odd' is test }}{{ true is boolean }}{{ messages is sameas messages }}",
        "{{ '  x  '.strip() }}{{ 'xax'.strip('x') }}{{ 'ab'.startswith('a') }}{{ 'ab'.endswith('a') }}{{ 'a-b'.replace('-', '+') }}{{ 'a b'.split() }}{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('z', 9) }}{{ {'a': 1}.keys() }}{{ {'a': 1}.values() }}{{ {'a': 1}.items() }}",
        "{%- for m in messages -%}\n  {%- if m.role == 'system' %}<<SYS>>{{ m.content }}<</SYS>>\n{% else %}{{ '[INST] ' + m.content + ' [/INST]' if m.role == 'user' else m.content + eos_token }}\n{%- endif %}\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}",
        "{% raw %}{{ not a tag }}{% endraw %}{# comment #}{% filter upper %}shout {{ 'it' }}{% endfilter %}{% with y = 5 %}{{ y * 2 }}{% endwith %}",
        "{% for i in range(10) %}{% if i > 5 %}{% break %}{% endif %}{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}",
        "{% for m in messages recursive %}{{ m.role }}{% endfor %}{% set l = [[1, [2]], [3]] %}{% for x in l recursive %}{% if x is sequence %}({{ loop(x) }}){% else %}{{ x }}{% endif %}{% endfor %}",
        "{{ 10 - 3 }}{{ 7 / 2 }}{{ 7 // 2 }}{{ 7 % 3 }}{{ 2 ** 10 }}{{ -(3) }}{{ 'a' if 1 else 'b' }}{{ (1, 2) }}{{ [1, 2, 3][1:] }}{{ 'hello'[1:3] }}{{ range(10)[2:8:2]|list }}",
        "{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
        "{{ [1, 2, 3][::-1] }}{{ 'abc'[::-1] }}{{ 'abc'[1::-1] }}{{ [1, 2, 3][-1:0:-1] }}{{ messages[::-2]|map(attribute='role')|list }}{{ 'abcdef'[4:1:-2] }}",
        "{{ raise_exception('nope') if messages|length > 10 else 'ok' }}{{ messages|last|attr('role') }}{{ messages[0].nothing }}{{ [1] + [2] }}{{ ([1] + [2]) is sequence }}{{ ([1] + [2])|length }}{{ ([1] + [2])[1] }}",
    ];

    #[test]
    fn bounded_rendering_matches_plain_minijinja() {
        for src in BENIGN {
            for gen in [true, false] {
                let want = render_unbounded_reference(src, &conv(), gen, "<s>", "</s>");
                let got =
                    ChatTemplate::new(src, "<s>", "</s>").and_then(|t| t.render(&conv(), gen));
                match (&want, &got) {
                    (Ok(w), Ok(g)) => assert_eq!(g, w, "{src}"),
                    (Err(w), Err(g)) => assert_eq!(g.to_string(), w.to_string(), "{src}"),
                    _ => panic!("{src}: reference {want:?}, bounded {got:?}"),
                }
                assert!(got.is_ok(), "{src}: {got:?}");
            }
        }
    }
}
