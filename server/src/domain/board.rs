//! Rules of the board: columns, agents, card text, attempts.

use super::{Error, Result};

pub const MAX_TITLE_CHARS: usize = 200;
pub const MAX_DETAIL_BYTES: usize = 64 * 1024;
pub const MAX_NOTE_BYTES: usize = 8 * 1024;
/// A card that failed this many attempts waits for an edit instead of running again.
pub const MAX_ATTEMPTS: i32 = 3;
/// How long a worker's claim lasts without renewal.
pub const LEASE_S: f64 = 30.0;
/// A machine whose worker asked for work this recently counts as served.
pub const WORKER_FRESH_S: f64 = 60.0;

pub const AGENTS: [&str; 2] = ["claude", "codex"];

/// Columns, as stored and as agents name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    Todo,
    InProgress,
    Review,
    Done,
}

impl Column {
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim() {
            "todo" => Ok(Self::Todo),
            "in-progress" | "in_progress" => Ok(Self::InProgress),
            "review" => Ok(Self::Review),
            "done" => Ok(Self::Done),
            other => Err(Error::invalid(format!("invalid state {other:?}: use todo, in-progress, review or done"))),
        }
    }

    pub fn from_db(value: &str) -> Result<Self> {
        Self::parse(value).map_err(|_| Error::Internal(format!("unknown card state {value} in the database")))
    }

    pub fn db(self) -> &'static str {
        match self {
            Self::Todo => "todo",
            Self::InProgress => "in_progress",
            Self::Review => "review",
            Self::Done => "done",
        }
    }

    /// How agents and people name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Todo => "todo",
            Self::InProgress => "in-progress",
            Self::Review => "review",
            Self::Done => "done",
        }
    }
}

pub fn title(title: &str) -> Result<&str> {
    let t = title.trim();
    if t.is_empty() {
        return Err(Error::invalid("title is required: one line naming the work"));
    }
    if t.chars().count() > MAX_TITLE_CHARS || t.contains('\n') || t.contains('\0') {
        return Err(Error::invalid(format!("title must be one line of at most {MAX_TITLE_CHARS} characters")));
    }
    Ok(t)
}

pub fn detail(detail: &str) -> Result<()> {
    if detail.contains('\0') {
        return Err(Error::invalid("detail contains a NUL character, which text cannot hold: remove it"));
    }
    if detail.len() > MAX_DETAIL_BYTES {
        return Err(Error::invalid(format!("detail is {} bytes; the limit is {MAX_DETAIL_BYTES}", detail.len())));
    }
    Ok(())
}

pub fn agent(agent: &str) -> Result<&'static str> {
    AGENTS
        .iter()
        .find(|a| **a == agent.trim())
        .copied()
        .ok_or_else(|| Error::invalid(format!("invalid agent {agent:?}: use claude or codex")))
}

/// A pull request URL as finish_job takes it.
pub fn pr_url(url: &str) -> Result<&str> {
    let u = url.trim();
    let ok =
        (u.starts_with("https://") || u.starts_with("http://")) && !u.contains(char::is_whitespace) && u.len() <= 2048;
    if ok {
        Ok(u)
    } else {
        Err(Error::invalid(format!("pr_url {url:?} is not a URL: pass the pull request's web address")))
    }
}

/// The branch a card's work goes on.
pub fn branch(id: &str) -> String {
    format!("relay/{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_parse_both_spellings() {
        assert_eq!(Column::parse("in-progress").unwrap(), Column::InProgress);
        assert_eq!(Column::parse("in_progress").unwrap().name(), "in-progress");
        assert!(Column::parse("doing").unwrap_err().to_string().contains("todo, in-progress, review or done"));
    }

    #[test]
    fn card_text_limits() {
        assert_eq!(title("  fix the flaky test ").unwrap(), "fix the flaky test");
        assert!(title("").is_err() && title("two\nlines").is_err() && title(&"x".repeat(201)).is_err());
        assert!(detail(&"x".repeat(MAX_DETAIL_BYTES + 1)).is_err());
        assert_eq!(agent("codex").unwrap(), "codex");
        assert!(agent("gemini").is_err());
        assert!(pr_url("https://forge.example/acme/app/pull/7").is_ok());
        assert!(pr_url("pull 7").is_err() && pr_url("ftp://x").is_err());
        assert_eq!(branch("k3x9"), "relay/k3x9");
    }
}
