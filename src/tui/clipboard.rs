//! Copy to the system clipboard through the terminal: OSC 52 (`ESC ] 52 ; c ; <base64> BEL`),
//! which xterm, kitty, WezTerm, iTerm2, foot and tmux (`set -g set-clipboard on`) honour, also
//! over ssh. Terminals bound the sequence length; replies longer than [`MAX_BYTES`] are cut.

use base64::Engine as _;
use std::io::Write;

/// Largest text sent (many terminals refuse sequences beyond ~100 kB of base64).
pub const MAX_BYTES: usize = 74_000;

/// The OSC 52 sequence that puts `text` (cut at a char boundary at [`MAX_BYTES`]) on the
/// clipboard, and the number of bytes it carries.
pub fn osc52(text: &str) -> (String, usize) {
    let mut end = text.len().min(MAX_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(&text.as_bytes()[..end]);
    (format!("\x1b]52;c;{b64}\x07"), end)
}

/// Writes the sequence for `text` to `out` (the terminal); returns the bytes copied.
pub fn copy(out: &mut impl Write, text: &str) -> std::io::Result<usize> {
    let (seq, n) = osc52(text);
    out.write_all(seq.as_bytes())?;
    out.flush()?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_is_base64_of_the_text() {
        assert_eq!(osc52("hi").0, "\x1b]52;c;aGk=\x07");
        let long = "é".repeat(MAX_BYTES);
        let (seq, n) = osc52(&long);
        assert!(n <= MAX_BYTES && long.is_char_boundary(n));
        assert!(seq.len() < MAX_BYTES * 4 / 3 + 16);
        let mut buf = Vec::new();
        assert_eq!(copy(&mut buf, "hi").unwrap(), 2);
        assert_eq!(buf, b"\x1b]52;c;aGk=\x07");
    }
}
