//! Credential redaction: every piece of text an agent (or a person) hands the server passes through
//! here before it is stored, so a secret pasted into a message, a card, a note or an error reaches
//! neither another agent nor the database. Each find is replaced by `[REDACTED:<kind>]`, and the
//! writer can be told how many of which kinds.
//!
//! The store takes such text only as a [`RedactedText`], which nothing but [`redact`] makes: a new
//! write path that forgets to redact does not compile.
//!
//! The shapes follow gitleaks' rule set (own expressions, fitted to what agents paste): tokens with
//! a known prefix anywhere, and generic `name = value` assignments only where the name says secret.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::LazyLock;

use regex::{Captures, Regex};

/// Spans replaced, by kind.
pub type Counts = BTreeMap<&'static str, u32>;

/// Text with every credential the redactor knows replaced by a marker. Only [`redact`] (and
/// [`RedactedText::from_agent`], which calls it) makes one; the field is private and there is no
/// conversion from a string, so whatever a store function takes as `RedactedText` was redacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedactedText(String);

impl RedactedText {
    /// Redacts text an agent or a person wrote; [`redact`] also says what it replaced.
    pub fn from_agent(text: &str) -> Self {
        redact(text).text
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// At most `max` bytes of it, cut on a character boundary and marked with `…`. Cutting redacted
    /// text cannot uncover a secret.
    pub fn truncated(self, max: usize) -> Self {
        if self.0.len() <= max {
            return self;
        }
        let mut end = max;
        while !self.0.is_char_boundary(end) {
            end -= 1;
        }
        Self(format!("{}…", &self.0[..end]))
    }
}

impl AsRef<str> for RedactedText {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RedactedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What redaction did to one text.
#[derive(Debug, PartialEq, Eq)]
pub struct Redacted {
    pub text: RedactedText,
    pub counts: Counts,
}

impl Redacted {
    pub fn total(&self) -> u32 {
        self.counts.values().sum()
    }
}

struct Rule {
    kind: &'static str,
    pattern: Regex,
    /// The capture group holding the secret; 0 is the whole match.
    group: usize,
    /// Whether a match is a secret after all, for what a pattern without look-around cannot say.
    accept: fn(&Captures<'_>) -> bool,
}

fn rule(kind: &'static str, pattern: &str, group: usize) -> Rule {
    checked(kind, pattern, group, |_| true)
}

fn checked(kind: &'static str, pattern: &str, group: usize, accept: fn(&Captures<'_>) -> bool) -> Rule {
    Rule { kind, pattern: Regex::new(pattern).expect("redaction patterns are valid"), group, accept }
}

/// `name = value` where the name ends in one of `keywords`: `DB_PASSWORD=…`, `"api_key": "…"`,
/// `export PGPASSWORD=…`. The name may carry any prefix but must end at the keyword, so
/// `password_file` or `max_tokens` are not secrets. Group 1 is the separator with its spaces,
/// group 2 the value (quotes included).
fn assignment(keywords: &str) -> String {
    format!(
        r#"(?i)\b[\w.-]{{0,40}}?(?:{keywords})["'`]?([ \t]*(?:=>|==?|:=?)[ \t]*)("[^"\n]*"|'[^'\n]*'|`[^`\n]*`|[^\s"'`,;]+)"#
    )
}

/// Order matters: whole blocks and specific token shapes first, generic assignments last, so a
/// known token inside an assignment is named by its kind (the assignment then sees a marker).
static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        rule(
            "private-key",
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?s:.*?)(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\z)",
            0,
        ),
        rule("relay-token", r"\brl[mshgj]_[0-9a-f]{64}\b", 0),
        rule("aws-access-key", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ABIA|ACCA)[0-9A-Z]{16}\b", 0),
        // The secret has no prefix: it is known by its name, `aws…secret…` or AWS JSON's `SecretAccessKey`.
        rule(
            "aws-secret-key",
            r#"(?i)(?:aws.{0,20}?(?:secret|private)|secret_?access_?key).{0,20}?["']?\s*[:=]\s*["']?([A-Za-z0-9/+=]{40})(?:[^A-Za-z0-9/+=]|$)"#,
            1,
        ),
        rule("github-token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b", 0),
        // A classic token is 40 hex digits, like a commit hash: only a name saying GitHub and token
        // (or key, secret, …) right before it makes it one.
        rule(
            "github-token",
            r#"(?i-u)(?:\b(?:[\w.-]{0,30}?[_.-])?gh|\b[\w.-]{0,30}?github)[\w .-]{0,20}?(?:token|pat|secret|key|auth|oauth|password|credentials?)[\w.-]{0,10}?["']?[ \t]*(?:=>|[:=])?[ \t]*["']?([0-9a-f]{40})\b"#,
            1,
        ),
        rule("gitlab-token", r"\bglpat-[A-Za-z0-9_-]{20,}\b", 0),
        rule("slack-token", r"\b(?:xox[abposre]-[A-Za-z0-9-]{10,}|xapp-\d-[A-Za-z0-9-]{10,})", 0),
        rule("slack-webhook", r"https://hooks\.slack\.com/services/[A-Za-z0-9/]{20,}", 0),
        rule("anthropic-key", r"\bsk-ant-[A-Za-z0-9_-]{20,}", 0),
        checked("openai-key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}", 0, |c| random_looking(&c[0][3..])),
        rule("stripe-key", r"\b(?:sk|rk)_(?:live|test|prod)_[A-Za-z0-9]{10,99}\b", 0),
        rule("google-api-key", r"\bAIza[0-9A-Za-z_-]{35}", 0),
        rule("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", 0),
        // The password runs to the last `@` that a host follows, so it may hold `/`, `@` or `!`.
        checked(
            "connection-password",
            r#"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@'"]*:([^\s'"<>]+)@[A-Za-z0-9._~%\[\]-]+(?::\d+)?(?:[/?#\s'"<>,;)]|$)"#,
            1,
            |c| !port_and_path(&c[1]),
        ),
        rule("bearer-token", r"(?i)\bbearer\s+([A-Za-z0-9._~+/=-]{16,})", 1),
        checked("password", &assignment("password|passwd|passphrase|pwd"), 2, |c| assigned(c, 1)),
        checked(
            "secret",
            &assignment(
                "secret|client[_-]?secret|secret[_-]?key|token|api[_-]?key|access[_-]?key|private[_-]?key|auth[_-]?key|credentials?",
            ),
            2,
            |c| assigned(c, 8),
        ),
    ]
});

/// Mixed letters and digits, as generated keys are; `sk-` followed by words is not a key.
fn random_looking(s: &str) -> bool {
    s.chars().any(|c| c.is_ascii_digit()) && s.chars().any(|c| c.is_ascii_alphabetic())
}

/// `host:8443/path@…` is a port and a path before an `@` in the path, not a password.
fn port_and_path(password: &str) -> bool {
    let digits = password.chars().take_while(char::is_ascii_digit).count();
    (1..=5).contains(&digits) && password[digits..].starts_with('/')
}

/// Whether the value of an assignment (`c[2]`, after separator `c[1]`) is a secret of at least
/// `min` characters. In quotes any value counts; unquoted it must not be an expression
/// (`other.password`, `read()`), and after a space it must not read as prose or a type
/// (`password: is required`, `password: String`), so there it needs 6 characters and a mix that
/// words lack. Right after the separator (`password=abc`) it may be short.
fn assigned(c: &Captures<'_>, min: usize) -> bool {
    let (separator, raw) = (&c[1], &c[2]);
    let quoted = raw.len() >= 2 && raw.starts_with(['"', '\'', '`']);
    let value = if quoted { &raw[1..raw.len() - 1] } else { raw };
    let chars = value.chars().count();
    if chars < min || path(value) {
        return false;
    }
    if quoted {
        return true;
    }
    if expression(value) {
        return false;
    }
    if !separator.ends_with([' ', '\t']) {
        return true;
    }
    let word = value.chars().all(char::is_alphabetic) && chars < 12;
    let typed = value.starts_with('&') || value.contains(['<', '>']);
    chars >= 6 && !word && !typed
}

/// A file name rather than a secret: `PWD=/home/me`, `secret=./key.pem`.
fn path(value: &str) -> bool {
    value.starts_with('/') || value.starts_with("~/") || value.starts_with("./") || value.starts_with("../")
}

/// Code rather than a literal: a call, or a dotted name like `other.password`.
fn expression(value: &str) -> bool {
    if value.contains(['(', ')']) {
        return true;
    }
    let parts: Vec<&str> = value.trim_end_matches([',', '.', ';']).split('.').collect();
    parts.len() > 1
        && parts.iter().all(|p| {
            p.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
                && p.chars().all(|c| c.is_alphanumeric() || c == '_')
        })
}

/// Values that only look like secrets: placeholders, variables, empty values and earlier markers.
fn placeholder(value: &str) -> bool {
    let v = value.trim_matches(|c| c == '"' || c == '\'' || c == '`');
    let lower = v.to_ascii_lowercase();
    v.is_empty()
        || v.starts_with(['$', '<', '{', '%', '*', '?', ':'])
        || v.starts_with("[REDACTED")
        || v.chars().all(|c| matches!(c, 'x' | 'X' | '*' | '.' | '•' | '#'))
        || ["changeme", "example", "redacted", "process.env", "os.environ", "os.getenv"]
            .iter()
            .any(|p| lower.starts_with(p))
        || ["password", "none", "null", "nil", "true", "false", "undefined", "required", "optional", "empty"]
            .contains(&lower.as_str())
}

/// Zero-width characters that can hide inside a token to split it from its shape.
const INVISIBLE: [char; 6] = ['\u{200B}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{FEFF}', '\u{00AD}'];

/// Invisible characters taken out of a text for scanning: each with the byte offset in what is
/// left where it stood, in order.
type Hidden = Vec<(usize, char)>;

/// Takes out the invisible characters that sit between two visible ASCII characters: there they
/// can only split a word (a token), while between emoji a zero-width joiner still joins them.
fn see_through_invisible(text: &str) -> (String, Hidden) {
    let mut hidden = Hidden::new();
    if !text.contains(INVISIBLE) {
        return (text.to_owned(), hidden);
    }
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    for (i, &c) in chars.iter().enumerate() {
        if INVISIBLE.contains(&c) {
            let before = out.chars().next_back();
            let after = chars[i + 1..].iter().find(|c| !INVISIBLE.contains(c));
            if before.is_some_and(|b| b.is_ascii_graphic()) && after.is_some_and(char::is_ascii_graphic) {
                hidden.push((out.len(), c));
                continue;
            }
        }
        out.push(c);
    }
    (out, hidden)
}

/// `text` with each span of `edits` (in order, apart) replaced, and the hidden characters moved
/// along: those inside a replaced span were part of the credential and go with it.
fn apply(text: &str, hidden: &[(usize, char)], edits: &[(std::ops::Range<usize>, String)]) -> (String, Hidden) {
    let mut out = String::with_capacity(text.len());
    let mut kept = Hidden::with_capacity(hidden.len());
    let mut hidden = hidden.iter().copied().peekable();
    let mut last = 0;
    for (span, replacement) in edits {
        while let Some((at, c)) = hidden.next_if(|&(at, _)| at <= span.start) {
            kept.push((out.len() + at - last, c));
        }
        while hidden.next_if(|&(at, _)| at < span.end).is_some() {}
        out.push_str(&text[last..span.start]);
        out.push_str(replacement);
        last = span.end;
    }
    kept.extend(hidden.map(|(at, c)| (out.len() + at - last, c)));
    out.push_str(&text[last..]);
    (out, kept)
}

/// `text` with the hidden characters back where they stood.
fn restore(text: &str, hidden: &[(usize, char)]) -> String {
    let mut out = String::with_capacity(text.len() + hidden.len() * 3);
    let mut last = 0;
    for &(at, c) in hidden {
        out.push_str(&text[last..at]);
        out.push(c);
        last = at;
    }
    out.push_str(&text[last..]);
    out
}

/// Replaces every credential in `body` and counts them by kind. Invisible characters that split a
/// credential do not hide it (it is looked for without them, and they go with it); everywhere else
/// they stay, for readers to see that something was there (they are shown as `[U+200B]`).
pub fn redact(body: &str) -> Redacted {
    let (mut text, mut hidden) = see_through_invisible(body);
    let mut counts = Counts::new();
    for rule in RULES.iter() {
        if !rule.pattern.is_match(&text) {
            continue;
        }
        let mut edits = Vec::new();
        for caps in rule.pattern.captures_iter(&text) {
            let Some(secret) = caps.get(rule.group) else { continue };
            if (rule.group != 0 && placeholder(secret.as_str())) || !(rule.accept)(&caps) {
                continue;
            }
            edits.push((secret.range(), format!("[REDACTED:{}]", rule.kind)));
        }
        if !edits.is_empty() {
            *counts.entry(rule.kind).or_insert(0) += edits.len() as u32;
            (text, hidden) = apply(&text, &hidden, &edits);
        }
    }
    Redacted { text: RedactedText(restore(&text, &hidden)), counts }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real-looking samples (none of them live credentials), what must come out, and the kinds found.
    fn secrets() -> Vec<(String, String, Vec<&'static str>)> {
        let hex40 = "0123456789abcdef0123456789abcdef01234567";
        let anthropic = format!("sk-ant-api03-{}AA", "Zx9_Qw8-Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz".repeat(3)[..93].to_owned());
        let owned = |input: &str, expected: &str, kinds: &[&'static str]| {
            (input.to_owned(), expected.to_owned(), kinds.to_vec())
        };
        vec![
            owned(
                "key:\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\nAAAAAAABAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----\nthanks",
                "key:\n[REDACTED:private-key]\nthanks",
                &["private-key"],
            ),
            owned(
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq\n(truncated)",
                "[REDACTED:private-key]",
                &["private-key"],
            ),
            owned(
                "export AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE",
                "export AWS_ACCESS_KEY_ID=[REDACTED:aws-access-key]",
                &["aws-access-key"],
            ),
            owned(
                "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                "aws_secret_access_key = [REDACTED:aws-secret-key]",
                &["aws-secret-key"],
            ),
            owned(
                r#"{"AccessKeyId": "ASIAIOSFODNN7EXAMPLE", "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}"#,
                r#"{"AccessKeyId": "[REDACTED:aws-access-key]", "SecretAccessKey": "[REDACTED:aws-secret-key]"}"#,
                &["aws-access-key", "aws-secret-key"],
            ),
            owned(
                "use ghp_1234567890abcdefghijklmnopqrstuvwxyzAB to push",
                "use [REDACTED:github-token] to push",
                &["github-token"],
            ),
            owned(
                "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789",
                "[REDACTED:github-token]",
                &["github-token"],
            ),
            // Split by a zero-width space, which a model or a terminal never shows.
            owned(
                "use ghp_1234567890abcdef\u{200B}ghijklmnopqrstuvwxyzAB to push",
                "use [REDACTED:github-token] to push",
                &["github-token"],
            ),
            owned(
                "ghp_1234567890\u{2060}abcdefghij\u{FEFF}klmnopqrstuvwxyz\u{200D}AB",
                "[REDACTED:github-token]",
                &["github-token"],
            ),
            owned(&format!("github_token: {hex40}"), "github_token: [REDACTED:github-token]", &["github-token"]),
            owned(&format!("export GH_TOKEN={hex40}"), "export GH_TOKEN=[REDACTED:github-token]", &["github-token"]),
            owned(
                &format!("my GitHub token {hex40} expires"),
                "my GitHub token [REDACTED:github-token] expires",
                &["github-token"],
            ),
            owned(
                "GITLAB_TOKEN: glpat-xYz12345678901234567",
                "GITLAB_TOKEN: [REDACTED:gitlab-token]",
                &["gitlab-token"],
            ),
            owned(
                "bot token xoxb-123456789012-1234567890123-AbCdEfGhIjKl",
                "bot token [REDACTED:slack-token]",
                &["slack-token"],
            ),
            owned(
                "SLACK_APP_TOKEN=xapp-1-A0123456789-1234567890123-0123456789abcdef0123456789abcdef",
                "SLACK_APP_TOKEN=[REDACTED:slack-token]",
                &["slack-token"],
            ),
            owned(
                "post to https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX now",
                "post to [REDACTED:slack-webhook] now",
                &["slack-webhook"],
            ),
            owned(
                "cookie eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
                "cookie [REDACTED:jwt]",
                &["jwt"],
            ),
            owned(
                "curl -H 'Authorization: Bearer 9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c'",
                "curl -H 'Authorization: Bearer [REDACTED:bearer-token]'",
                &["bearer-token"],
            ),
            owned(
                "OPENAI_API_KEY=sk-proj-4fT9xQ2mLp8RzK1vW7nYb3HcJd6EaGu0",
                "OPENAI_API_KEY=[REDACTED:openai-key]",
                &["openai-key"],
            ),
            owned(
                "key 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 works",
                "key [REDACTED:openai-key] works",
                &["openai-key"],
            ),
            owned(
                &format!("ANTHROPIC_API_KEY=\"{anthropic}\""),
                "ANTHROPIC_API_KEY=\"[REDACTED:anthropic-key]\"",
                &["anthropic-key"],
            ),
            owned(
                "stripe.api_key = 'sk_live_4eC39HqLyjWDarjtT1zdp7dc'",
                "stripe.api_key = '[REDACTED:stripe-key]'",
                &["stripe-key"],
            ),
            owned(
                "maps key AIzaSyA1b2C3d4E5f6G7h8I9j0K_lMnOpQrStUv in the app",
                "maps key [REDACTED:google-api-key] in the app",
                &["google-api-key"],
            ),
            owned("db password=hunter2hunter2 ok", "db password=[REDACTED:password] ok", &["password"]),
            owned("DB_PASSWORD=hunter2", "DB_PASSWORD=[REDACTED:password]", &["password"]),
            owned("export PGPASSWORD=s3cr3t!", "export PGPASSWORD=[REDACTED:password]", &["password"]),
            owned("password=abc12", "password=[REDACTED:password]", &["password"]),
            owned(r#"{"password": "pw1"}"#, r#"{"password": [REDACTED:password]}"#, &["password"]),
            owned("redis: password: Tr0ub4dor&3", "redis: password: [REDACTED:password]", &["password"]),
            owned(r#"{"api_key": "sk-live-abcdef123456"}"#, r#"{"api_key": [REDACTED:secret]}"#, &["secret"]),
            owned("CLIENT_SECRET=Zm9vYmFyYmF6cXV4", "CLIENT_SECRET=[REDACTED:secret]", &["secret"]),
            owned("x-api-key: Zm9vYmFyYmF6cXV4", "x-api-key: [REDACTED:secret]", &["secret"]),
            owned(
                "redis://:hunter2@localhost:6379/0",
                "redis://:[REDACTED:connection-password]@localhost:6379/0",
                &["connection-password"],
            ),
            owned(
                "DATABASE_URL=postgres://app:s3cr3t-pw@db.internal:5432/app",
                "DATABASE_URL=postgres://app:[REDACTED:connection-password]@db.internal:5432/app",
                &["connection-password"],
            ),
            owned(
                "postgres://u:p@ss/w!rd@host/db",
                "postgres://u:[REDACTED:connection-password]@host/db",
                &["connection-password"],
            ),
            owned(
                "git clone https://deploy:pa/ss@git.example.com/app.git",
                "git clone https://deploy:[REDACTED:connection-password]@git.example.com/app.git",
                &["connection-password"],
            ),
            owned(
                "mysql://root:Secr3t!@localhost:3306/app",
                "mysql://root:[REDACTED:connection-password]@localhost:3306/app",
                &["connection-password"],
            ),
            owned(
                "token rlm_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "token [REDACTED:relay-token]",
                &["relay-token"],
            ),
        ]
    }

    /// Look-alikes that must pass untouched.
    const HARMLESS: &[&str] = &[
        "the password field is empty",
        "please reset your password: the old one expired",
        "the password: is required",
        "passwords must be 12 characters long",
        "the secret: nobody knows",
        "password: <your password here>",
        "password=$DB_PASSWORD",
        "set api_key = ${API_KEY} in the env",
        "token = xxxxxxxx",
        "password: changeme (the default)",
        "pub password: String,",
        "password: string;",
        "if password == other.password {",
        "let password = read_password()?;",
        "max_tokens=4096 and token_count=12",
        "PWD=/home/me/project",
        "DB_PASSWORD_FILE=/run/secrets/db",
        "https://example.com:8443/path is up",
        "https://registry.npmjs.org:443/@scope/pkg",
        "postgres://app@db.internal/app has no password",
        "ssh://git@github.com/org/repo.git and mail bob@example.com",
        "AKIA is how AWS key ids start",
        "ghp_ tokens are 40 characters long",
        "AIza is how a Google API key starts",
        "use sk-learn or the task-runner-for-everything-you-need",
        "eyJhbGciOi is how a JWT header begins",
        "bearer of bad news",
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8A\n-----END PUBLIC KEY-----",
        "request 9f8a7b6c5d4e3f2a1b0c failed",
        "commit 4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a fixed it",
        "GitHub commit 4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a fixed it",
        "GITHUB_SHA=4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a",
        "card 123e4567-e89b-12d3-a456-426614174000 ran",
        "image@sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "fn password_hash(input: &str) -> String",
        "family 👨\u{200D}👩\u{200D}👧 stays joined",
    ];

    #[test]
    fn secrets_are_replaced_by_their_kind() {
        for (input, expected, kinds) in secrets() {
            let out = redact(&input);
            assert_eq!(out.text.as_str(), expected, "{input}");
            let found: Vec<&str> = out.counts.keys().copied().collect();
            assert_eq!(found, kinds, "{input}: {:?}", out.counts);
            assert_eq!(out.total() as usize, kinds.len(), "{input}: {:?}", out.counts);
        }
    }

    #[test]
    fn look_alikes_are_left_alone() {
        for input in HARMLESS {
            let out = redact(input);
            assert_eq!(out.text.as_str(), *input);
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
        assert!(!out.text.as_str().contains("ghp_1") && !out.text.as_str().contains("AKIA"));
        assert_eq!(redact(out.text.as_str()).total(), 0, "markers are not redacted again");
    }

    #[test]
    fn invisible_characters_outside_a_credential_are_kept_for_readers_to_see() {
        for text in ["a\u{200B}b", "pass\u{200B}word=x is how it reads", "x\u{2060}y\u{FEFF}z and ok"] {
            assert_eq!(redact(text).text.as_str(), text, "nothing redacted, nothing taken out");
        }
        // Around a credential they stay; inside it they go with it.
        let out = redact("x\u{200B}y ghp_1234567890abcdef\u{200B}ghijklmnopqrstuvwxyzAB z\u{200B}z ok\u{2060}k");
        assert_eq!(out.text.as_str(), "x\u{200B}y [REDACTED:github-token] z\u{200B}z ok\u{2060}k");
        let out =
            redact("a\u{200B}b AKIAIOSFODNN7EXAMPLE c\u{200D}d ghp_1234567890abcdefghijklmnopqrstuvwxyzAB e\u{FEFF}f");
        assert_eq!(
            out.text.as_str(),
            "a\u{200B}b [REDACTED:aws-access-key] c\u{200D}d [REDACTED:github-token] e\u{FEFF}f",
            "hidden characters follow the text through several rules' edits"
        );
    }

    #[test]
    fn cutting_redacted_text_keeps_whole_characters() {
        let text = RedactedText::from_agent("héllo password=abc12");
        assert_eq!(text.as_str(), "héllo password=[REDACTED:password]");
        assert_eq!(text.clone().truncated(2).as_str(), "h…");
        assert_eq!(text.clone().truncated(1000), text);
    }
}
