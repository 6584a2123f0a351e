//! The bridge's config file, which `relay-server dev` writes so `agent-bridge mcp` works at once.
//!
//! Format (TOML, mode 0600): `server = "URL"`, `token = "MACHINE TOKEN"`, optional `ca = "PEM PATH"`.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot find the home directory; set RELAY_CONFIG")]
    NoHome,
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot encode the bridge config: {0}")]
    Encode(#[from] toml::ser::Error),
}

fn write_err(path: &Path) -> impl FnOnce(std::io::Error) -> ConfigError + '_ {
    move |source| ConfigError::Write { path: path.to_path_buf(), source }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BridgeConfig {
    pub server: String,
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// An account person's token, for `agent-bridge human …`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub human_token: Option<String>,
}

/// `RELAY_CONFIG`, else `~/.config/agent-relay/bridge.toml`.
pub fn default_path() -> Result<PathBuf, ConfigError> {
    if let Some(path) = std::env::var_os("RELAY_CONFIG").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let home = dirs::home_dir().ok_or(ConfigError::NoHome)?;
    Ok(home.join(".config").join("agent-relay").join("bridge.toml"))
}

/// Reads the file; `None` when it does not exist or cannot be parsed.
pub fn read(path: &Path) -> Option<BridgeConfig> {
    let text = std::fs::read_to_string(path).ok()?;
    toml::from_str(&text).ok()
}

/// Writes the file with owner-only permissions, replacing it atomically.
pub fn write(path: &Path, config: &BridgeConfig) -> Result<(), ConfigError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(write_err(dir))?;
    }
    let text = toml::to_string(config)?;
    let tmp = path.with_extension("toml.tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(write_err(&tmp))?;
    file.write_all(text.as_bytes()).and_then(|()| file.sync_all()).map_err(write_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(write_err(path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn round_trips_with_owner_only_permissions() {
        let dir = std::env::temp_dir().join(format!("relay-config-test-{}", std::process::id()));
        let path = dir.join("nested").join("bridge.toml");
        let config =
            BridgeConfig { server: "http://127.0.0.1:7447".into(), token: "rlm_x".into(), ..Default::default() };
        write(&path, &config).unwrap();
        assert_eq!(read(&path).unwrap(), config);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
