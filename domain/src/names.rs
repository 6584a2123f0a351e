//! Account, machine and handle names: `[a-z0-9][a-z0-9-]{0,38}`.

use super::{Error, Result};

pub const MAX_NAME_LEN: usize = 39;

/// What a name is for, so errors say which name was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    Account,
    Machine,
    Handle,
}

impl NameKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Account => "account",
            Self::Machine => "machine",
            Self::Handle => "handle",
        }
    }
}

pub fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_NAME_LEN
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

pub fn validate(kind: NameKind, name: &str) -> Result<()> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "invalid {} name {name:?}: use 1 to {MAX_NAME_LEN} lowercase letters, digits or '-', starting with a letter or digit",
            kind.as_str()
        )))
    }
}

/// The account's human inbox lives at machine `me`, handle `me`, and reads as `account/me`.
pub const HUMAN: &str = "me";
/// The board's notices come from handle `board` on the reserved machine `me` (`account/me/board`),
/// which no machine token can claim. It reads nothing: sends and replies to it are refused.
pub const BOARD: &str = "board";

/// Names agents and machines may not take: `me` is the account's human inbox.
pub fn check_claimable(kind: NameKind, name: &str) -> Result<()> {
    validate(kind, name)?;
    if name == HUMAN {
        return Err(Error::invalid(format!("{} name \"me\" is reserved for the account's human inbox", kind.as_str())));
    }
    Ok(())
}

/// The handle a claim that names none takes: `<harness>-<n>`, the lowest n no live endpoint holds.
pub fn free_handle(harness: &str, live: &[String]) -> String {
    (1..)
        .map(|n| format!("{harness}-{n}"))
        .find(|h| !live.contains(h))
        .expect("an unbounded range always has a free name")
}

/// A spawned worker's handle: `<parent>-<n>`, the lowest n not taken, with the parent's handle
/// shortened so the whole is still a valid name.
pub fn child_handle(parent: &str, taken: &[String]) -> String {
    (1..)
        .map(|n: u32| {
            let suffix = format!("-{n}");
            let base = &parent[..parent.len().min(MAX_NAME_LEN - suffix.len())];
            format!("{}{suffix}", base.trim_end_matches('-'))
        })
        .find(|h| !taken.contains(h))
        .expect("an unbounded range always has a free name")
}

/// Turns an arbitrary host name into a valid machine name (`My_Laptop.local` → `my-laptop-local`).
pub fn sanitize(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.truncate(MAX_NAME_LEN);
    let trimmed = out.trim_end_matches('-');
    match trimmed {
        "" => "machine".to_owned(),
        // `me` is the human inbox's reserved machine.
        "me" => "me-machine".to_owned(),
        name => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_syntax() {
        for name in ["a", "0", "alice", "build-box-2", &"a".repeat(39)] {
            assert!(is_valid_name(name), "{name}");
        }
    }

    #[test]
    fn refuses_everything_else() {
        for name in ["", "-a", "Alice", "a_b", "a.b", "a/b", "é", " a", &"a".repeat(40)] {
            assert!(!is_valid_name(name), "{name}");
        }
    }

    #[test]
    fn error_names_the_kind_and_value() {
        let err = validate(NameKind::Handle, "Bad Name").unwrap_err();
        assert!(err.to_string().contains("invalid handle name \"Bad Name\""), "{err}");
    }

    #[test]
    fn picked_handles_skip_the_taken_ones() {
        let taken = vec!["claude-1".to_owned(), "claude-3".to_owned()];
        assert_eq!(free_handle("claude", &taken), "claude-2");
        assert_eq!(child_handle("claude", &taken), "claude-2");
        let long = "a".repeat(MAX_NAME_LEN);
        let child = child_handle(&long, &[]);
        assert!(is_valid_name(&child) && child.ends_with("-1"), "{child}");
    }

    #[test]
    fn sanitizes_host_names() {
        assert_eq!(sanitize("My_Laptop.local"), "my-laptop-local");
        assert_eq!(sanitize("--x--"), "x");
        assert_eq!(sanitize("..."), "machine");
        assert_eq!(sanitize(&"ab".repeat(30)).len(), MAX_NAME_LEN);
        assert!(is_valid_name(&sanitize("-Ünïcode-Host-")));
    }
}
