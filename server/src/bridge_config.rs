//! The bridge's config file, which `relay-server dev` writes so `agent-bridge mcp` works at once.
//!
//! Format (TOML, mode 0600): `server = "URL"`, `token = "MACHINE TOKEN"`, optional `ca = "PEM PATH"`.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BridgeConfig {
    pub server: String,
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
}

/// `RELAY_CONFIG`, else `~/.config/agent-relay/bridge.toml`.
pub fn default_path() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("RELAY_CONFIG").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let home = dirs::home_dir().context("cannot find the home directory; set RELAY_CONFIG")?;
    Ok(home.join(".config").join("agent-relay").join("bridge.toml"))
}

/// Reads the file; `None` when it does not exist or cannot be parsed.
pub fn read(path: &Path) -> Option<BridgeConfig> {
    let text = std::fs::read_to_string(path).ok()?;
    toml::from_str(&text).ok()
}

/// Writes the file with owner-only permissions, replacing it atomically.
pub fn write(path: &Path, config: &BridgeConfig) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let text = toml::to_string(config).context("cannot encode the bridge config")?;
    let tmp = path.with_extension("toml.tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
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
        let config = BridgeConfig { server: "http://127.0.0.1:7447".into(), token: "rlm_x".into(), ca: None };
        write(&path, &config).unwrap();
        assert_eq!(read(&path).unwrap(), config);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
