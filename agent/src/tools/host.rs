//! Where the agent runs, as far as the tools need to know: the bridge reads it from its machine;
//! the server knows nothing of a remote agent's machine and leaves it empty.

use std::path::PathBuf;

#[derive(Debug, Clone, Default)]
pub struct Host {
    /// The working directory: the default repository of the agent's cards.
    pub cwd: Option<String>,
    /// The IANA time zone schedules are read in; UTC when unknown.
    pub time_zone: Option<String>,
    /// The job token of a card's agent (the worker sets `RELAY_JOB_TOKEN`).
    pub job_token: Option<String>,
    /// What `~/` stands for in a path.
    pub home: Option<PathBuf>,
}

impl Host {
    /// This machine and process: the working directory, the time zone, the job token and home.
    pub fn this_machine() -> Self {
        Self {
            cwd: std::env::current_dir().ok().map(|d| d.display().to_string()),
            time_zone: Some(local_zone()),
            job_token: std::env::var("RELAY_JOB_TOKEN").ok().filter(|t| !t.is_empty()),
            home: dirs::home_dir(),
        }
    }

    pub fn cwd(&self) -> String {
        self.cwd.clone().unwrap_or_default()
    }

    pub fn time_zone(&self) -> String {
        self.time_zone.clone().unwrap_or_else(|| "UTC".to_owned())
    }

    pub fn job_token(&self) -> String {
        self.job_token.clone().unwrap_or_default()
    }

    /// Whether the agent is a card's, dispatched by the board.
    pub fn is_board_agent(&self) -> bool {
        self.job_token.is_some()
    }

    /// `raw` with a leading `~/` made the home directory, when known.
    pub fn expand_home(&self, raw: &str) -> String {
        match (raw.strip_prefix("~/"), &self.home) {
            (Some(rest), Some(home)) => home.join(rest).display().to_string(),
            _ => raw.to_owned(),
        }
    }
}

/// This machine's IANA time zone: `TZ`, `/etc/timezone`, or the `/etc/localtime` link; UTC when
/// none says.
fn local_zone() -> String {
    let from_tz = std::env::var("TZ")
        .ok()
        .map(|z| z.trim_start_matches(':').to_owned())
        .filter(|z| z.contains('/') || z == "UTC");
    let from_file =
        || std::fs::read_to_string("/etc/timezone").ok().map(|z| z.trim().to_owned()).filter(|z| !z.is_empty());
    let from_link = || {
        let target = std::fs::read_link("/etc/localtime").ok()?;
        let text = target.to_string_lossy().into_owned();
        text.split_once("zoneinfo/").map(|(_, zone)| zone.to_owned())
    };
    from_tz.or_else(from_file).or_else(from_link).unwrap_or_else(|| "UTC".to_owned())
}
