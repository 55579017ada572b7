//! Terminal setup and restore.
//!
//! [`TerminalGuard`] enters raw mode and the alternate screen through `ratatui::try_init()` (which
//! also installs a panic hook that restores the terminal), optionally captures the mouse (with an
//! extra panic hook that releases it first), and restores everything on `Drop`, so every exit
//! path — return, `?`, panic — leaves a usable shell. `suspend` implements Ctrl+Z without unsafe
//! code: restore, stop our own process with `kill -STOP <pid>`, and re-enter when resumed.
//!
//! Panics the engine catches and reports as `Error` events (on the engine, reader and prefetch
//! threads) must not restore the terminal under the running UI nor print over it: an outer hook
//! keeps their report and prints it on stderr once the terminal is restored.

use std::io::{self, stdout};
use std::sync::{Mutex, Once};

use ratatui::crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{enable_raw_mode, EnterAlternateScreen};
use ratatui::DefaultTerminal;

static MOUSE_HOOK: Once = Once::new();
static CAUGHT_HOOK: Once = Once::new();
/// Reports of caught panics, printed when the terminal is restored.
static DEFERRED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Threads whose panics the engine catches and turns into `Error` events.
fn caught_thread(name: &str) -> bool {
    name == "cflow-engine" || name == "cflow-prefetch" || name.starts_with("cflow-reader-")
}

/// Owns the terminal while the TUI runs.
pub struct TerminalGuard {
    pub terminal: DefaultTerminal,
    mouse: bool,
}

impl TerminalGuard {
    /// Enter raw mode + alternate screen (+ mouse capture).
    pub fn new(mouse: bool) -> io::Result<Self> {
        let terminal = ratatui::try_init()?;
        if mouse {
            MOUSE_HOOK.call_once(|| {
                let prev = std::panic::take_hook();
                std::panic::set_hook(Box::new(move |info| {
                    let _ = execute!(stdout(), DisableMouseCapture);
                    prev(info);
                }));
            });
            execute!(stdout(), EnableMouseCapture)?;
        }
        CAUGHT_HOOK.call_once(|| {
            let prev = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                // A panic caught at the tokenizer boundary is an error, not a crash.
                if crate::chat::guard::quiet() {
                    return;
                }
                let name = std::thread::current().name().map(String::from);
                match name {
                    Some(n) if caught_thread(&n) => {
                        if let Ok(mut d) = DEFERRED.lock() {
                            d.push(format!("thread '{n}' {info}"));
                        }
                    }
                    _ => prev(info),
                }
            }));
        });
        Ok(TerminalGuard { terminal, mouse })
    }

    fn leave(&self) {
        if self.mouse {
            let _ = execute!(stdout(), DisableMouseCapture);
        }
        ratatui::restore();
        if let Ok(mut d) = DEFERRED.lock() {
            for m in d.drain(..) {
                crate::errln!("{m}");
            }
        }
    }

    fn enter(&mut self) -> io::Result<()> {
        enable_raw_mode()?;
        execute!(stdout(), EnterAlternateScreen)?;
        if self.mouse {
            execute!(stdout(), EnableMouseCapture)?;
        }
        self.terminal.clear()
    }

    /// Captures (wheel scrollback) or releases the mouse (the terminal's own selection works);
    /// restored on exit either way.
    pub fn set_mouse(&mut self, on: bool) -> io::Result<()> {
        if on {
            MOUSE_HOOK.call_once(|| {
                let prev = std::panic::take_hook();
                std::panic::set_hook(Box::new(move |info| {
                    let _ = execute!(stdout(), DisableMouseCapture);
                    prev(info);
                }));
            });
            execute!(stdout(), EnableMouseCapture)?;
        } else {
            execute!(stdout(), DisableMouseCapture)?;
        }
        self.mouse = on;
        Ok(())
    }

    /// Ctrl+Z: give the terminal back, stop the process (the shell's `fg` resumes it), re-enter.
    pub fn suspend(&mut self) -> io::Result<()> {
        self.leave();
        let pid = std::process::id().to_string();
        let status = std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status();
        let res = self.enter();
        status?;
        res
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        self.leave();
    }
}
