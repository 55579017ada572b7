//! Generated text streamed to stdout, for `run` and `chat`: the text is model-controlled, so on
//! a terminal its control characters are shown escaped; a closed stdout (`| head -1`) raises the
//! engine's stop flag, so generation ends at once, and is reported once, after it (which `main`
//! turns into a quiet exit).

use anyhow::{Context, Result};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub(super) struct TextOut {
    stdout: std::io::Stdout,
    tty: bool,
    stop: Arc<AtomicBool>,
    closed: Option<std::io::Error>,
}

impl TextOut {
    /// `stop`: the engine's stop flag, raised when stdout is closed.
    pub(super) fn new(stop: Arc<AtomicBool>) -> TextOut {
        let stdout = std::io::stdout();
        TextOut {
            tty: std::io::IsTerminal::is_terminal(&stdout),
            stdout,
            stop,
            closed: None,
        }
    }

    /// Writes and flushes one piece of generated text; nothing once stdout was found closed.
    pub(super) fn write(&mut self, text: &str) {
        if self.closed.is_some() {
            return;
        }
        let text = if self.tty {
            crate::console::escape(text)
        } else {
            text.into()
        };
        let mut o = self.stdout.lock();
        if let Err(err) = o.write_all(text.as_bytes()).and_then(|_| o.flush()) {
            self.stop.store(true, Ordering::Relaxed);
            self.closed = Some(err);
        }
    }

    /// The write error that stopped generation, if one did.
    pub(super) fn check(&mut self) -> Result<()> {
        match self.closed.take() {
            Some(e) => Err(e).context("writing the generated text to stdout"),
            None => Ok(()),
        }
    }
}
