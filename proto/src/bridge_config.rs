//! The bridge's config file, which `relay-server dev` writes so `agent-bridge mcp` works at once.
//!
//! Format (TOML, mode 0600): `server = "URL"` (or several replicas' URLs, comma-separated), `token =
//! "MACHINE TOKEN"`, optional `ca = "PEM PATH"`.

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
    let text = toml::to_string(config)?;
    // An earlier version wrote through this fixed name, which a stale copy with loose permissions
    // could turn into a readable config: it goes, and is never used again.
    let _ = std::fs::remove_file(path.with_extension("toml.tmp"));
    write_private(path, text.as_bytes())
}

/// `~/.config/agent-relay`, the directory of the bridge's files.
fn default_dir() -> Option<PathBuf> {
    dirs::home_dir().map(|home| home.join(".config").join("agent-relay"))
}

/// Writes `contents` to `path` for its owner alone, replacing it atomically. The bytes go to a
/// temporary file created new (never one left lying around) with mode 0600 and then renamed over
/// `path`, so no other user can read them at any moment. A directory made here is 0700, and so is
/// the bridge's own directory when it exists with looser permissions.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(write_err(dir))?;
    if default_dir().is_some_and(|own| own == dir) {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(write_err(dir))?;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (tmp, mut file) = loop {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.{}.{nanos}.{n}.tmp", std::process::id()));
        match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp) {
            Ok(file) => break (tmp, file),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(write_err(&tmp)(e)),
        }
    };
    let written = file.write_all(contents).and_then(|()| file.sync_all()).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(write_err(path)(e));
    }
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

    #[test]
    fn a_stale_loose_temporary_file_never_becomes_the_config() {
        let dir = std::env::temp_dir().join(format!("relay-config-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bridge.toml");
        let stale = dir.join("bridge.toml.tmp");
        std::fs::write(&stale, "old").unwrap();
        std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o644)).unwrap();
        let config = BridgeConfig { server: "http://x".into(), token: "rlm_secret".into(), ..Default::default() };
        write(&path, &config).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(!stale.exists(), "the stale file is removed");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, [std::ffi::OsString::from("bridge.toml")], "no temporary file stays behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
