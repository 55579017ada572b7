//! Chat templates.
//!
//! Owns: rendering a conversation (`[{role, content}]`) into the prompt text a model expects,
//! using the model's Jinja chat template (HF `tokenizer.chat_template` / GGUF
//! `tokenizer.chat_template`) through minijinja, with a ChatML fallback when the model has none.
//! Rendering is bounded: minijinja fuel caps executed instructions (a hostile infinite loop
//! becomes [`TemplateError::OutOfFuel`], not a hang), the recursion limit caps macro/include depth,
//! the template source and the rendered output are size-capped. Known limit: a template that
//! repeatedly doubles a string (`s ~ s`) can still allocate a lot of memory within its fuel
//! budget; templates come from model files the user chose to open.
//!
//! Environment matches HF's: `trim_blocks`, `lstrip_blocks`, variables `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, function `raise_exception(msg)`, plus common
//! Python string/dict methods (`strip`, `startswith`, `split`, `items`, `get`, ...).

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde::{Deserialize, Serialize};

/// Maximum template source size.
pub const MAX_TEMPLATE_BYTES: usize = 256 * 1024;
/// Maximum rendered prompt size.
pub const MAX_OUTPUT_BYTES: usize = 16 * 1024 * 1024;
/// Instruction budget per render. Real templates need a few dozen instructions per message
/// (ChatML renders 4,096 messages well within it, see the tests); hostile ones stop after
/// ~20 ms of work in a release build. Was 2 M, which let a fuzzed template of nested loops run
/// for > 10 s under AddressSanitizer.
pub const FUEL: u64 = 500_000;
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
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| classify(&e))?;
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
        let tmpl = self.env.get_template("chat").map_err(|e| classify(&e))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let out = tmpl.render(ctx).map_err(|e| classify(&e))?;
        if out.len() > MAX_OUTPUT_BYTES {
            return Err(TemplateError::OutputTooLarge);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
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
}
