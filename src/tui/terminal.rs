//! Terminal setup and restore.
//!
//! [`TerminalGuard`] enters raw mode and the alternate screen through `ratatui::try_init()` (which
//! also installs a panic hook that restores the terminal), optionally captures the mouse (with an
//! extra panic hook that releases it first), and restores everything on `Drop`, so every exit
//! path — return, `?`, panic — leaves a usable shell. `suspend` implements Ctrl+Z without unsafe
//! code: restore, stop our own process with `kill -STOP <pid>`, and re-enter when resumed.

use std::io::{self, stdout};
use std::sync::Once;

use ratatui::crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{enable_raw_mode, EnterAlternateScreen};
use ratatui::DefaultTerminal;

static MOUSE_HOOK: Once = Once::new();

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
        Ok(TerminalGuard { terminal, mouse })
    }

    fn leave(&self) {
        if self.mouse {
            let _ = execute!(stdout(), DisableMouseCapture);
        }
        ratatui::restore();
    }

    fn enter(&mut self) -> io::Result<()> {
        enable_raw_mode()?;
        execute!(stdout(), EnterAlternateScreen)?;
        if self.mouse {
            execute!(stdout(), EnableMouseCapture)?;
        }
        self.terminal.clear()
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
