//! gitleaks' rule set, used as data: `vendor/gitleaks/gitleaks.toml` as released (its version and
//! how to update it are in `vendor/gitleaks/README.md`). Each rule keeps gitleaks' meaning: its
//! keywords gate it, its regex finds the match, its secret group (or else the first group that
//! matched) is the secret, whose Shannon entropy must exceed the rule's threshold, and the global
//! and the rule's allowlists (regexes on the secret, the match or the line; stopwords in the
//! secret) let it pass. Rules that apply only to some file paths are left out: a message has none.
//!
//! The regexes are Go's (RE2): `\w`, `\d`, `\s` and `\b` are ASCII there, so they are read as
//! ASCII classes here, which also keeps the regex engine on its fast path.
//!
//! One change is made to what the rules say: most end a token where a config file does — before a
//! quote, a space, a `;` or the end ([`CONFIG_END`]). A message is prose, where a token also ends a
//! sentence, a clause or a bracket, so there it may end before `,)]}>|` and a `.` or `:` that ends
//! a sentence too ([`PROSE_END`]).

use aho_corasick::AhoCorasick;
use regex::{Regex, RegexBuilder, RegexSet};
use serde::Deserialize;

const SOURCE: &str = include_str!("../../../vendor/gitleaks/gitleaks.toml");

/// How gitleaks' rules end a token (its `secretSuffix`).
const CONFIG_END: &str = r#"(?:[\x60'"\s;]|\\[nr]|$)"#;
/// The same, in prose: also before `,)]}>|`, and a `.` or `:` that ends a sentence or a clause
/// (not one inside a file name: `…-<hash>.png`).
const PROSE_END: &str = r#"(?:[\x60'"\s;,)\]}>|]|[.:](?:[\x60'"\s]|$)|\\[nr]|$)"#;

#[derive(Deserialize)]
struct File {
    allowlist: Option<Allowlist>,
    rules: Vec<RuleSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuleSpec {
    id: String,
    regex: Option<String>,
    secret_group: Option<usize>,
    entropy: Option<f64>,
    #[serde(default)]
    keywords: Vec<String>,
    path: Option<String>,
    #[serde(default)]
    allowlists: Vec<Allowlist>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Allowlist {
    condition: Option<String>,
    regex_target: Option<String>,
    #[serde(default)]
    regexes: Vec<String>,
    #[serde(default)]
    stopwords: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    commits: Vec<String>,
}

/// One of gitleaks' rules, compiled.
pub(super) struct Vendored {
    pub id: &'static str,
    pub keywords: Vec<String>,
    pub regex: Regex,
    /// The group holding the secret; `None`: the first group that matched, else the whole match.
    pub group: Option<usize>,
    pub entropy: Option<f64>,
    pub allow: Vec<Allow>,
}

/// What lets a finding pass.
pub(super) struct Allow {
    target: Target,
    regexes: Option<RegexSet>,
    /// Found in the secret ignoring ASCII case, as gitleaks compares them lowercased; one pass
    /// for all of them (generic-api-key has some 1,500).
    stopwords: Option<AhoCorasick>,
    /// Every check must hold, not any.
    all: bool,
}

#[derive(Clone, Copy)]
enum Target {
    Secret,
    Match,
    Line,
}

/// A finding, as its allowlists see it.
pub(super) struct Finding<'a> {
    pub secret: &'a str,
    pub matched: &'a str,
    pub line: &'a str,
}

impl Allow {
    fn of(spec: Allowlist) -> Option<Self> {
        let all = spec.condition.as_deref().is_some_and(|c| c.eq_ignore_ascii_case("and"));
        // Paths and commits are what a message has none of: a list that needs them never applies.
        if all && (!spec.paths.is_empty() || !spec.commits.is_empty()) {
            return None;
        }
        if spec.regexes.is_empty() && spec.stopwords.is_empty() {
            return None;
        }
        let target = match spec.regex_target.as_deref() {
            Some("match") => Target::Match,
            Some("line") => Target::Line,
            _ => Target::Secret,
        };
        let regexes = (!spec.regexes.is_empty()).then(|| {
            RegexSet::new(spec.regexes.iter().map(|r| ascii_classes(r)))
                .unwrap_or_else(|e| panic!("a vendored gitleaks allowlist does not compile: {e}"))
        });
        let stopwords = (!spec.stopwords.is_empty()).then(|| {
            AhoCorasick::builder()
                .ascii_case_insensitive(true)
                .build(&spec.stopwords)
                .expect("gitleaks' stopwords build an automaton")
        });
        Some(Self { target, regexes, stopwords, all })
    }

    pub fn allows(&self, finding: &Finding<'_>) -> bool {
        let target = match self.target {
            Target::Secret => finding.secret,
            Target::Match => finding.matched,
            Target::Line => finding.line,
        };
        let regex = || self.regexes.as_ref().is_some_and(|set| set.is_match(target));
        let stopword = || self.stopwords.as_ref().is_some_and(|words| words.is_match(finding.secret));
        if self.all {
            (self.regexes.is_none() || regex()) && (self.stopwords.is_none() || stopword())
        } else {
            regex() || stopword()
        }
    }
}

impl Vendored {
    /// Whether the secret is random enough to be one.
    pub fn random_enough(&self, secret: &str) -> bool {
        self.entropy.is_none_or(|threshold| shannon_entropy(secret) > threshold)
    }
}

/// The rule set, and its global allowlist.
pub(super) fn load() -> (Vec<Vendored>, Vec<Allow>) {
    let file: File = toml::from_str(SOURCE).expect("vendor/gitleaks/gitleaks.toml parses");
    let global = file.allowlist.into_iter().filter_map(Allow::of).collect();
    let rules = file
        .rules
        .into_iter()
        .filter(|rule| rule.path.is_none())
        .filter_map(|rule| {
            let regex = compile(&rule.regex?.replace(CONFIG_END, PROSE_END));
            Some(Vendored {
                id: Box::leak(rule.id.into_boxed_str()),
                keywords: rule.keywords.iter().map(|k| k.to_lowercase()).collect(),
                regex,
                group: rule.secret_group.filter(|g| *g > 0),
                entropy: rule.entropy.filter(|e| *e > 0.0),
                allow: rule.allowlists.into_iter().filter_map(Allow::of).collect(),
            })
        })
        .collect();
    (rules, global)
}

fn compile(go: &str) -> Regex {
    RegexBuilder::new(&ascii_classes(go))
        .size_limit(64 << 20)
        .build()
        .unwrap_or_else(|e| panic!("a vendored gitleaks regex does not compile: {e}"))
}

/// A Go regex with its Perl classes and word boundaries made ASCII, as RE2 reads them.
pub(super) fn ascii_classes(go: &str) -> String {
    let mut out = String::with_capacity(go.len() + 32);
    let mut chars = go.chars().peekable();
    let mut in_class = false;
    // Just after `[` or `[^`, where a `]` is literal.
    let mut class_start = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(next) = chars.next() else {
                    out.push(c);
                    break;
                };
                // `\x{…}`, `\p{…}` and `\P{…}` keep their braces.
                if matches!(next, 'x' | 'p' | 'P') && chars.peek() == Some(&'{') {
                    out.push('\\');
                    out.push(next);
                    copy_through(&mut chars, '}', &mut out);
                    class_start = false;
                    continue;
                }
                match (next, in_class) {
                    ('w', _) => out.push_str("[0-9A-Za-z_]"),
                    ('W', _) => out.push_str("[^0-9A-Za-z_]"),
                    ('d', _) => out.push_str("[0-9]"),
                    ('D', _) => out.push_str("[^0-9]"),
                    ('s', _) => out.push_str(r"[\t\n\f\r ]"),
                    ('S', _) => out.push_str(r"[^\t\n\f\r ]"),
                    ('b', false) => out.push_str(r"(?-u:\b)"),
                    ('B', false) => out.push_str(r"(?-u:\B)"),
                    _ => {
                        out.push('\\');
                        out.push(next);
                    }
                }
                class_start = false;
            }
            '[' if in_class && chars.peek() == Some(&':') => {
                // A POSIX class, `[:alnum:]`, copied whole.
                out.push(c);
                copy_through(&mut chars, ']', &mut out);
                class_start = false;
            }
            '[' if !in_class => {
                in_class = true;
                class_start = true;
                out.push(c);
                if chars.peek() == Some(&'^') {
                    out.push(chars.next().expect("peeked"));
                }
            }
            // RE2 reads a `{` that opens no repetition as itself; Rust's engine needs it escaped.
            '{' if !in_class && !repetition(chars.clone()) => out.push_str(r"\{"),
            ']' if in_class && !class_start => {
                in_class = false;
                out.push(c);
            }
            // In a class RE2 reads these as themselves; Rust reads `[` as a nested class and
            // `&&`, `--`, `~~` as set operations.
            '[' | '&' | '~' if in_class => {
                out.push('\\');
                out.push(c);
                class_start = false;
            }
            '-' if in_class && chars.peek() == Some(&'-') => {
                out.push_str(r"\-");
                class_start = false;
            }
            _ => {
                class_start = false;
                out.push(c);
            }
        }
    }
    out
}

/// Copies `chars` to `out` up to and including the first `end`.
fn copy_through(chars: &mut impl Iterator<Item = char>, end: char, out: &mut String) {
    for c in chars {
        out.push(c);
        if c == end {
            break;
        }
    }
}

/// Whether what follows a `{` makes it a repetition: `n}`, `n,}` or `n,m}`.
fn repetition(mut rest: impl Iterator<Item = char>) -> bool {
    let mut digits = 0;
    let mut comma = false;
    for c in rest.by_ref() {
        match c {
            '0'..='9' => digits += 1,
            ',' if !comma && digits > 0 => comma = true,
            '}' => return digits > 0,
            _ => return false,
        }
    }
    false
}

/// Shannon entropy in bits per character, as gitleaks measures it.
fn shannon_entropy(text: &str) -> f64 {
    let mut counts = std::collections::HashMap::<char, usize>::new();
    let mut total = 0usize;
    for c in text.chars() {
        *counts.entry(c).or_default() += 1;
        total += 1;
    }
    if total == 0 {
        return 0.0;
    }
    counts
        .values()
        .map(|&n| {
            let p = n as f64 / total as f64;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_classes_are_read_as_ascii() {
        assert_eq!(ascii_classes(r"\bab\w+"), r"(?-u:\b)ab[0-9A-Za-z_]+");
        assert_eq!(ascii_classes(r"[\w.-]{0,5}"), r"[[0-9A-Za-z_].-]{0,5}");
        assert_eq!(ascii_classes(r"[[:alnum:]\d]"), r"[[:alnum:][0-9]]");
        assert_eq!(ascii_classes(r"\\w[]a]"), r"\\w[]a]");
        assert_eq!(ascii_classes(r"^\$(?:\d+|{\d+})$"), r"^\$(?:[0-9]+|\{[0-9]+})$");
        assert_eq!(ascii_classes(r"a{2,}b{1,3}"), r"a{2,}b{1,3}");
        assert_eq!(ascii_classes(r"[a&&b~~c--d[e]"), r"[a\&\&b\~\~c\--d\[e]");
        assert_eq!(ascii_classes(r"\x{41}\p{L}"), r"\x{41}\p{L}");
    }

    #[test]
    fn every_vendored_rule_compiles() {
        let (rules, global) = load();
        assert!(rules.len() > 200, "{} rules", rules.len());
        assert!(!global.is_empty());
    }

    #[test]
    fn entropy_is_in_bits_per_character() {
        assert_eq!(shannon_entropy("aaaa"), 0.0);
        assert!((shannon_entropy("abcd") - 2.0).abs() < 1e-9);
    }
}
