//! What the command-line front end prints: stdout/stderr writes that survive a closed pipe
//! (`cflow-tui run … | head -1` must end quietly, not panic), and the escaping of untrusted
//! strings (model names, metadata, trace text, generated text) before they reach a terminal, so
//! a file cannot send escape sequences (`ESC ] 2 ; …`, CSI) to the user's terminal.
//!
//! * [`out!`](crate::out) / [`outln!`](crate::outln) write to stdout and return an
//!   `anyhow::Result`: a closed stdout becomes an error that [`is_closed_pipe`] recognises, and
//!   the binary's `main` turns it into a quiet exit.
//! * [`errln!`](crate::errln) / [`err!`](crate::err) write to stderr and ignore failures (a
//!   closed stderr is no reason to stop the work).
//! * Both escape what they print ([`escape`]): the program's own reports carry no control
//!   characters, so any that appear came from a file. [`escape_line`] is for one-line fields.
//! * [`progress_bar`]: the one style of progress bar on stderr, for every long phase.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::Write;

/// Writes formatted text to stdout with its control characters escaped ([`escape`]), flushing
/// it; an error (e.g. a closed pipe) is returned.
pub fn write_stdout(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    let text = args.to_string();
    let mut o = std::io::stdout().lock();
    o.write_all(escape(&text).as_bytes())?;
    o.flush()
}

/// Writes formatted text to stderr with its control characters escaped; failures are ignored.
pub fn write_stderr(args: std::fmt::Arguments<'_>) {
    let text = args.to_string();
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(escape(&text).as_bytes());
    let _ = e.flush();
}

/// True when `e` (or anything in its chain) is a write to a closed pipe.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Prints to stdout like `print!`, but evaluates to `anyhow::Result<()>`.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => {
        $crate::console::write_stdout(format_args!($($t)*)).map_err(anyhow::Error::from)
    };
}

/// Prints a line to stdout like `println!`, but evaluates to `anyhow::Result<()>`.
#[macro_export]
macro_rules! outln {
    () => { $crate::out!("\n") };
    ($($t:tt)*) => {
        $crate::console::write_stdout(format_args!("{}\n", format_args!($($t)*)))
            .map_err(anyhow::Error::from)
    };
}

/// Prints to stderr like `eprint!`, ignoring failures.
#[macro_export]
macro_rules! err {
    ($($t:tt)*) => { $crate::console::write_stderr(format_args!($($t)*)) };
}

/// Prints a line to stderr like `eprintln!`, ignoring failures (a closed stderr never panics).
#[macro_export]
macro_rules! errln {
    () => { $crate::err!("\n") };
    ($($t:tt)*) => {
        $crate::console::write_stderr(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// A C0 or C1 control character, or DEL.
fn is_control(c: char) -> bool {
    let u = c as u32;
    u < 0x20 || (0x7f..=0x9f).contains(&u)
}

fn escape_impl(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(|c| is_control(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut o = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_control(c) && !keep(c) {
            let _ = write!(o, "\\u{:04x}", c as u32);
        } else {
            o.push(c);
        }
    }
    Cow::Owned(o)
}

/// Text for a terminal: every C0/C1 control and DEL becomes a visible `\u00NN`, except newline
/// and tab (multi-line text stays readable). The same notation is a valid JSON string escape
/// with the same value, so `serde_json` output (which never holds a raw C0 control) stays valid
/// JSON: only raw DEL/C1 characters inside its strings change spelling.
pub fn escape(s: &str) -> Cow<'_, str> {
    escape_impl(s, |c| c == '\n' || c == '\t')
}

/// A one-line field (model name, metadata value, path): every control becomes `\u00NN`,
/// newlines and tabs included.
pub fn escape_line(s: &str) -> Cow<'_, str> {
    escape_impl(s, |_| false)
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress_bar(len: u64, msg: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_osc_csi_and_c1_but_keeps_newlines_in_text() {
        let s = "name\x1b]2;owned\x07 \u{9b}31m\r\nok\tx\x7f";
        assert_eq!(
            escape(s),
            "name\\u001b]2;owned\\u0007 \\u009b31m\\u000d\nok\tx\\u007f"
        );
        assert_eq!(escape_line("a\nb\tc"), "a\\u000ab\\u0009c");
        assert!(matches!(escape("plain – ünïcode ▁"), Cow::Borrowed(_)));
    }

    #[test]
    fn escaped_json_is_still_the_same_json() {
        let v = serde_json::json!({"name": "x\u{1b}]2;t\u{7}\u{9b}y\u{7f}\nz"});
        for s in [
            serde_json::to_string(&v).unwrap(),
            serde_json::to_string_pretty(&v).unwrap(),
        ] {
            let e = escape(&s);
            assert!(!e.chars().any(|c| is_control(c) && c != '\n'), "{e}");
            let back: serde_json::Value = serde_json::from_str(&e).unwrap();
            assert_eq!(back, v);
        }
    }

    #[test]
    fn closed_pipe_is_recognised_through_context() {
        let io = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let e = anyhow::Error::from(io).context("printing the report");
        assert!(is_closed_pipe(&e));
        assert!(!is_closed_pipe(&anyhow::anyhow!("other")));
    }
}
