//! Relay's own rules, as data: its tokens, and the shapes agents paste that gitleaks' rule set
//! (`gitleaks.rs`, tried between the two tables here) does not cover: secrets known by their name
//! or their place rather than a prefix (AWS secret keys, Azure storage keys and SAS signatures,
//! passwords in connection strings, command lines and assignments), and the prefixed tokens of
//! services it has no rule for. Each rule names its kind (what the marker says), the words one of
//! which a text must hold for its pattern to be tried, the pattern, the capture group holding the
//! secret, and a check for what a pattern cannot say.
//!
//! Where two rules find overlapping spans the earlier wins, so a known token inside an assignment
//! is named by its kind.

use regex::Captures;

pub(super) struct Rule {
    pub kind: &'static str,
    /// Words (matched ignoring ASCII case), one of which a text must hold for the pattern to be
    /// tried: most text holds none, and one pass for every rule's words is far cheaper than
    /// every pattern. Empty: always tried.
    pub keywords: &'static [&'static str],
    pub pattern: &'static str,
    /// The capture group holding the secret; 0 is the whole match.
    pub group: usize,
    pub check: Check,
}

/// What decides that a match is a secret after all.
#[derive(Clone, Copy, Debug)]
pub(super) enum Check {
    /// Every match is one.
    Always,
    /// Letters and digits mixed after the prefix, as generated keys are: `sk-` followed by words
    /// is not a key.
    Mixed,
    /// A connection string's password, unless it is `host:8443/path@…`: a port and a path
    /// before an `@` in the path.
    NotPortAndPath,
    /// The value of a `name = value` assignment (group 1 the separator, group 2 the value), of at
    /// least this many characters; see [`assigned`].
    Assigned(usize),
    /// Base64 of a PEM block that holds a private key.
    Base64PrivateKey,
    /// Base64 of `user:password`.
    Base64Credentials,
}

const fn rule(kind: &'static str, keywords: &'static [&'static str], pattern: &'static str) -> Rule {
    Rule { kind, keywords, pattern, group: 0, check: Check::Always }
}

const fn group(kind: &'static str, keywords: &'static [&'static str], pattern: &'static str, group: usize) -> Rule {
    Rule { kind, keywords, pattern, group, check: Check::Always }
}

const fn checked(kind: &'static str, keywords: &'static [&'static str], pattern: &'static str, check: Check) -> Rule {
    Rule { kind, keywords, pattern, group: 0, check }
}

/// `name = value` where the name ends in one of the alternatives: `DB_PASSWORD=…`,
/// `"api_key": "…"`, `export PGPASSWORD=…`. The name may carry any prefix but must end at the
/// word, so `password_file` or `max_tokens` are not secrets. Group 1 is the separator with its
/// spaces, group 2 the value (quotes included).
macro_rules! assignment {
    ($names:literal) => {
        concat!(
            r#"(?i)\b[\w.-]{0,40}?(?:"#,
            $names,
            r#")["'`]?([ \t]*(?:=>|==?|:=?)[ \t]*)("[^"\n]*"|'[^'\n]*'|`[^`\n]*`|[^\s"'`,;]+)"#
        )
    };
}

pub(super) const OWN_TOKENS: &[Rule] = &[
    // Keys, as PEM blocks (a block cut short still counts) and as base64 of one (kubeconfig's
    // `client-key-data`).
    rule(
        "private-key",
        &["private key"],
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?s:.*?)(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\z)",
    ),
    checked("private-key", &["ls0tls1crudjti"], r"\bLS0tLS1CRUdJTi[A-Za-z0-9+/]{20,}={0,2}", Check::Base64PrivateKey),
    // Relay's own, of every kind: `rl` and a letter.
    rule("relay-token", &["rl"], r"\brl[a-z]_[0-9a-f]{64}\b"),
    // The secret has no prefix: it is known by its name, `aws…secret…` or AWS JSON's `SecretAccessKey`.
    group(
        "aws-secret-key",
        &["aws", "secretaccesskey", "secret_access_key"],
        r#"(?i)(?:aws.{0,20}?(?:secret|private)|secret_?access_?key).{0,20}?["']?\s*[:=]\s*["']?([A-Za-z0-9/+=]{40})(?:[^A-Za-z0-9/+=]|$)"#,
        1,
    ),
    rule("google-oauth", &["gocspx-", "ya29."], r"\b(?:GOCSPX-[A-Za-z0-9_-]{28}|ya29\.[A-Za-z0-9_-]{30,})"),
    group("azure-storage-key", &["accountkey="], r"(?i)\bAccountKey=([A-Za-z0-9+/]{86}==)", 1),
    group("azure-sas", &["sig="], r"[?&]sig=([A-Za-z0-9%+/=]{30,})", 1),
    rule("heroku-key", &["hrku-"], r"\bHRKU-[A-Za-z0-9_-]{60}"),
    rule("supabase-token", &["sbp_"], r"\bsbp_[a-f0-9]{40}\b"),
    // A classic token is 40 hex digits, like a commit hash: only a name saying GitHub and token
    // (or key, secret, …) right before it makes it one.
    group(
        "github-token",
        &["gh", "github"],
        r#"(?i-u)(?:\b(?:[\w.-]{0,30}?[_.-])?gh|\b[\w.-]{0,30}?github)[\w .-]{0,20}?(?:token|pat|secret|key|auth|oauth|password|credentials?)[\w.-]{0,10}?["']?[ \t]*(?:=>|[:=])?[ \t]*["']?([0-9a-f]{40})\b"#,
        1,
    ),
    rule("docker-token", &["dckr_"], r"\bdckr_(?:pat|oat)_[A-Za-z0-9_-]{20,}"),
    rule("nuget-key", &["oy2"], r"\boy2[a-z0-9]{43}\b"),
    rule(
        "discord-webhook",
        &["discord"],
        r"https://(?:(?:ptb|canary)\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_-]{50,}",
    ),
    // A bot token's shape is its own, but looked for only where Discord is named.
    rule("discord-token", &["discord"], r"\b[MNO][A-Za-z0-9_-]{23,27}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,40}\b"),
    group("telegram-token", &[":aa"], r"\b(\d{8,10}:AA[A-Za-z0-9_-]{33})(?:[^A-Za-z0-9_-]|$)", 1),
    // Payments.
    rule("stripe-webhook-secret", &["whsec_"], r"\bwhsec_[A-Za-z0-9+/=]{24,}"),
    rule("braintree-token", &["access_token$production"], r"\baccess_token\$production\$[0-9a-z]{16}\$[0-9a-f]{32}"),
    rule("mailgun-key", &["key-"], r"\bkey-[0-9a-f]{32}\b"),
    rule("mailchimp-key", &["-us"], r"\b[0-9a-f]{32}-us\d{1,2}\b"),
    rule("newrelic-key", &["nrak-", "nrjs-", "nrii-"], r"\bNR(?:AK|JS|II)-[A-Za-z0-9]{19,32}\b"),
    rule("sentry-token", &["sntrys_", "sntryu_"], r"\bsntr(?:ys|yu)_[A-Za-z0-9+/=_-]{40,}"),
    rule("facebook-token", &["eaa"], r"\bEAA[A-Za-z0-9]{90,}"),
    rule("twitter-token", &["aaaaaaaaaaaaaaaaaaaaaa"], r"\bA{22}[A-Za-z0-9%=]{60,}"),
    rule("mapbox-token", &["sk.eyj"], r"\bsk\.eyJ[A-Za-z0-9_-]{20,}\.[A-Za-z0-9_-]{20,}"),
    rule("huggingface-token", &["hf_"], r"\bhf_[A-Za-z0-9]{34,}\b"),
    rule("groq-key", &["gsk_"], r"\bgsk_[A-Za-z0-9]{48,}"),
    rule("xai-key", &["xai-"], r"\bxai-[A-Za-z0-9]{60,}"),
    rule("replicate-token", &["r8_"], r"\br8_[A-Za-z0-9]{37}\b"),
];

/// Shapes without a prefix of their own, tried after every token shape: tokens, credentials in
/// URLs, headers and command lines, and assignments.
pub(super) const OWN_SHAPES: &[Rule] = &[
    // After gitleaks' rules, so `sk-ant-…` is named Anthropic's.
    checked("openai-key", &["sk-"], r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}", Check::Mixed),
    rule("jwt", &["eyj"], r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    // The password runs to the last `@` that a host follows, so it may hold `/`, `@` or `!`.
    Rule {
        kind: "connection-password",
        keywords: &["://"],
        pattern: r#"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@'"]*:([^\s'"<>]+)@[A-Za-z0-9._~%\[\]-]+(?::\d+)?(?:[/?#\s'"<>,;)]|$)"#,
        group: 1,
        check: Check::NotPortAndPath,
    },
    group("bearer-token", &["bearer"], r"(?i)\bbearer\s+([A-Za-z0-9._~+/=-]{16,})", 1),
    group("okta-token", &["ssws"], r"(?i)\bSSWS\s+([A-Za-z0-9_-]{40,})", 1),
    // Docker's config.json keeps each registry's login as base64 of `user:password`.
    Rule {
        kind: "docker-auth",
        keywords: &["\"auth\""],
        pattern: r#""auth"\s*:\s*"([A-Za-z0-9+/]{8,}={0,2})""#,
        group: 1,
        check: Check::Base64Credentials,
    },
    // Said in prose: "the password is hunter2". A word alone is not one ("is required").
    Rule {
        kind: "password",
        keywords: &["pass", "pwd"],
        pattern: r#"(?i)\b(?:password|passwd|passphrase|pwd)\s+(?:is|was)\s*:?\s+["'`]?([^\s"'`]{5,}[^\s"'`.,;:!?)])"#,
        group: 1,
        check: Check::Mixed,
    },
    Rule {
        kind: "basic-auth",
        keywords: &["basic"],
        pattern: r"(?i)\bbasic\s+([A-Za-z0-9+/]{8,}={0,2})",
        group: 1,
        check: Check::Base64Credentials,
    },
    group(
        "password",
        &["mysql", "mariadb"],
        r#"\b(?:mysql|mysqldump|mysqladmin|mariadb)\b[^\n]*?\s-p([^\s'"-][^\s'"]*|'[^'\n]+'|"[^"\n]+")"#,
        1,
    ),
    group("password", &["curl"], r#"\bcurl\b[^\n]*?\s(?:-u|--user)[ =]?["']?[^\s:"'-][^\s:"']*:([^\s"']+)"#, 1),
    group("password", &["sshpass"], r#"\bsshpass\s+-p\s*([^\s'"-][^\s'"]*|'[^'\n]+'|"[^"\n]+")"#, 1),
    Rule {
        kind: "password",
        keywords: &["pass", "pwd"],
        pattern: assignment!("password|passwd|passphrase|pwd"),
        group: 2,
        check: Check::Assigned(1),
    },
    Rule {
        kind: "secret",
        keywords: &["secret", "token", "key", "credential"],
        pattern: assignment!(
            "secret|client[_-]?secret|secret[_-]?key|token|api[_-]?key|access[_-]?key|private[_-]?key|auth[_-]?key|credentials?"
        ),
        group: 2,
        check: Check::Assigned(8),
    },
];

impl Check {
    /// Whether the match `c`, whose secret is `secret`, is one.
    pub(super) fn accepts(self, c: &Captures<'_>, secret: &str) -> bool {
        match self {
            Self::Always => true,
            Self::Mixed => {
                let rest = secret.split_once(['-', '_']).map_or(secret, |(_, rest)| rest);
                rest.chars().any(|c| c.is_ascii_digit()) && rest.chars().any(|c| c.is_ascii_alphabetic())
            }
            Self::NotPortAndPath => !port_and_path(secret),
            Self::Assigned(min) => assigned(&c[1], secret, min),
            Self::Base64PrivateKey => decoded(secret, 96).is_some_and(|text| text.contains("PRIVATE KEY")),
            Self::Base64Credentials => decoded(secret, 256).is_some_and(|text| {
                text.split_once(':').is_some_and(|(user, password)| {
                    !password.is_empty() && !user.contains(char::is_whitespace) && text.chars().all(|c| !c.is_control())
                })
            }),
        }
    }
}

/// The text the first `max` characters of base64 `value` stand for, when they are base64 of text.
fn decoded(value: &str, max: usize) -> Option<String> {
    use base64::Engine;
    let cut = if value.len() > max { &value[..max - max % 4] } else { value };
    let bytes = base64::engine::general_purpose::STANDARD.decode(cut).ok()?;
    String::from_utf8(bytes).ok()
}

/// `host:8443/path@…` is a port and a path before an `@` in the path, not a password.
fn port_and_path(password: &str) -> bool {
    let digits = password.chars().take_while(char::is_ascii_digit).count();
    (1..=5).contains(&digits) && password[digits..].starts_with('/')
}

/// Whether `raw`, the value of an assignment after `separator`, is a secret of at least `min`
/// characters. In quotes any value counts; unquoted it must not be an expression
/// (`other.password`, `read()`), and after a space it must not read as prose or a type
/// (`password: is required`, `password: String`), so there it needs 6 characters and a mix that
/// words lack. Right after the separator (`password=abc`) it may be short.
fn assigned(separator: &str, raw: &str, min: usize) -> bool {
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
pub(super) fn placeholder(value: &str) -> bool {
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
