//! Stand-in agent CLIs for workers: shell scripts that do a card's work in its worktree and report
//! it through their own bridge (`$BRIDGE mcp`), as a real agent does with `finish_job`.

use std::path::{Path, PathBuf};

/// What a stand-in does besides committing `result.txt` and finishing its card.
#[derive(Debug, Clone, Copy, Default)]
pub struct StandIn<'a> {
    /// Leaves what it was given in its worktree: `agent-env.txt`, `agent-argv.txt`, and its first
    /// argument (the MCP config, when the command puts `{mcp_config}` first) as `agent-mcp.json`.
    pub records: bool,
    /// Says `started` in its worktree, then waits for the file `$GO` before working.
    pub gated: bool,
    /// Finishes with this pull request.
    pub pr_url: Option<&'a str>,
}

impl StandIn<'_> {
    pub fn script(&self) -> String {
        let mut body = String::from("#!/bin/sh\n");
        if self.records {
            body.push_str("env > agent-env.txt\nprintf '%s\\n' \"$@\" > agent-argv.txt\ncat \"$1\" > agent-mcp.json\n");
        }
        if self.gated {
            body.push_str("touch started\nwhile [ ! -e \"$GO\" ]; do sleep 0.05; done\n");
        }
        let finish = match self.pr_url {
            Some(url) => format!(r#"{{\"summary\":\"opened a pull request\",\"pr_url\":\"{url}\"}}"#),
            None => r#"{\"summary\":\"committed result.txt on $branch\"}"#.to_owned(),
        };
        body.push_str(&format!(
            r#"branch=$(git rev-parse --abbrev-ref HEAD)
echo "done" > result.txt
git add result.txt && git -c user.email=a@example.com -c user.name=agent commit -qm "the work"
printf '%s\n' \
 '{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"stand-in","version":"1"}}}}}}' \
 "{{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{{\"name\":\"finish_job\",\"arguments\":{finish}}}}}" \
 | "$BRIDGE" mcp --harness claude
"#
        ));
        body
    }

    /// The script written as an executable `name` in `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        executable(dir, name, &self.script())
    }
}

/// `body` written as an executable file `name` in `dir`.
pub fn executable(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}
