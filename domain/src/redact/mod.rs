//! Credential redaction: every piece of text an agent (or a person) hands the server passes through
//! here before it is stored, so a secret pasted into a message, a card, a note or an error reaches
//! neither another agent nor the database. Each find is replaced by `[REDACTED:<kind>]`, and the
//! writer can be told how many of which kinds.
//!
//! The store takes such text only as a [`RedactedText`], which nothing but [`redact`] makes: a new
//! write path that forgets to redact does not compile.
//!
//! What is looked for is data, in [`rules`]. Wrapping a credential does not hide it: the rules
//! read the text with escapes decoded (`%5F`, `\u005f`, `\x5f`, `&#95;`, `\/`, `\"`) and with the
//! invisible characters that split a word left out, and what they find is replaced in the text as
//! written, escapes and all.

#[cfg(test)]
mod corpus;
mod gitleaks;
mod rules;
#[cfg(test)]
mod shapes;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::LazyLock;

use aho_corasick::AhoCorasick;
use regex::Regex;

use gitleaks::Vendored;
use rules::{OWN_SHAPES, OWN_TOKENS, Rule, placeholder};

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

/// Whether `text` holds anything the redactor would replace: for identifiers that must stay as
/// written (thread ids, client ids, paths), which are refused rather than changed.
pub fn holds_credential(text: &str) -> Option<Vec<&'static str>> {
    let found = redact(text);
    (found.total() > 0).then(|| found.counts.into_keys().collect())
}

/// One way of finding a secret: one of Relay's own rules, or one of gitleaks'.
enum Detector {
    Own(&'static Rule, Regex),
    Vendored(Vendored),
}

impl Detector {
    fn keywords(&self) -> Vec<&str> {
        match self {
            Self::Own(rule, _) => rule.keywords.to_vec(),
            Self::Vendored(rule) => rule.keywords.iter().map(String::as_str).collect(),
        }
    }

    /// Whether it is tried only where one of its keywords is.
    fn gated(&self) -> bool {
        match self {
            Self::Own(rule, _) => !rule.keywords.is_empty(),
            Self::Vendored(rule) => !rule.keywords.is_empty(),
        }
    }
}

/// Every detector in the order they claim spans, and one automaton for all their keywords.
struct Compiled {
    detectors: Vec<Detector>,
    keywords: AhoCorasick,
    /// For each keyword of `keywords`, the detector it belongs to.
    keyword_rule: Vec<usize>,
    /// gitleaks' global allowlist.
    allowed: Vec<gitleaks::Allow>,
}

static COMPILED: LazyLock<Compiled> = LazyLock::new(|| {
    // Word boundaries in ASCII: a Unicode one would send the regex engine to its slow path on
    // any text with a non-ASCII character in it.
    let own = |rule: &'static Rule| {
        Detector::Own(
            rule,
            Regex::new(&rule.pattern.replace(r"\b", r"(?-u:\b)")).expect("redaction patterns are valid"),
        )
    };
    let (vendored, allowed) = gitleaks::load();
    // Relay's own token shapes first, then gitleaks' token rules; its rules of context (a generic
    // assignment, a curl command line) after Relay's, so a known token is named by its kind
    // wherever it stands.
    let (generic, specific): (Vec<_>, Vec<_>) =
        vendored.into_iter().partition(|rule| rule.id.starts_with("generic") || rule.id.starts_with("curl-"));
    let detectors: Vec<Detector> = OWN_TOKENS
        .iter()
        .map(own)
        .chain(specific.into_iter().map(Detector::Vendored))
        .chain(OWN_SHAPES.iter().map(own))
        .chain(generic.into_iter().map(Detector::Vendored))
        .collect();
    let (mut words, mut keyword_rule) = (Vec::new(), Vec::new());
    for (at, detector) in detectors.iter().enumerate() {
        for word in detector.keywords() {
            words.push(word.to_owned());
            keyword_rule.push(at);
        }
    }
    let keywords = AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .build(&words)
        .expect("redaction keywords build an automaton");
    Compiled { detectors, keywords, keyword_rule, allowed }
});

/// Compiles the rules (some 250 regexes, a tenth of a second), so no write waits for it.
pub fn prepare() {
    LazyLock::force(&COMPILED);
}

/// Zero-width characters that can hide inside a token to split it from its shape.
const INVISIBLE: [char; 6] = ['\u{200B}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{FEFF}', '\u{00AD}'];

/// The text as the rules read it, and where each of its bytes came from in the text as written.
struct View<'a> {
    text: Cow<'a, str>,
    /// For each byte of `text`, the span of the written text it was read from; empty when `text`
    /// is the written text itself.
    origin: Vec<(u32, u32)>,
}

impl<'a> View<'a> {
    /// Decodes the escapes a credential may hide behind and leaves out the invisible characters
    /// that sit between two visible ASCII characters: there they can only split a word (a token),
    /// while between emoji a zero-width joiner still joins them.
    fn of(written: &'a str) -> Self {
        let escaped = written.bytes().any(|b| matches!(b, b'%' | b'\\' | b'&')) || written.contains(INVISIBLE);
        if !escaped {
            return Self { text: Cow::Borrowed(written), origin: Vec::new() };
        }
        let mut text = String::with_capacity(written.len());
        let mut origin = Vec::with_capacity(written.len());
        let mut at = 0;
        while at < written.len() {
            let rest = &written[at..];
            let c = rest.chars().next().expect("not at the end");
            if let Some((decoded, len)) = escape(rest) {
                text.push(decoded);
                origin.push((at as u32, (at + len) as u32));
                at += len;
                continue;
            }
            if INVISIBLE.contains(&c) {
                let before = text.chars().next_back();
                let after = written[at..].chars().find(|c| !INVISIBLE.contains(c));
                if before.is_some_and(|b| b.is_ascii_graphic()) && after.is_some_and(|a| a.is_ascii_graphic()) {
                    at += c.len_utf8();
                    continue;
                }
            }
            text.push(c);
            let span = (at as u32, (at + c.len_utf8()) as u32);
            origin.extend(std::iter::repeat_n(span, c.len_utf8()));
            at += c.len_utf8();
        }
        Self { text: Cow::Owned(text), origin }
    }

    /// The span of the written text that `span` of the view was read from.
    fn written(&self, span: Range<usize>) -> Range<usize> {
        if self.origin.is_empty() {
            return span;
        }
        self.origin[span.start].0 as usize..self.origin[span.end - 1].1 as usize
    }
}

/// The visible ASCII character an escape at the start of `s` stands for, and the escape's
/// length: `%5F`, `\u005f`, `\x5f`, `&#95;`, `&#x5f;`, `&quot;`, `\/` and `\"`.
fn escape(s: &str) -> Option<(char, usize)> {
    let hex = |digits: &str| u32::from_str_radix(digits, 16).ok();
    let (value, len) = match s.as_bytes() {
        [b'%', a, b, ..] if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => (hex(&s[1..3])?, 3),
        [b'\\', b'u', ..] if s.len() >= 6 && s.as_bytes()[2..6].iter().all(u8::is_ascii_hexdigit) => {
            (hex(&s[2..6])?, 6)
        }
        [b'\\', b'x', a, b, ..] if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => (hex(&s[2..4])?, 4),
        [b'\\', b'/', ..] => ('/' as u32, 2),
        [b'\\', b'"', ..] => ('"' as u32, 2),
        [b'&', b'#', ..] => {
            let end = s.as_bytes().iter().take(10).position(|&b| b == b';')?;
            let number = &s[2..end];
            let value = match number.strip_prefix(['x', 'X']) {
                Some(digits) => hex(digits)?,
                None => number.parse().ok()?,
            };
            (value, end + 1)
        }
        _ if s.starts_with("&quot;") => ('"' as u32, 6),
        _ => return None,
    };
    let c = char::from_u32(value)?;
    c.is_ascii_graphic().then_some((c, len))
}

/// Replaces every credential in `body` and counts them by kind. A credential behind escapes or
/// split by invisible characters is found all the same and replaced whole, escapes and invisible
/// characters with it; everywhere else the text stays as written (invisible characters are shown
/// to readers as `[U+200B]`).
pub fn redact(body: &str) -> Redacted {
    let view = View::of(body);
    let compiled = &*COMPILED;
    let mut tried = vec![false; compiled.detectors.len()];
    for found in compiled.keywords.find_overlapping_iter(view.text.as_ref()) {
        tried[compiled.keyword_rule[found.pattern().as_usize()]] = true;
    }
    // Spans of the view, each claimed by the first detector that found it.
    let mut claimed: Vec<(Range<usize>, &'static str)> = Vec::new();
    for (at, detector) in compiled.detectors.iter().enumerate() {
        if detector.gated() && !tried[at] {
            continue;
        }
        let (regex, kind) = match detector {
            Detector::Own(rule, regex) => (regex, rule.kind),
            Detector::Vendored(rule) => (&rule.regex, rule.id),
        };
        for caps in regex.captures_iter(&view.text) {
            let secret = match detector {
                Detector::Own(rule, _) => {
                    let Some(secret) = caps.get(rule.group).filter(|s| !s.is_empty()) else { continue };
                    if (rule.group != 0 && placeholder(secret.as_str())) || !rule.check.accepts(&caps, secret.as_str())
                    {
                        continue;
                    }
                    secret
                }
                Detector::Vendored(rule) => {
                    let Some(secret) = vendored_secret(rule, &caps, &view.text, compiled) else { continue };
                    secret
                }
            };
            let span = secret.range();
            if claimed.iter().any(|(taken, _)| taken.start < span.end && span.start < taken.end) {
                continue;
            }
            claimed.push((span, kind));
        }
    }
    let mut counts = Counts::new();
    if claimed.is_empty() {
        return Redacted { text: RedactedText(body.to_owned()), counts };
    }
    claimed.sort_by_key(|(span, _)| span.start);
    let mut text = String::with_capacity(body.len());
    let mut last = 0;
    for (span, kind) in claimed {
        let written = view.written(span);
        text.push_str(&body[last..written.start]);
        text.push_str(&format!("[REDACTED:{kind}]"));
        last = written.end;
        *counts.entry(kind).or_insert(0) += 1;
    }
    text.push_str(&body[last..]);
    Redacted { text: RedactedText(text), counts }
}

/// The secret of a gitleaks rule's match, unless its entropy or an allowlist lets it pass.
fn vendored_secret<'t>(
    rule: &Vendored,
    caps: &regex::Captures<'t>,
    text: &'t str,
    compiled: &Compiled,
) -> Option<regex::Match<'t>> {
    let whole = caps.get(0)?;
    let secret = match rule.group {
        Some(group) => caps.get(group)?,
        None => (1..caps.len()).find_map(|g| caps.get(g).filter(|m| !m.is_empty())).unwrap_or(whole),
    };
    if secret.is_empty() || secret.as_str().starts_with("[REDACTED") || !rule.random_enough(secret.as_str()) {
        return None;
    }
    let line_start = text[..whole.start()].rfind('\n').map_or(0, |at| at + 1);
    let line_end = text[whole.end()..].find('\n').map_or(text.len(), |at| whole.end() + at);
    let finding =
        gitleaks::Finding { secret: secret.as_str(), matched: whole.as_str(), line: &text[line_start..line_end] };
    if compiled.allowed.iter().chain(&rule.allow).any(|allow| allow.allows(&finding)) {
        return None;
    }
    Some(secret)
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
                "export AWS_ACCESS_KEY_ID=AKIAZ3MXQ7RTWK5NV2HB",
                "export AWS_ACCESS_KEY_ID=[REDACTED:aws-access-token]",
                &["aws-access-token"],
            ),
            owned(
                "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                "aws_secret_access_key = [REDACTED:aws-secret-key]",
                &["aws-secret-key"],
            ),
            owned(
                r#"{"AccessKeyId": "ASIAQ4TZ2XW7NRB3KV6M", "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}"#,
                r#"{"AccessKeyId": "[REDACTED:aws-access-token]", "SecretAccessKey": "[REDACTED:aws-secret-key]"}"#,
                &["aws-access-token", "aws-secret-key"],
            ),
            owned(
                "use ghp_8pQz3LmW1xKc7RtY5nV2bJ0dF9gH4sA6eUoT to push",
                "use [REDACTED:github-pat] to push",
                &["github-pat"],
            ),
            owned(
                "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",
                "[REDACTED:github-fine-grained-pat]",
                &["github-fine-grained-pat"],
            ),
            // Split by a zero-width space, which a model or a terminal never shows.
            owned(
                "use ghp_8pQz3LmW1xKc7RtY\u{200B}5nV2bJ0dF9gH4sA6eUoT to push",
                "use [REDACTED:github-pat] to push",
                &["github-pat"],
            ),
            owned(
                "ghp_8pQz3LmW1x\u{2060}Kc7RtY5nV2\u{FEFF}bJ0dF9gH4sA6eU\u{200D}oT",
                "[REDACTED:github-pat]",
                &["github-pat"],
            ),
            owned(&format!("github_token: {hex40}"), "github_token: [REDACTED:github-token]", &["github-token"]),
            owned(&format!("export GH_TOKEN={hex40}"), "export GH_TOKEN=[REDACTED:github-token]", &["github-token"]),
            owned(
                &format!("my GitHub token {hex40} expires"),
                "my GitHub token [REDACTED:github-token] expires",
                &["github-token"],
            ),
            owned("GITLAB_TOKEN: glpat-xYz12345678901234567", "GITLAB_TOKEN: [REDACTED:gitlab-pat]", &["gitlab-pat"]),
            owned(
                "bot token xoxb-123456789012-1234567890123-AbCdEfGhIjKl",
                "bot token [REDACTED:slack-bot-token]",
                &["slack-bot-token"],
            ),
            owned(
                "SLACK_APP_TOKEN=xapp-1-A0123456789-1234567890123-0123456789abcdef0123456789abcdef",
                "SLACK_APP_TOKEN=[REDACTED:slack-app-token]",
                &["slack-app-token"],
            ),
            owned(
                "post to https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX now",
                "post to [REDACTED:slack-webhook-url] now",
                &["slack-webhook-url"],
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
                "key [REDACTED:openai-api-key] works",
                &["openai-api-key"],
            ),
            owned(
                &format!("ANTHROPIC_API_KEY=\"{anthropic}\""),
                "ANTHROPIC_API_KEY=\"[REDACTED:anthropic-api-key]\"",
                &["anthropic-api-key"],
            ),
            owned(
                "stripe.api_key = 'sk_live_4eC39HqLyjWDarjtT1zdp7dc'",
                "stripe.api_key = '[REDACTED:stripe-access-token]'",
                &["stripe-access-token"],
            ),
            owned(
                "maps key AIzaSyA1b2C3d4E5f6G7h8I9j0K_lMnOpQrStUv in the app",
                "maps key [REDACTED:gcp-api-key] in the app",
                &["gcp-api-key"],
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
    fn a_token_ending_a_sentence_or_a_bracket_is_caught() {
        for text in [
            "(sk_live_4eC39HqLyjWDarjtT1zdp7dc)",
            "use sk_live_4eC39HqLyjWDarjtT1zdp7dc, then retry",
            "the npm token is npm_hp66GcdqlXwvlvAFJ9B17HGQaZOyeuS7PsFG.",
            "[pul-e5fb6e18c48e05b509daa9aadece4ff545782d93]",
            "key: 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).",
        ] {
            let out = redact(text);
            assert_eq!(out.total(), 1, "{text}: {:?}", out.text);
        }
    }

    #[test]
    fn several_spans_are_counted() {
        let out = redact(
            "a ghp_8pQz3LmW1xKc7RtY5nV2bJ0dF9gH4sA6eUoT b ghp_Zr4Kd9Wq2Ly7Hx1Nc6Vb3Mt8Gf5Js0Pa2QeR c AKIAZ3MXQ7RTWK5NV2HB",
        );
        assert_eq!(out.counts.get("github-pat"), Some(&2));
        assert_eq!(out.counts.get("aws-access-token"), Some(&1));
        assert!(!out.text.as_str().contains("ghp_8") && !out.text.as_str().contains("AKIA"));
        assert_eq!(redact(out.text.as_str()).total(), 0, "markers are not redacted again");
    }

    #[test]
    fn invisible_characters_outside_a_credential_are_kept_for_readers_to_see() {
        for text in ["a\u{200B}b", "pass\u{200B}word=x is how it reads", "x\u{2060}y\u{FEFF}z and ok"] {
            assert_eq!(redact(text).text.as_str(), text, "nothing redacted, nothing taken out");
        }
        // Around a credential they stay; inside it they go with it.
        let out = redact("x\u{200B}y ghp_8pQz3LmW1xKc7RtY\u{200B}5nV2bJ0dF9gH4sA6eUoT z\u{200B}z ok\u{2060}k");
        assert_eq!(out.text.as_str(), "x\u{200B}y [REDACTED:github-pat] z\u{200B}z ok\u{2060}k");
        let out =
            redact("a\u{200B}b AKIAZ3MXQ7RTWK5NV2HB c\u{200D}d ghp_8pQz3LmW1xKc7RtY5nV2bJ0dF9gH4sA6eUoT e\u{FEFF}f");
        assert_eq!(
            out.text.as_str(),
            "a\u{200B}b [REDACTED:aws-access-token] c\u{200D}d [REDACTED:github-pat] e\u{FEFF}f",
            "hidden characters follow the text through several rules' edits"
        );
    }

    #[test]
    fn relay_tokens_of_every_kind_are_caught() {
        use crate::ids::{TokenKind, new_token};
        let kinds = [
            TokenKind::Machine,
            TokenKind::Session,
            TokenKind::Human,
            TokenKind::SpawnGrant,
            TokenKind::JobToken,
            TokenKind::Console,
        ];
        for kind in kinds {
            let token = new_token(kind);
            let out = redact(&format!("the token is {token}."));
            assert_eq!(out.text.as_str(), "the token is [REDACTED:relay-token].", "{token}");
        }
        // A kind added later is caught by its shape: `rl`, a letter, `_`, 64 hex digits.
        assert_eq!(redact(&format!("rlz_{}", "0a".repeat(32))).text.as_str(), "[REDACTED:relay-token]");
    }

    #[test]
    fn escapes_hide_nothing_and_stay_where_nothing_was_found() {
        let token = "ghp_8pQz3LmW1xKc7RtY5nV2bJ0dF9gH4sA6eUoT";
        for wrapped in [
            token.replacen('_', "%5F", 1),
            token.replacen('_', r"\u005f", 1),
            token.replacen('_', r"\x5f", 1),
            token.replacen('_', "&#95;", 1),
            token.replacen('_', "&#x5F;", 1),
        ] {
            assert_eq!(
                redact(&format!("a%20b {wrapped} c&amp;d")).text.as_str(),
                "a%20b [REDACTED:github-pat] c&amp;d"
            );
        }
        for text in ["100%25 done", r#"{\"path\": \"C:\\temp\"}"#, "a &#38; b", r"\u00e9t\u00e9"] {
            assert_eq!(redact(text).text.as_str(), text, "nothing found, nothing changed");
        }
    }

    #[test]
    fn cutting_redacted_text_keeps_whole_characters() {
        let text = RedactedText::from_agent("héllo password=abc12");
        assert_eq!(text.as_str(), "héllo password=[REDACTED:password]");
        assert_eq!(text.clone().truncated(2).as_str(), "h…");
        assert_eq!(text.clone().truncated(1000), text);
    }
}
