//! Which repository a path is in, as Relay names repositories: by the remote every clone shares,
//! else (a repository with no remote) by its root on this machine. Asked of `git` itself, so
//! worktrees, submodules and `GIT_DIR` read as git reads them.

use std::path::Path;
use std::time::Duration;

use relay_proto::v1::{RepoRef, repo_ref::Kind};

/// How long git may take to answer; a repository on a hung network share is not waited for.
const GIT_WAIT: Duration = Duration::from_secs(5);

/// A repository found at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The working tree's root.
    pub root: String,
    /// The remote's URL, without any credential it carries; `None` when it has no remote.
    pub remote: Option<String>,
}

impl Located {
    /// The repository as a request names it.
    pub fn to_ref(&self) -> RepoRef {
        let kind = match &self.remote {
            Some(remote) => Kind::Remote(remote.clone()),
            None => Kind::LocalPath(self.root.clone()),
        };
        RepoRef { kind: Some(kind) }
    }
}

/// The repository `dir` is in: its root and remote (`origin`, else the first git lists).
pub async fn locate(dir: &Path) -> Result<Located, String> {
    let root = git(dir, &["rev-parse", "--show-toplevel"])
        .await
        .map_err(|e| format!("{} is not in a git repository ({e})", dir.display()))?;
    let remotes = git(Path::new(&root), &["remote"]).await.unwrap_or_default();
    let names: Vec<&str> = remotes.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let chosen = names.iter().find(|n| **n == "origin").or(names.first());
    let remote = match chosen {
        Some(name) => git(Path::new(&root), &["remote", "get-url", name]).await.ok().map(|u| without_credentials(&u)),
        None => None,
    };
    Ok(Located { root, remote })
}

/// The paths staged for the next commit in the repository at `root`, from its root.
pub async fn staged(root: &Path) -> Result<Vec<String>, String> {
    let out = git(root, &["diff", "--cached", "--name-only", "--no-renames", "-z"]).await?;
    Ok(out.split('\0').filter(|p| !p.is_empty()).map(str::to_owned).collect())
}

/// A remote URL without a user or token in it (`https://ann:ghp_…@host/x` → `https://host/x`).
pub fn without_credentials(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}/{path}")
        }
        None => url.to_owned(),
    }
}

/// Runs git in `dir`; its trimmed output, or what went wrong.
async fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let run = tokio::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(GIT_WAIT, run).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("cannot run git: {e}")),
        Err(_) => return Err(format!("git gave no answer in {} s", GIT_WAIT.as_secs())),
    };
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end_matches(['\n', '\r']).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_is_named_without_its_credentials() {
        assert_eq!(without_credentials("https://ann:ghp_x@github.com/acme/api.git"), "https://github.com/acme/api.git");
        assert_eq!(without_credentials("git@github.com:acme/api.git"), "git@github.com:acme/api.git");
        assert_eq!(without_credentials("ssh://git@host:22/x"), "ssh://host:22/x");
    }

    #[tokio::test]
    async fn a_repository_is_found_by_its_remote_or_else_its_root() {
        let dir = std::env::temp_dir().join(format!("relay-repo-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src")).unwrap();
        assert!(locate(&dir).await.unwrap_err().contains("not in a git repository"));
        let git = |args: &[&str]| {
            let ok = std::process::Command::new("git").arg("-C").arg(&dir).args(args).status().unwrap().success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        let root = std::fs::canonicalize(&dir).unwrap().display().to_string();
        let found = locate(&dir.join("src")).await.unwrap();
        assert_eq!(found, Located { root: root.clone(), remote: None });
        git(&["remote", "add", "upstream", "https://tok@example.org/a/b.git"]);
        assert_eq!(locate(&dir).await.unwrap().remote.as_deref(), Some("https://example.org/a/b.git"));
        git(&["remote", "add", "origin", "git@example.org:a/c.git"]);
        assert_eq!(locate(&dir).await.unwrap().remote.as_deref(), Some("git@example.org:a/c.git"), "origin first");
        std::fs::write(dir.join("src/x.rs"), "x").unwrap();
        git(&["add", "src/x.rs"]);
        assert_eq!(staged(Path::new(&root)).await.unwrap(), vec!["src/x.rs".to_owned()]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
