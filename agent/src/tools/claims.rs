//! The path-claim tools: claim, release and list. Which repository a call means is found on the
//! agent's machine (its working directory's, or the path it names); the server decides whether a
//! claim stands and who sees it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use relay_proto::v1::repo_ref::Kind;
use relay_proto::v1::*;
use serde_json::{Map, Value};

use super::args::{ArgError, Flag, parse};
use super::input;
use super::output::{self, PathClaim as Shown};
use super::{Host, Outcome, ToolError, Tools};
use crate::repo;

type Result<T> = std::result::Result<T, ToolError>;

pub async fn call(tools: &Tools, name: &str, arguments: &Map<String, Value>) -> Result<Outcome> {
    match name {
        "relay_claim" => claim(tools, parse(arguments)?).await,
        "relay_release" => release(tools, parse(arguments)?).await,
        "relay_claims" => list(tools, parse(arguments)?).await,
        other => Err(ToolError::Refused(format!("no tool {other}"))),
    }
}

/// Whether `given` names a repository by its remote (or a key a listing showed) rather than by a
/// path on this machine.
fn is_remote(given: &str) -> bool {
    given.contains("://")
        || given.starts_with("local:")
        || given.split_once(':').is_some_and(|(head, _)| head.contains('@') && !head.contains('/'))
}

/// The repository a call names (`given`), else the working directory's: a remote as given, a
/// path looked up with git on this machine. `None` when neither names one and that is allowed.
async fn repo_of(host: &Host, given: Option<&str>, needed: bool) -> Result<Option<RepoRef>> {
    let remote = |r: &str| RepoRef { kind: Some(Kind::Remote(r.to_owned())) };
    let here = host.cwd.as_deref().filter(|c| !c.is_empty());
    let path: PathBuf = match (given.map(str::trim), here) {
        (Some(r), _) if is_remote(r) => return Ok(Some(remote(r))),
        (Some(r), Some(cwd)) => {
            let expanded = PathBuf::from(host.expand_home(r));
            let path = if expanded.is_absolute() { expanded } else { Path::new(cwd).join(expanded) };
            // `github.com/acme/api`, as relay_claims shows keys, is no directory here.
            if !path.is_dir() {
                return Ok(Some(remote(r)));
            }
            path
        }
        // No machine to look on (an agent over /mcp): what it gives is a remote or a key.
        (Some(r), None) => return Ok(Some(remote(r))),
        (None, Some(cwd)) => PathBuf::from(cwd),
        (None, None) if needed => {
            return Err(ArgError("repo is required: give the repository's remote URL".into()).into());
        }
        (None, None) => return Ok(None),
    };
    match repo::locate(&path).await {
        Ok(found) => Ok(Some(found.to_ref())),
        Err(_) if given.is_none() && !needed => Ok(None),
        Err(e) => Err(ArgError(format!("{e}: give repo, the repository's remote URL or path")).into()),
    }
}

fn shown(claims: &[PathClaim]) -> Vec<Shown> {
    claims.iter().map(Shown::from_wire).collect()
}

/// One line per claim: id, holder, paths, kind, reason, until.
fn lines(claims: &[PathClaim]) -> Vec<String> {
    claims
        .iter()
        .map(|c| {
            format!(
                "{}  {}  {}  {}  {}  {}  until {}",
                c.id,
                c.holder,
                c.repo,
                c.paths.join(", "),
                if c.exclusive { "exclusive" } else { "shared" },
                crate::frame::quote(&c.reason),
                c.until
            )
        })
        .collect()
}

async fn claim(tools: &Tools, args: input::Claim) -> Result<Outcome> {
    let repo = repo_of(tools.host(), args.repo.as_ref().map(|r| r.0.as_str()), true).await?;
    let request = ClaimPathsRequest {
        repo,
        paths: args.paths.0,
        exclusive: Flag::or(args.exclusive, true),
        ttl_s: args.ttl_s.map(|t| t.0),
        reason: args.reason.0,
    };
    // Claiming again renews, so a retried claim does no harm.
    let reply = tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.claim_paths(r).await }).await?;
    if reply.granted {
        let claim = reply.claim.unwrap_or_default();
        let text = format!(
            "{} {}: {} in {} ({}) until {}.",
            if reply.renewed { "renewed" } else { "granted" },
            claim.id,
            claim.paths.join(", "),
            claim.repo,
            if claim.exclusive { "exclusive" } else { "shared" },
            claim.until
        );
        let data = output::Claimed { granted: true, claim: Some(Shown::from_wire(&claim)), conflicts: Vec::new() };
        return Ok(Outcome::data(text, &data).then("Release it with relay_release when done; claim again to renew."));
    }
    let text = format!(
        "NOT granted: held by other agents (they were told you asked):\n{}",
        lines(&reply.conflicts).join("\n")
    );
    let data = output::Claimed { granted: false, claim: None, conflicts: shown(&reply.conflicts) };
    Ok(Outcome::data(text, &data).untrusted().then("Work elsewhere, or agree with a holder by relay_send."))
}

async fn release(tools: &Tools, args: input::Release) -> Result<Outcome> {
    let paths = args.paths.map(|p| p.0).unwrap_or_default();
    let repo = if paths.is_empty() { None } else { repo_of(tools.host(), None, false).await? };
    let request = ReleasePathsRequest { claim: args.claim.map(|c| c.0).unwrap_or_default(), repo, paths };
    // Releasing twice finds nothing the second time: the first answer is the one to keep.
    let reply =
        tools.relay().call_once(Duration::ZERO, request, |mut c, r| async move { c.release_paths(r).await }).await?;
    let text = if reply.released.is_empty() {
        "you held no claim to release".to_owned()
    } else {
        format!("released:\n{}", lines(&reply.released).join("\n"))
    };
    Ok(Outcome::data(text, &output::Claims { claims: shown(&reply.released) }))
}

async fn list(tools: &Tools, args: input::Claims) -> Result<Outcome> {
    let repo = match &args.repo {
        Some(r) => repo_of(tools.host(), Some(&r.0), true).await?,
        None => None,
    };
    let request = ListClaimsRequest { repo, mine: Flag::or(args.mine, false) };
    let reply = tools.relay().call(Duration::ZERO, request, |mut c, r| async move { c.list_claims(r).await }).await?;
    let text = if reply.claims.is_empty() {
        "no claims stand that you can see".to_owned()
    } else {
        lines(&reply.claims).join("\n")
    };
    let foreign = !reply.claims.is_empty();
    let outcome = Outcome::data(text, &output::Claims { claims: shown(&reply.claims) });
    Ok(if foreign { outcome.untrusted() } else { outcome })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remotes_and_keys_are_told_from_paths() {
        for remote in ["https://github.com/acme/api", "git@github.com:acme/api.git", "local:acme/m:/src/x"] {
            assert!(is_remote(remote), "{remote}");
        }
        for path in ["/home/ann/src/api", "../api", "~/src/api", "C:/src/api", "github.com/acme/api"] {
            assert!(!is_remote(path), "{path}: looked up on this machine first");
        }
    }
}
