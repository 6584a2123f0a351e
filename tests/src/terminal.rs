//! A real terminal for interactive agent CLIs: a tmux server of the test's own (its own socket, so
//! nothing of anyone else's tmux is touched) running one program in a window of fixed size. The
//! test types into it and reads its screen; dropping it ends the server and the program.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::clients;
use crate::process::{COMMAND_LIMIT, RunWithin};

pub struct Terminal {
    socket: String,
    tmux: std::path::PathBuf,
}

impl Terminal {
    /// Starts `program args` in `cwd` with exactly the environment `env` (plus a terminal type):
    /// nothing of the test process's own environment leaks into the agent.
    pub fn start(cwd: &Path, env: &[(&str, &str)], program: &Path, args: &[&str]) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let socket = format!("relay-test-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let tmux = clients::system("tmux", "tmux");
        let mut line = vec!["env".to_owned(), "-i".to_owned(), "TERM=xterm-256color".to_owned()];
        line.extend(env.iter().map(|(k, v)| shell_quote(&format!("{k}={v}"))));
        line.push(shell_quote(&program.display().to_string()));
        line.extend(args.iter().map(|a| shell_quote(a)));
        let terminal = Self { socket, tmux };
        let out = terminal
            .run(&["new-session", "-d", "-s", "main", "-x", "200", "-y", "50", "-c"], Some((cwd, &line.join(" "))));
        assert!(out.status.success(), "tmux new-session failed: {}", String::from_utf8_lossy(&out.stderr));
        terminal
    }

    fn run(&self, args: &[&str], session: Option<(&Path, &str)>) -> Output {
        let mut command = Command::new(&self.tmux);
        command.args(["-L", &self.socket, "-f", "/dev/null"]).args(args);
        if let Some((cwd, line)) = session {
            command.arg(cwd).arg(line);
        }
        command.stdin(Stdio::null()).output_within(COMMAND_LIMIT).expect("run tmux")
    }

    /// Sends keys as tmux names them (`Enter`, `Down`, `C-c`).
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "main"];
        args.extend_from_slice(keys);
        self.run(&args, None);
    }

    /// Types `text` literally, then Enter.
    pub fn type_line(&self, text: &str) {
        self.run(&["send-keys", "-t", "main", "-l", text], None);
        self.keys(&["Enter"]);
    }

    /// What the screen shows now.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "main"], None).stdout).into_owned()
    }

    /// Waits until the screen shows `needle`.
    pub async fn wait_for(&self, needle: &str, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let screen = self.screen();
            if screen.contains(needle) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the terminal did not show {needle:?} within {limit:?}; it shows:\n{screen}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Terminal {
    /// Waits until the screen no longer shows `needle` (a dialog answered).
    pub async fn wait_until_gone(&self, needle: &str, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let screen = self.screen();
            if !screen.contains(needle) {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "the terminal still shows {needle:?}:\n{screen}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.run(&["kill-server"], None);
    }
}

fn shell_quote(word: &str) -> String {
    if word.chars().all(|c| c.is_ascii_alphanumeric() || "/._-=:,+@".contains(c)) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}
