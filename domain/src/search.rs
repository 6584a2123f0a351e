//! Searching what an agent may read: the words it asks for, checked, and the shape of what is
//! found. Postgres does the matching (`websearch_to_tsquery` over the `simple` configuration:
//! words as written, unstemmed, so identifiers and words of any language match as typed); this
//! module decides what a query may be and how many results one answer holds.

use chrono::{DateTime, Utc};

use super::{Error, Result};

/// The most characters a query may have.
pub const MAX_QUERY_CHARS: usize = 256;
/// Results in one answer when the caller does not say.
pub const DEFAULT_LIMIT: u32 = 10;
/// The most results one answer holds.
pub const MAX_LIMIT: u32 = 50;
/// Messages indexed in one statement: enough that a batch amortises the words index's insert, few
/// enough that a statement stays short (tens of milliseconds).
pub const INDEX_BATCH: i64 = 500;

/// A checked search: the words and the filters, addresses still as the caller wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Search {
    /// As for a web search: words, "a phrase", `or`, `-word`.
    pub words: String,
    pub from: Option<String>,
    pub to: Option<String>,
    pub thread: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub limit: u32,
}

impl Search {
    /// Checks what a caller asked; blank filters count as absent.
    pub fn new(
        words: &str,
        from: Option<&str>,
        to: Option<&str>,
        thread: Option<&str>,
        since: Option<DateTime<Utc>>,
        limit: Option<u32>,
    ) -> Result<Self> {
        let words = words.trim();
        if words.is_empty() {
            return Err(Error::invalid("query is empty: say the words to search for"));
        }
        if words.chars().count() > MAX_QUERY_CHARS {
            return Err(Error::invalid(format!("query is longer than {MAX_QUERY_CHARS} characters")));
        }
        if words.chars().any(char::is_control) {
            return Err(Error::invalid("query holds control characters"));
        }
        let limit = match limit {
            None | Some(0) => DEFAULT_LIMIT,
            Some(n) if n > MAX_LIMIT => {
                return Err(Error::invalid(format!("limit {n} is over {MAX_LIMIT}")));
            }
            Some(n) => n,
        };
        let given = |v: Option<&str>| v.map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned);
        Ok(Self { words: words.to_owned(), from: given(from), to: given(to), thread: given(thread), since, limit })
    }
}

/// The oldest time a search reaches back to, from what the caller wrote: a time (RFC 3339) or an
/// age before `now` (`30m`, `24h`, `7d`); blank is no bound.
pub fn since(given: &str, now: DateTime<Utc>) -> Result<Option<DateTime<Utc>>> {
    let given = given.trim();
    if given.is_empty() {
        return Ok(None);
    }
    let bad = || {
        Error::invalid(format!("since {given:?} is neither a time (2026-12-01T09:00:00Z) nor an age (30m, 24h, 7d)"))
    };
    if let Ok(at) = DateTime::parse_from_rfc3339(given) {
        return Ok(Some(at.with_timezone(&Utc)));
    }
    let (number, unit) = given.split_at(given.len() - given.chars().last().map_or(0, char::len_utf8));
    let n: i64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(bad()),
    };
    // Ten years back is as far as any relay keeps messages; more is a mistake, not a bound.
    if !(0..=3_650 * 86_400).contains(&n.saturating_mul(seconds)) {
        return Err(bad());
    }
    Ok(Some(now - chrono::Duration::seconds(n * seconds)))
}

/// One message found.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub id: String,
    pub thread: String,
    /// The sender's address.
    pub from: String,
    pub created_at: DateTime<Utc>,
    /// Where the words matched, matches between « and »; the sender's text, untrusted.
    pub snippet: String,
    /// Higher is a better match; comparable within one answer only.
    pub rank: f32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_words_within_bounds_and_blank_filters_are_absent() {
        let s = Search::new("  deploy -staging ", Some(" "), Some("ci/bob"), None, None, None).unwrap();
        assert_eq!((s.words.as_str(), s.from, s.to.as_deref(), s.limit), ("deploy -staging", None, Some("ci/bob"), 10));
        assert_eq!(Search::new("x", None, None, None, None, Some(50)).unwrap().limit, 50);
        for (words, limit, why) in [
            ("   ", None, "query is empty"),
            ("a\u{1b}[31m", None, "control characters"),
            (&"w".repeat(MAX_QUERY_CHARS + 1) as &str, None, "longer than 256"),
            ("deploy", Some(51), "limit 51 is over 50"),
        ] {
            let err = Search::new(words, None, None, None, None, limit).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn since_is_a_time_or_an_age_before_now() {
        let now = DateTime::parse_from_rfc3339("2026-12-07T12:00:00Z").unwrap().with_timezone(&Utc);
        let at = |s: &str| since(s, now).unwrap().map(|t| t.to_rfc3339());
        assert_eq!(at(" "), None);
        assert_eq!(at("2026-12-01T09:00:00+01:00").as_deref(), Some("2026-12-01T08:00:00+00:00"));
        assert_eq!(at("30m").as_deref(), Some("2026-12-07T11:30:00+00:00"));
        assert_eq!(at("24h").as_deref(), Some("2026-12-06T12:00:00+00:00"));
        assert_eq!(at("7d").as_deref(), Some("2026-11-30T12:00:00+00:00"));
        assert_eq!(at("2w").as_deref(), Some("2026-11-23T12:00:00+00:00"));
        for bad in ["yesterday", "7", "d", "-3d", "7y", "99999999999d", "7дн"] {
            let err = since(bad, now).unwrap_err().to_string();
            assert!(err.contains("neither a time"), "{bad}: {err}");
        }
    }
}
