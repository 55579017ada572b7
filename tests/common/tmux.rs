//! A real terminal for end-to-end tests of the binary: a detached tmux session of a given size,
//! keys sent with `send-keys`, the screen read with `capture-pane`, and waits for a state
//! change on screen (never fixed sleeps). The session is killed on drop.

use std::process::Command;
use std::time::{Duration, Instant};

pub struct Tmux {
    name: String,
}

impl Tmux {
    pub fn start(name: &str, cmd: &str, w: u16, h: u16) -> Tmux {
        // `=NAME`: an exact match; a bare name also matches a session it is a prefix of
        // (`cflow-e2e` would kill `cflow-e2e-chat`, a test running beside it).
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &format!("={name}")])
            .output();
        let ok = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                name,
                "-x",
                &w.to_string(),
                "-y",
                &h.to_string(),
                cmd,
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok, "tmux new-session failed");
        Tmux { name: name.into() }
    }
    /// The session's current pane, its name matched exactly.
    fn target(&self) -> String {
        format!("={}:", self.name)
    }
    pub fn keys(&self, k: &[&str]) {
        let t = self.target();
        let mut a = vec!["send-keys", "-t", &t];
        a.extend_from_slice(k);
        assert!(Command::new("tmux").args(&a).status().unwrap().success());
    }
    pub fn literal(&self, text: &str) {
        assert!(Command::new("tmux")
            .args(["send-keys", "-t", &self.target(), "-l", text])
            .status()
            .unwrap()
            .success());
    }
    pub fn screen(&self) -> String {
        let o = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.target()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).to_string()
    }
    /// Waits until `pred(screen)` holds (up to `secs`), returning the screen.
    pub fn wait(&self, secs: u64, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if t0.elapsed() > Duration::from_secs(secs) {
                panic!("timed out waiting for {what}; screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &format!("={}", self.name)])
            .output();
    }
}
