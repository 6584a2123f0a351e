//! Where the server is (one URL, or several replicas: see [`super::replicas`]), how to reach it,
//! and with which credential: a machine's (for agents), a card's job token (for a card's agent), or
//! a person's (for `agent-bridge human`).

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};

use relay_proto::bridge_config::{self, BridgeConfig};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "no relay server configured: run `agent-bridge login --server URL` (it reads the token from stdin), or set RELAY_SERVER and RELAY_TOKEN"
    )]
    NotConfigured,
    #[error(
        "no relay server known for human commands: set RELAY_SERVER, or run `agent-bridge human login --server URL`"
    )]
    NoHumanServer,
    #[error(transparent)]
    Address(#[from] relay_agent::relay::replicas::AddressError),
    #[error("no {what}: {hint}")]
    NoSecret { what: &'static str, hint: &'static str },
    #[error(
        "RELAY_SERVER is {asked}, but your human token was stored for {stored}: unset RELAY_SERVER, or set RELAY_HUMAN_TOKEN for {asked}"
    )]
    OtherServer { asked: String, stored: String },
    #[error("cannot read the {what} from stdin: {source}")]
    Stdin { what: &'static str, source: std::io::Error },
    #[error(transparent)]
    Config(#[from] bridge_config::ConfigError),
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

/// Server, credential and trust anchor. A card's agent (the worker sets `RELAY_JOB_TOKEN`) holds
/// its job token and nothing more: never `RELAY_TOKEN` or the config file's machine token, and the
/// file gives only the server and CA when `RELAY_SERVER` is absent. Anyone else: `RELAY_SERVER` +
/// `RELAY_TOKEN` (+ `RELAY_CA`), else the config file.
pub fn resolve() -> Result<BridgeConfig, ConnectError> {
    if let Some(job_token) = env("RELAY_JOB_TOKEN") {
        let (server, ca) = match env("RELAY_SERVER") {
            Some(server) => (server, env("RELAY_CA")),
            None => {
                let stored =
                    bridge_config::read(&bridge_config::default_path()?)?.ok_or(ConnectError::NotConfigured)?;
                (stored.server, stored.ca)
            }
        };
        return Ok(BridgeConfig { server, token: job_token, ca, human_token: None });
    }
    if let (Some(server), Some(token)) = (env("RELAY_SERVER"), env("RELAY_TOKEN")) {
        return Ok(BridgeConfig { server, token, ca: env("RELAY_CA"), human_token: None });
    }
    let path = bridge_config::default_path()?;
    bridge_config::read(&path)?.ok_or(ConnectError::NotConfigured)
}

/// What `agent-bridge human login` keeps: a person's credential, apart from any machine's.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HumanConfig {
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    pub token: String,
}

/// `RELAY_HUMAN_CONFIG`, else `human.toml` beside the bridge config.
pub fn human_config_path() -> Result<PathBuf, ConnectError> {
    if let Some(path) = env("RELAY_HUMAN_CONFIG") {
        return Ok(PathBuf::from(path));
    }
    Ok(bridge_config::default_path()?.with_file_name("human.toml"))
}

/// The file `human login` wrote: `None` when there is none; an error naming the file, the line and
/// the fix when it cannot be used.
pub fn read_human(path: &Path) -> Result<Option<HumanConfig>, ConnectError> {
    const FIX: &str = "fix that line, or write the file anew with `agent-bridge human login --server URL`";
    Ok(bridge_config::read_toml(path, FIX)?)
}

pub fn write_human(path: &Path, config: &HumanConfig) -> Result<(), ConnectError> {
    let text = toml::to_string(config).map_err(bridge_config::ConfigError::from)?;
    Ok(bridge_config::write_private(path, text.as_bytes())?)
}

/// Where a person's commands go, and the CA to trust: `RELAY_SERVER` (+ `RELAY_CA`), else the file
/// `human login` wrote, else the machine's bridge config. No machine token is needed.
pub fn human_server() -> Result<(String, Option<String>), ConnectError> {
    if let Some(server) = env("RELAY_SERVER") {
        return Ok((server, env("RELAY_CA")));
    }
    if let Some(stored) = read_human(&human_config_path()?)? {
        return Ok((stored.server, stored.ca));
    }
    let machine = bridge_config::read(&bridge_config::default_path()?)?.ok_or(ConnectError::NoHumanServer)?;
    Ok((machine.server, machine.ca))
}

/// A person's server, CA and token, always from one source, so a token is never sent to a server
/// it was not stored for: `RELAY_HUMAN_TOKEN` (with `RELAY_SERVER`, else the known server), else the
/// file `human login` wrote (or a token an earlier version kept in the bridge config), else typed at
/// a prompt on a terminal.
pub fn human_credentials() -> Result<(String, Option<String>, String), ConnectError> {
    if let Some(token) = env("RELAY_HUMAN_TOKEN") {
        let (server, ca) = human_server()?;
        return Ok((server, ca, token));
    }
    let stored = match read_human(&human_config_path()?)? {
        Some(human) => Some((human.server, human.ca, human.token)),
        None => bridge_config::read(&bridge_config::default_path()?)?
            .and_then(|machine| machine.human_token.map(|token| (machine.server, machine.ca, token))),
    };
    if let Some((server, ca, token)) = stored {
        return match env("RELAY_SERVER") {
            // Some or all of the replicas it was stored for: those asked for.
            Some(asked) if relay_agent::relay::replicas::within(&asked, &server)? => Ok((asked, ca, token)),
            Some(asked) => Err(ConnectError::OtherServer { asked, stored: server }),
            None => Ok((server, ca, token)),
        };
    }
    let (server, ca) = human_server()?;
    if std::io::stdin().is_terminal() {
        return Ok((server, ca, read_secret("human token", "")?));
    }
    Err(ConnectError::NoSecret {
        what: "human token",
        hint: "set RELAY_HUMAN_TOKEN, or run `agent-bridge human login` (it reads the token from stdin)",
    })
}

/// A token that must not appear in argv: `env` when set, else typed at a prompt that does not echo
/// it (on a terminal), else the first line of stdin (`… login < token-file`, or a pipe).
pub fn read_secret(what: &'static str, env_name: &str) -> Result<String, ConnectError> {
    if let Some(token) = (!env_name.is_empty()).then(|| env(env_name)).flatten() {
        return Ok(token);
    }
    let stdin = std::io::stdin();
    let line = if stdin.is_terminal() {
        rpassword::prompt_password(format!("{what}: ")).map_err(|source| ConnectError::Stdin { what, source })?
    } else {
        let mut line = String::new();
        stdin.lock().read_line(&mut line).map_err(|source| ConnectError::Stdin { what, source })?;
        line
    };
    let token = line.trim().to_owned();
    if token.is_empty() {
        return Err(ConnectError::NoSecret {
            what,
            hint: "give it on stdin (a prompt on a terminal) or in the environment",
        });
    }
    Ok(token)
}
