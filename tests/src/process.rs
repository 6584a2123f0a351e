//! Child processes with deadlines: every command the harness runs, and every exit it waits for,
//! fails the test with what it waited for instead of hanging the suite.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a command the tests run (an admin command, a client, a validator) may take.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// How long an installer (npm, pip, a venv) may take on a slow mirror.
pub const INSTALL_LIMIT: Duration = Duration::from_secs(900);

/// How long a process may take to exit once told to.
pub const EXIT_LIMIT: Duration = Duration::from_secs(30);

/// `Command::output` and `Command::status` with a deadline: a command still running at its limit is
/// killed and the test fails, naming it.
pub trait RunWithin {
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output>;
    fn status_within(&mut self, limit: Duration) -> std::io::Result<ExitStatus>;
}

impl RunWithin for Command {
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output> {
        let mut child = self.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        // Read both pipes while waiting, so a chatty command cannot block on a full pipe.
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                if let Some(mut pipe) = pipe {
                    let _ = pipe.read_to_end(&mut bytes);
                }
                bytes
            })
        };
        let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
        let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
        let status = wait_within(&mut child, limit, &describe(self));
        Ok(Output { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() })
    }

    fn status_within(&mut self, limit: Duration) -> std::io::Result<ExitStatus> {
        let mut child = self.spawn()?;
        Ok(wait_within(&mut child, limit, &describe(self)))
    }
}

/// Waits for `child` to exit; at `limit` kills it and fails, naming `what` was waited for.
pub fn wait_within(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("cannot wait for {what}: {e}")) {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The async [`RunWithin`], for `tokio::process::Command`.
pub trait RunWithinAsync {
    fn output_within(&mut self, limit: Duration) -> impl std::future::Future<Output = std::io::Result<Output>>;
}

impl RunWithinAsync for tokio::process::Command {
    async fn output_within(&mut self, limit: Duration) -> std::io::Result<Output> {
        let what = describe(self.as_std());
        self.kill_on_drop(true);
        tokio::time::timeout(limit, self.output())
            .await
            .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}: killed"))
    }
}

/// Waits for an async child to exit, failing with `what` at `limit` (the child is then killed).
pub async fn exit_within(child: &mut tokio::process::Child, limit: Duration, what: &str) -> ExitStatus {
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => status.unwrap_or_else(|e| panic!("cannot wait for {what}: {e}")),
        Err(_) => {
            let _ = child.kill().await;
            panic!("{what} did not exit within {limit:?}: killed")
        }
    }
}

fn describe(cmd: &Command) -> String {
    let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    format!("`{} {}`", cmd.get_program().to_string_lossy(), args.join(" "))
}
