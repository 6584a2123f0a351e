//! Path claims: an agent says which paths of a repository it is changing, so that agents on other
//! machines hear of it before they collide. Here are the pure parts: what names a repository
//! across clones, what a claimed path may be, and when two claims (or a claim and a file) meet.
//!
//! A claimed path covers itself and everything below it: `src/auth` and `src/auth/` both claim the
//! directory. Globs take `*` and `?` within a segment and `**` for any number of segments;
//! a character class (`[ab]`) is read as any one character, so two claims may be said to meet
//! where they would not quite — for advice about collisions, the safe side.

use chrono::{DateTime, Utc};

use super::ids::{AccountId, ClaimId, EndpointId};
use super::{Error, Result};

/// How long a claim lasts when the claimant names no time: an hour, renewed by claiming again.
pub const DEFAULT_TTL_S: u32 = 3600;
pub const MIN_TTL_S: u32 = 60;
/// A day: a claim is a note about work in progress, not a lock held for good.
pub const MAX_TTL_S: u32 = 24 * 3600;
/// Paths one claim names.
pub const MAX_PATHS: usize = 64;
pub const MAX_PATH_BYTES: usize = 512;
/// Segments one path has, and `**` among them: bounds the work of comparing two.
const MAX_SEGMENTS: usize = 32;
const MAX_DEEP: usize = 8;
pub const MAX_REASON_CHARS: usize = 200;
pub const MAX_REPO_BYTES: usize = 512;
/// Claims one listing shows.
pub const MAX_LISTED: usize = 500;
/// How a repository without a remote is named: by the machine that has it and its path there.
pub const LOCAL_PREFIX: &str = "local:";

/// Forges whose owner and repository names are case-insensitive: `Acme/API` and `acme/api` are one
/// repository there.
const CASELESS_FORGES: &[&str] = &["github.com", "gitlab.com", "bitbucket.org", "codeberg.org"];

/// A repository as every clone of it is known: the host and path of its remote, lowercased where
/// the forge ignores case, without scheme, user, port or `.git` (`github.com/acme/api`); or, for a
/// repository with no remote, `local:<account>/<machine>:<path>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoKey(String);

impl RepoKey {
    /// The key of a remote URL (`https://…`, `ssh://…`, `git@host:owner/name`), or of a key a
    /// listing showed (`github.com/acme/api`, `local:…`).
    pub fn of_remote(remote: &str) -> Result<Self> {
        let given = remote.trim();
        if given.is_empty() {
            return Err(Error::invalid("repo is empty: give a git remote URL or leave it out for this repository"));
        }
        check_text("repo", given, MAX_REPO_BYTES)?;
        if given.starts_with(LOCAL_PREFIX) {
            return Ok(Self(given.to_owned()));
        }
        let not_remote = || {
            Error::invalid(format!(
                "repo {given:?} is not a git remote (https://host/owner/name, git@host:owner/name) or a repository key relay_claims showed"
            ))
        };
        let (host, path) = if let Some((_, rest)) = given.split_once("://") {
            let (authority, path) = rest.split_once('/').ok_or_else(not_remote)?;
            (authority, path)
        } else if let Some((authority, path)) = given.split_once(':')
            && !authority.contains('/')
            && !path.starts_with("//")
        {
            (authority, path)
        } else if let Some((host, path)) = given.split_once('/')
            && host.contains('.')
        {
            (host, path)
        } else {
            return Err(not_remote());
        };
        // user@host:port → host
        let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
        let host = host.split_once(':').map_or(host, |(h, _)| h).to_ascii_lowercase();
        let mut path: String = path.split('/').filter(|s| !s.is_empty()).collect::<Vec<_>>().join("/");
        if let Some(bare) = path.strip_suffix(".git") {
            path = bare.to_owned();
        }
        let hostname = |h: &str| {
            h.contains(|c: char| c.is_ascii_alphanumeric())
                && !h.starts_with(['.', '-'])
                && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        };
        if !hostname(&host) || path.is_empty() || path.split('/').any(|s| s == "..") {
            return Err(not_remote());
        }
        if CASELESS_FORGES.contains(&host.as_str()) {
            path = path.to_ascii_lowercase();
        }
        Ok(Self(format!("{host}/{path}")))
    }

    /// The key of a repository with no remote: the machine that has it, and its path there.
    pub fn local(account: &str, machine: &str, path: &str) -> Result<Self> {
        let path = path.trim().trim_end_matches(['/', '\\']);
        check_text("repository path", path, MAX_REPO_BYTES)?;
        let absolute = path.starts_with('/') || path.as_bytes().get(1) == Some(&b':');
        if !absolute {
            return Err(Error::invalid(format!("repository path {path:?} is not absolute")));
        }
        Ok(Self(format!("{LOCAL_PREFIX}{account}/{machine}:{path}")))
    }

    /// A key read back from the store, which only ever holds keys made here.
    pub fn stored(key: String) -> Self {
        Self(key)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RepoKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A claimed path, relative to the repository's root, with `/` between segments.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathGlob(String);

impl PathGlob {
    /// Reads a claimed path: relative, inside the repository, `\` read as `/`. `.` or `**` claims
    /// the whole repository; a trailing `/` changes nothing (a path covers what is below it).
    pub fn parse(given: &str) -> Result<Self> {
        check_text("path", given, MAX_PATH_BYTES)?;
        let path = given.trim().replace('\\', "/");
        if path.is_empty() {
            return Err(Error::invalid("a path is empty: name a file, a directory or a glob such as src/auth/**"));
        }
        if path.starts_with('/') || path.as_bytes().get(1) == Some(&b':') {
            return Err(Error::invalid(format!(
                "path {given:?} is absolute: name it from the repository's root, e.g. src/auth/**"
            )));
        }
        let mut segments: Vec<&str> = Vec::new();
        for segment in path.split('/') {
            match segment {
                "" | "." => {}
                ".." => return Err(Error::invalid(format!("path {given:?} leaves the repository (..)"))),
                s => segments.push(s),
            }
        }
        // A trailing `**` adds nothing to what a path covers.
        while segments.last() == Some(&"**") {
            segments.pop();
        }
        if segments.len() > MAX_SEGMENTS || segments.iter().filter(|s| **s == "**").count() > MAX_DEEP {
            return Err(Error::invalid(format!(
                "path {given:?} is too deep: at most {MAX_SEGMENTS} segments, {MAX_DEEP} of them **"
            )));
        }
        Ok(Self(if segments.is_empty() { "**".to_owned() } else { segments.join("/") }))
    }

    /// A path read back from the store, which only ever holds paths made here.
    pub fn stored(path: String) -> Self {
        Self(path)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether some file is covered by both.
    pub fn overlaps(&self, other: &PathGlob) -> bool {
        segments_meet(&covering(&self.0), &covering(&other.0))
    }

    /// Whether the file at `path` (from the repository's root) is covered.
    pub fn covers(&self, path: &str) -> bool {
        let file: Vec<Token> = path
            .split(['/', '\\'])
            .filter(|s| !s.is_empty() && *s != ".")
            .map(|s| Token::Literal(s.chars().map(Char::Is).collect()))
            .collect();
        segments_meet(&covering(&self.0), &file)
    }
}

impl std::fmt::Display for PathGlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A claim in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub id: ClaimId,
    pub holder_id: EndpointId,
    pub account_id: AccountId,
    /// The holder's address.
    pub holder: String,
    pub repo: RepoKey,
    pub paths: Vec<PathGlob>,
    pub exclusive: bool,
    pub reason: String,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// It outlives the session that made it (a card's claim, kept for its attempt).
    pub kept: bool,
}

impl Claim {
    /// Whether `paths`, claimed (exclusively or not), may not stand beside this claim.
    pub fn stops(&self, paths: &[PathGlob], exclusive: bool) -> bool {
        collide(paths, exclusive, &self.paths, self.exclusive)
    }

    /// One line for a person or a model: who holds what, why, and until when.
    pub fn describe(&self) -> String {
        let paths: Vec<&str> = self.paths.iter().map(PathGlob::as_str).collect();
        format!(
            "{} {} holds {} in {} {}: {:?} (since {}, until {})",
            self.id.name(),
            self.holder,
            paths.join(", "),
            self.repo,
            if self.exclusive { "exclusively" } else { "shared" },
            self.reason,
            self.since.format("%H:%M UTC"),
            self.until.format("%H:%M UTC"),
        )
    }
}

/// What a claim asks for, read and checked.
#[derive(Debug, Clone)]
pub struct Wanted {
    pub repo: RepoKey,
    pub paths: Vec<PathGlob>,
    pub exclusive: bool,
    pub ttl_s: u32,
    pub reason: String,
    /// A card's claim: kept by the card's attempt (its job token's hash) instead of a session.
    pub attempt: Option<super::ids::TokenHash>,
}

/// Reads a claim's paths: at least one, at most [`MAX_PATHS`], each once.
pub fn parse_paths(given: &[String]) -> Result<Vec<PathGlob>> {
    if given.is_empty() {
        return Err(Error::invalid("paths is empty: name at least one path or glob, e.g. [\"src/auth/**\"]"));
    }
    if given.len() > MAX_PATHS {
        return Err(Error::invalid(format!("{} paths in one claim; at most {MAX_PATHS}", given.len())));
    }
    let mut paths: Vec<PathGlob> = given.iter().map(|p| PathGlob::parse(p)).collect::<Result<_>>()?;
    paths.sort();
    paths.dedup();
    Ok(paths)
}

/// How long a claim lasts: `ttl_s` when given (within bounds), else the default.
pub fn ttl_s(given: Option<u32>) -> Result<u32> {
    match given {
        None => Ok(DEFAULT_TTL_S),
        Some(s) if (MIN_TTL_S..=MAX_TTL_S).contains(&s) => Ok(s),
        Some(s) => Err(Error::invalid(format!("ttl_s {s} is out of range: {MIN_TTL_S} to {MAX_TTL_S} seconds"))),
    }
}

/// Reads a claim's reason: something a colliding agent can act on.
pub fn reason(given: &str) -> Result<String> {
    let reason = given.trim();
    if reason.is_empty() {
        return Err(Error::invalid("reason is empty: say what you are changing, for agents who meet your claim"));
    }
    check_text("reason", reason, MAX_REASON_CHARS * 4)?;
    if reason.chars().count() > MAX_REASON_CHARS {
        return Err(Error::invalid(format!("reason is longer than {MAX_REASON_CHARS} characters")));
    }
    Ok(reason.to_owned())
}

fn check_text(what: &str, text: &str, max_bytes: usize) -> Result<()> {
    if text.len() > max_bytes {
        return Err(Error::invalid(format!("{what} is longer than {max_bytes} bytes")));
    }
    if text.chars().any(char::is_control) {
        return Err(Error::invalid(format!("{what} holds a control character")));
    }
    Ok(())
}

/// Two sets of paths, a claim's and another's: the pairs that meet.
pub fn meeting<'a>(ours: &'a [PathGlob], theirs: &'a [PathGlob]) -> Vec<(&'a PathGlob, &'a PathGlob)> {
    ours.iter().flat_map(|a| theirs.iter().filter(|b| a.overlaps(b)).map(move |b| (a, b))).collect()
}

/// Whether two claims must not both stand: they meet, and either is exclusive.
pub fn collide(ours: &[PathGlob], our_exclusive: bool, theirs: &[PathGlob], their_exclusive: bool) -> bool {
    (our_exclusive || their_exclusive) && !meeting(ours, theirs).is_empty()
}

// ---- matching --------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Char {
    Is(char),
    /// `?`, or a character class.
    One,
    /// `*`: any run of characters within a segment.
    Run,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(Vec<Char>),
    /// `**`: any number of segments.
    Deep,
}

/// A stored path's segments, with the `**` that makes it cover everything below it.
fn covering(path: &str) -> Vec<Token> {
    let mut tokens: Vec<Token> = path.split('/').map(token).collect();
    if tokens.last() != Some(&Token::Deep) {
        tokens.push(Token::Deep);
    }
    tokens
}

fn token(segment: &str) -> Token {
    if segment == "**" {
        return Token::Deep;
    }
    let mut chars = Vec::new();
    let mut rest = segment.chars().peekable();
    while let Some(c) = rest.next() {
        chars.push(match c {
            '*' => {
                while rest.peek() == Some(&'*') {
                    rest.next();
                }
                Char::Run
            }
            '?' => Char::One,
            '[' if segment.contains(']') => {
                for c in rest.by_ref() {
                    if c == ']' {
                        break;
                    }
                }
                Char::One
            }
            c => Char::Is(c),
        });
    }
    Token::Literal(chars)
}

/// Whether some path matches both token lists: a table over positions, so `**` on both sides costs
/// at most the product of the lengths.
fn segments_meet(a: &[Token], b: &[Token]) -> bool {
    meet_table(a.len(), b.len(), |i, j, memo| match (a.get(i), b.get(j)) {
        (None, None) => true,
        (Some(Token::Deep), _) => memo(i + 1, j) || (j < b.len() && memo(i, j + 1)),
        (_, Some(Token::Deep)) => memo(i, j + 1) || (i < a.len() && memo(i + 1, j)),
        (Some(Token::Literal(x)), Some(Token::Literal(y))) => chars_meet(x, y) && memo(i + 1, j + 1),
        _ => false,
    })
}

/// Whether some segment matches both.
fn chars_meet(a: &[Char], b: &[Char]) -> bool {
    meet_table(a.len(), b.len(), |i, j, memo| match (a.get(i), b.get(j)) {
        (None, None) => true,
        (Some(Char::Run), _) => memo(i + 1, j) || (j < b.len() && memo(i, j + 1)),
        (_, Some(Char::Run)) => memo(i, j + 1) || (i < a.len() && memo(i + 1, j)),
        (Some(x), Some(y)) => {
            let fits = match (x, y) {
                (Char::Is(x), Char::Is(y)) => x == y,
                _ => true,
            };
            fits && memo(i + 1, j + 1)
        }
        _ => false,
    })
}

/// One step of a table: the answer at a position, given the answers at later positions (`memo`).
type Step<'a> = dyn Fn(usize, usize, &mut dyn FnMut(usize, usize) -> bool) -> bool + 'a;

/// Runs `step` over positions `(0..=n, 0..=m)` from `(0, 0)`, each position once.
fn meet_table(n: usize, m: usize, step: impl Fn(usize, usize, &mut dyn FnMut(usize, usize) -> bool) -> bool) -> bool {
    fn at(i: usize, j: usize, m: usize, table: &mut Vec<Option<bool>>, step: &Step<'_>) -> bool {
        let cell = i * (m + 1) + j;
        if let Some(known) = table[cell] {
            return known;
        }
        // Marked false while it is worked out: a cycle cannot happen (each step moves forward).
        table[cell] = Some(false);
        let answer = step(i, j, &mut |i, j| at(i, j, m, table, step));
        table[cell] = Some(answer);
        answer
    }
    let mut table = vec![None; (n + 1) * (m + 1)];
    at(0, 0, m, &mut table, &step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(remote: &str) -> String {
        RepoKey::of_remote(remote).unwrap().to_string()
    }

    #[test]
    fn every_clone_of_a_repository_has_one_key() {
        for remote in [
            "https://github.com/Acme/API.git",
            "https://github.com/acme/api",
            "https://ann:ghp_secret@github.com/acme/api.git/",
            "git@github.com:acme/api.git",
            "ssh://git@GitHub.com:22/acme/api",
            "github.com/acme/api",
        ] {
            assert_eq!(key(remote), "github.com/acme/api", "{remote}");
        }
        assert_eq!(
            key("https://git.example.org:8443/Team/Tool.git"),
            "git.example.org/Team/Tool",
            "case kept off the big forges"
        );
        assert_eq!(key("git.example.org/Team/Tool"), "git.example.org/Team/Tool");
        assert_ne!(key("https://github.com/acme/api"), key("https://github.com/acme/web"));
    }

    #[test]
    fn what_is_not_a_remote_is_refused_by_name() {
        for bad in ["", "  ", "api", "../x", "https://github.com", "https://github.com/../x", "a\u{7}b"] {
            assert!(RepoKey::of_remote(bad).is_err(), "{bad:?}");
        }
        let long = format!("https://github.com/{}", "a".repeat(600));
        assert!(RepoKey::of_remote(&long).unwrap_err().to_string().contains("longer than 512 bytes"));
    }

    #[test]
    fn a_repository_without_a_remote_is_known_by_its_machine_and_path() {
        let local = RepoKey::local("acme", "laptop", "/home/ann/src/tool/").unwrap();
        assert_eq!(local.as_str(), "local:acme/laptop:/home/ann/src/tool");
        assert_eq!(RepoKey::of_remote(local.as_str()).unwrap(), local, "a listed key names it again");
        assert_eq!(RepoKey::local("acme", "win", r"C:\src\tool").unwrap().as_str(), r"local:acme/win:C:\src\tool");
        assert!(RepoKey::local("acme", "laptop", "src/tool").is_err());
    }

    #[test]
    fn claimed_paths_are_read_from_the_root_and_stay_inside_it() {
        let p = |s: &str| PathGlob::parse(s).map(|g| g.to_string());
        assert_eq!(p("src/auth/").unwrap(), "src/auth");
        assert_eq!(p("./src//auth/**").unwrap(), "src/auth");
        assert_eq!(p(r"src\auth\*.rs").unwrap(), "src/auth/*.rs");
        assert_eq!(p(".").unwrap(), "**");
        assert_eq!(p("**").unwrap(), "**");
        for bad in ["", "/etc/passwd", "C:/x", "src/../../x", "a\u{1b}[2J"] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
        assert!(p(&"a/".repeat(40)).unwrap_err().to_string().contains("too deep"));
        assert!(parse_paths(&[]).is_err());
        assert_eq!(parse_paths(&["b".into(), "a".into(), "b/".into()]).unwrap().len(), 2, "each path once");
    }

    fn g(s: &str) -> PathGlob {
        PathGlob::parse(s).unwrap()
    }

    #[test]
    fn a_path_covers_itself_and_everything_below_it() {
        assert!(g("src/auth").covers("src/auth/login.rs"));
        assert!(g("src/auth").covers("src/auth"));
        assert!(!g("src/auth").covers("src/authz/x.rs"));
        assert!(g("src/*.rs").covers("src/main.rs") && !g("src/*.rs").covers("src/a/main.rs"));
        assert!(g("**/Cargo.toml").covers("Cargo.toml") && g("**/Cargo.toml").covers("a/b/Cargo.toml"));
        assert!(g("src/**/test_*.py").covers("src/x/y/test_a.py"));
        assert!(g("docs/?.md").covers("docs/a.md") && !g("docs/?.md").covers("docs/ab.md"));
        assert!(g("**").covers("anything/at/all"));
        assert!(g("src/auth").covers(r"src\auth\login.rs"), "a Windows path is read as one");
    }

    #[test]
    fn two_claims_meet_when_some_file_is_in_both() {
        let meet = |a: &str, b: &str| {
            let (a, b) = (g(a), g(b));
            assert_eq!(a.overlaps(&b), b.overlaps(&a), "symmetric: {a} {b}");
            a.overlaps(&b)
        };
        assert!(meet("src/auth/**", "src/auth/login.rs"));
        assert!(meet("src", "src/auth/login.rs"), "a directory holds its files");
        assert!(meet("src/*/mod.rs", "src/auth"));
        assert!(meet("src/*.rs", "src/m*"));
        assert!(meet("**/*.rs", "docs/**/a*"));
        assert!(meet("a*b", "*c*"), "acb is both");
        assert!(!meet("src/auth", "src/web"));
        assert!(!meet("src/*.rs", "src/*.py"));
        assert!(!meet("docs/?.md", "docs/ab.md"));
        assert!(!meet("a/b/c", "a/b/d/**"));
        assert!(meet("src/[ab].rs", "src/c.rs"), "a class is read as any one character: the safe side");
    }

    #[test]
    fn only_an_exclusive_claim_stops_another() {
        let (a, b) = (vec![g("src/auth")], vec![g("src/auth/login.rs")]);
        assert!(!collide(&a, false, &b, false), "shared claims stand side by side");
        assert!(collide(&a, true, &b, false) && collide(&a, false, &b, true));
        assert!(!collide(&a, true, &[g("web")], true));
    }

    #[test]
    fn deep_globs_are_compared_in_bounded_work() {
        let a = g("**/a".repeat(8).trim_start_matches('/'));
        let b = g("**/b".repeat(8).trim_start_matches('/'));
        assert!(a.overlaps(&b), "a/b/… is under both");
        assert!(!g("x/**/y/**/z").overlaps(&g("q/**")));
    }

    #[test]
    fn reasons_and_times_are_bounded() {
        assert!(reason("  ").is_err());
        assert!(reason(&"x".repeat(201)).is_err());
        assert_eq!(reason(" refactoring login ").unwrap(), "refactoring login");
        assert_eq!(ttl_s(None).unwrap(), 3600);
        assert!(ttl_s(Some(30)).is_err() && ttl_s(Some(86_401)).is_err());
    }
}
