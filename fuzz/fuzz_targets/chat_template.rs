//! Hostile chat templates: compile, then render a fixed conversation. Must terminate (fuel and
//! recursion limits) and stay within bounded memory.
#![no_main]

use cflow::chat::template::{ChatMessage, ChatTemplate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(t) = ChatTemplate::new(src, "<s>", "</s>") else {
        return;
    };
    let msgs = [
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Hi {{ there }} {% raw %}"),
        ChatMessage::new("assistant", "Hello."),
    ];
    let _ = t.render(&msgs, true);
    let _ = t.render(&msgs, false);
});
