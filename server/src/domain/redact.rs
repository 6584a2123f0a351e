//! Credential redaction: every message body passes through here before it is stored, so a secret
//! pasted into a message reaches neither another agent nor the database. Each find is replaced by
//! `[REDACTED:<kind>]`, and the sender is told how many of which kinds.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::{Captures, Regex};

struct Rule {
    kind: &'static str,
    pattern: Regex,
    /// The capture group holding the secret; 0 is the whole match.
    group: usize,
}

fn rule(kind: &'static str, pattern: &str, group: usize) -> Rule {
    Rule { kind, pattern: Regex::new(pattern).expect("redaction patterns are valid"), group }
}

/// Order matters: whole blocks and specific token shapes first, generic assignments last, so a
/// known token inside an assignment is named by its kind.
static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        rule(
            "private-key",
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?s:.*?)(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\z)",
            0,
        ),
        rule("relay-token", r"\brl[mshgj]_[0-9a-f]{64}\b", 0),
        rule("aws-access-key", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b", 0),
        rule(
            "aws-secret-key",
            r#"(?i)aws.{0,20}?(?:secret|private).{0,20}?['"]?\s*[:=]\s*['"]?([A-Za-z0-9/+=]{40})\b"#,
            1,
        ),
        rule("github-token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b", 0),
        rule("gitlab-token", r"\bglpat-[A-Za-z0-9_-]{20,}\b", 0),
        rule("slack-token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b", 0),
        rule("slack-webhook", r"https://hooks\.slack\.com/services/[A-Za-z0-9/]{20,}", 0),
        rule("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", 0),
        rule("connection-password", r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]+:([^\s@/]+)@", 1),
        rule("bearer-token", r"(?i)\bbearer\s+([A-Za-z0-9._~+/=-]{16,})", 1),
        rule(
            "password",
            r#"(?i)\b(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token|client[_-]?secret)["']?\s*[:=]\s*("[^"\n]{6,}"|'[^'\n]{6,}'|[^\s"',;]{6,})"#,
            1,
        ),
    ]
});

/// Values that only look like secrets: placeholders, variables and earlier markers.
fn placeholder(value: &str) -> bool {
    let v = value.trim_matches(|c| c == '"' || c == '\'');
    v.starts_with(['$', '<', '{', '%', '*'])
        || v.starts_with("[REDACTED")
        || v.chars().all(|c| c == 'x' || c == 'X' || c == '*' || c == '.')
        || ["changeme", "password", "example", "redacted", "process.env", "os.environ"]
            .iter()
            .any(|p| v.to_ascii_lowercase().starts_with(p))
}

/// What redaction did to one body.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Redacted {
    pub text: String,
    /// Spans replaced, by kind.
    pub counts: BTreeMap<&'static str, u32>,
}

impl Redacted {
    pub fn total(&self) -> u32 {
        self.counts.values().sum()
    }
}

pub fn redact(body: &str) -> Redacted {
    let mut text = body.to_owned();
    let mut counts = BTreeMap::new();
    for rule in RULES.iter() {
        if !rule.pattern.is_match(&text) {
            continue;
        }
        let mut found = 0;
        let replaced = rule.pattern.replace_all(&text, |caps: &Captures<'_>| {
            let whole = caps.get(0).expect("a match has group 0");
            let Some(secret) = caps.get(rule.group) else { return whole.as_str().to_owned() };
            if rule.group != 0 && placeholder(secret.as_str()) {
                return whole.as_str().to_owned();
            }
            found += 1;
            let (start, end) = (secret.start() - whole.start(), secret.end() - whole.start());
            format!("{}[REDACTED:{}]{}", &whole.as_str()[..start], rule.kind, &whole.as_str()[end..])
        });
        if found > 0 {
            text = replaced.into_owned();
            *counts.entry(rule.kind).or_insert(0) += found;
        }
    }
    Redacted { text, counts }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real-looking samples (none of them live credentials) and what must come out.
    const SECRETS: &[(&str, &str, &str)] = &[
        (
            "private-key",
            "key:\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\nAAAAAAABAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----\nthanks",
            "key:\n[REDACTED:private-key]\nthanks",
        ),
        ("private-key", "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq\n(truncated)", "[REDACTED:private-key]"),
        (
            "aws-access-key",
            "export AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE",
            "export AWS_ACCESS_KEY_ID=[REDACTED:aws-access-key]",
        ),
        (
            "aws-secret-key",
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "aws_secret_access_key = [REDACTED:aws-secret-key]",
        ),
        (
            "github-token",
            "use ghp_1234567890abcdefghijklmnopqrstuvwxyzAB to push",
            "use [REDACTED:github-token] to push",
        ),
        (
            "github-token",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789",
            "[REDACTED:github-token]",
        ),
        ("gitlab-token", "GITLAB_TOKEN: glpat-xYz12345678901234567", "GITLAB_TOKEN: [REDACTED:gitlab-token]"),
        ("slack-token", "bot token xoxb-123456789012-1234567890123-AbCdEfGhIjKl", "bot token [REDACTED:slack-token]"),
        (
            "slack-webhook",
            "post to https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX now",
            "post to [REDACTED:slack-webhook] now",
        ),
        (
            "jwt",
            "cookie eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "cookie [REDACTED:jwt]",
        ),
        (
            "bearer-token",
            "curl -H 'Authorization: Bearer 9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c'",
            "curl -H 'Authorization: Bearer [REDACTED:bearer-token]'",
        ),
        ("password", "db password=hunter2hunter2 ok", "db password=[REDACTED:password] ok"),
        ("password", r#"{"api_key": "sk-live-abcdef123456"}"#, r#"{"api_key": [REDACTED:password]}"#),
        (
            "connection-password",
            "DATABASE_URL=postgres://app:s3cr3t-pw@db.internal:5432/app",
            "DATABASE_URL=postgres://app:[REDACTED:connection-password]@db.internal:5432/app",
        ),
        (
            "relay-token",
            "token rlm_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "token [REDACTED:relay-token]",
        ),
    ];

    /// Look-alikes that must pass untouched.
    const HARMLESS: &[&str] = &[
        "the password field is empty",
        "password: <your password here>",
        "password=$DB_PASSWORD",
        "set api_key = ${API_KEY} in the env",
        "token = xxxxxxxx",
        "password: changeme (the default)",
        "https://example.com:8443/path is up",
        "postgres://app@db.internal/app has no password",
        "AKIA is how AWS key ids start",
        "ghp_ tokens are 40 characters long",
        "eyJhbGciOi is how a JWT header begins",
        "bearer of bad news",
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8A\n-----END PUBLIC KEY-----",
        "commit 4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a fixed it",
        "fn password_hash(input: &str) -> String",
    ];

    #[test]
    fn secrets_are_replaced_by_their_kind() {
        for (kind, input, expected) in SECRETS {
            let out = redact(input);
            assert_eq!(out.text, *expected, "{kind}: {input}");
            assert_eq!(out.counts.get(kind), Some(&1), "{kind}: {:?}", out.counts);
            assert_eq!(out.total(), 1, "{kind}: {:?}", out.counts);
        }
    }

    #[test]
    fn look_alikes_are_left_alone() {
        for input in HARMLESS {
            let out = redact(input);
            assert_eq!(out.text, *input);
            assert_eq!(out.total(), 0, "{input}: {:?}", out.counts);
        }
    }

    #[test]
    fn several_spans_are_counted() {
        let out = redact(
            "a ghp_1234567890abcdefghijklmnopqrstuvwxyzAB b ghp_abcdefghijklmnopqrstuvwxyz1234567890AB c AKIAIOSFODNN7EXAMPLE",
        );
        assert_eq!(out.counts.get("github-token"), Some(&2));
        assert_eq!(out.counts.get("aws-access-key"), Some(&1));
        assert!(!out.text.contains("ghp_1") && !out.text.contains("AKIA"));
        assert_eq!(redact(&out.text).total(), 0, "markers are not redacted again");
    }
}
