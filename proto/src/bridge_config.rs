//! The bridge's config file, which `relay-server dev` writes so `agent-bridge mcp` works at once.
//!
//! Format (TOML, mode 0600): `server = "URL"` (or several replicas' URLs, comma-separated), `token =
//! "MACHINE TOKEN"`, optional `ca = "PEM PATH"`.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot find the home directory; set RELAY_CONFIG")]
    NoHome,
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} cannot be used: line {line}, column {column}: {message}; {fix}")]
    Malformed { path: PathBuf, line: usize, column: usize, message: String, fix: &'static str },
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

/// `RELAY_CONFIG`, else `bridge.toml` in [`config_dir`].
pub fn default_path() -> Result<PathBuf, ConfigError> {
    if let Some(path) = std::env::var_os("RELAY_CONFIG").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    Ok(config_dir().ok_or(ConfigError::NoHome)?.join("bridge.toml"))
}

/// The directory of the bridge's files, by the platform's convention: `~/.config/agent-relay` on
/// Linux and other Unix systems, `~/Library/Application Support/agent-relay` on macOS,
/// `%LOCALAPPDATA%\agent-relay` on Windows (a machine's token does not roam with a profile).
///
/// On Linux it is not moved by `XDG_CONFIG_HOME`: clients start the bridge with an environment of
/// their choosing (Codex passes a fixed few variables), and the bridge they start must find the file
/// that `agent-bridge login`, run from the person's shell, wrote.
pub fn config_dir() -> Option<PathBuf> {
    #[cfg(any(target_os = "macos", windows))]
    let base = dirs::config_local_dir();
    #[cfg(not(any(target_os = "macos", windows)))]
    let base = dirs::home_dir().map(|home| home.join(".config"));
    base.map(|dir| dir.join("agent-relay"))
}

/// What to do about a bridge config that cannot be used.
const FIX: &str = "fix that line, or write the file anew with `agent-bridge login --server URL`";

/// Reads the file: `None` when there is none; an error naming the file, the line and the fix when
/// it cannot be read or used.
pub fn read(path: &Path) -> Result<Option<BridgeConfig>, ConfigError> {
    read_toml(path, FIX)
}

/// Parses a bridge config's text; `path` names it in the error.
pub fn parse(path: &Path, text: &str) -> Result<BridgeConfig, ConfigError> {
    parse_toml(path, text, FIX)
}

/// Reads a TOML file of the bridge's: `None` when there is none; an error naming the file, the line
/// and `fix` when it cannot be read or used.
pub fn read_toml<T: DeserializeOwned>(path: &Path, fix: &'static str) -> Result<Option<T>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_toml(path, &text, fix).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigError::Read { path: path.to_path_buf(), source }),
    }
}

fn parse_toml<T: DeserializeOwned>(path: &Path, text: &str, fix: &'static str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map_or((1, 1), |span| line_and_column(text, span.start));
        let message = e.message().trim().to_owned();
        ConfigError::Malformed { path: path.to_path_buf(), line, column, message, fix }
    })
}

/// The 1-based line and column (in characters) of byte `offset` in `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Writes the file with owner-only permissions, replacing it atomically.
pub fn write(path: &Path, config: &BridgeConfig) -> Result<(), ConfigError> {
    let text = toml::to_string(config)?;
    // An earlier version wrote through this fixed name, which a stale copy with loose permissions
    // could turn into a readable config: it goes, and is never used again.
    let _ = std::fs::remove_file(path.with_extension("toml.tmp"));
    write_private(path, text.as_bytes())
}

/// Writes `contents` to `path` for its owner alone, replacing it atomically. The bytes go to a
/// temporary file created new (never one left lying around), owner-only, and then renamed over
/// `path`, so no other user can read them at any moment. On Unix a directory made here is 0700, and
/// so is the bridge's own directory when it exists with looser permissions; on Windows the files
/// live under the user's profile, whose permissions already keep other users out.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), ConfigError> {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    private_dir_builder().recursive(true).create(dir).map_err(write_err(dir))?;
    #[cfg(unix)]
    if config_dir().is_some_and(|own| own == dir) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(write_err(dir))?;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (tmp, mut file) = loop {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.{}.{nanos}.{n}.tmp", std::process::id()));
        match private_file_options().write(true).create_new(true).open(&tmp) {
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

/// A directory builder that makes directories only their owner can enter (0700 on Unix).
pub fn private_dir_builder() -> std::fs::DirBuilder {
    #[allow(unused_mut)]
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder
}

/// Open options that create files only their owner can read (0600 on Unix).
fn private_file_options() -> std::fs::OpenOptions {
    #[allow(unused_mut)]
    let mut options = std::fs::OpenOptions::new();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_file_is_named_with_its_line_and_the_fix() {
        let path = Path::new("/home/ada/.config/agent-relay/bridge.toml");
        let text = "server = \"http://127.0.0.1:7447\"\ntoken = rlm_unquoted\n";
        let err = parse(path, text).unwrap_err();
        assert!(matches!(err, ConfigError::Malformed { line: 2, column: 9, .. }), "{err:?}");
        let said = err.to_string();
        assert!(
            said.starts_with("/home/ada/.config/agent-relay/bridge.toml cannot be used: line 2, column 9:"),
            "{said}"
        );
        assert!(said.contains("agent-bridge login --server URL"), "{said}");
        let missing = parse(path, "server = \"http://x\"\n").unwrap_err().to_string();
        assert!(missing.contains("token"), "a missing key is named: {missing}");
    }

    #[test]
    fn an_absent_file_is_none_and_an_unreadable_one_an_error() {
        let dir = tempfile_dir("absent");
        assert!(read(&dir.join("bridge.toml")).unwrap().is_none());
        assert!(matches!(read(&dir), Err(ConfigError::Read { .. })), "a directory cannot be read as the file");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir(what: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("relay-config-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[cfg(unix)]
    #[test]
    fn round_trips_with_owner_only_permissions() {
        let dir = std::env::temp_dir().join(format!("relay-config-test-{}", std::process::id()));
        let path = dir.join("nested").join("bridge.toml");
        let config =
            BridgeConfig { server: "http://127.0.0.1:7447".into(), token: "rlm_x".into(), ..Default::default() };
        write(&path, &config).unwrap();
        assert_eq!(read(&path).unwrap(), Some(config));
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions()) & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_stale_loose_temporary_file_never_becomes_the_config() {
        use std::os::unix::fs::PermissionsExt;
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
