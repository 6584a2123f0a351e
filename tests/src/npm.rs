//! Programs the tests run that come from npm, pinned by a lock file under `tests/NAME` and
//! installed into `target/NAME` (as `./test` does beforehand; a test run directly with cargo
//! installs them too).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::bin;
use crate::process::{INSTALL_LIMIT, RunWithin};

/// The marker `./test` checks too: the lock file the installed packages came from.
const MARKER: &str = ".relay-installed-lock.json";

/// `target/NAME/node_modules/.bin`, after installing `tests/NAME`'s packages (`what`, for the
/// message) when they are missing or older than its lock file; `after` runs once after an
/// install. One process installs at a time (a lock file).
pub fn installed(name: &str, what: &str, after: impl FnOnce(&Path)) -> PathBuf {
    // bin() is target/<profile>/agent-bridge.
    let profile = bin("agent-bridge").parent().expect("profile directory").to_path_buf();
    let dir = profile.parent().expect("target directory").join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(".lock")).unwrap();
    lock.lock().unwrap_or_else(|e| panic!("lock {}: {e}", dir.display()));
    let wanted = std::fs::read(source.join("package-lock.json")).expect("the packages' lock file");
    let marker = dir.join("node_modules").join(MARKER);
    if std::fs::read(&marker).ok().as_deref() != Some(wanted.as_slice()) {
        for file in ["package.json", "package-lock.json"] {
            std::fs::copy(source.join(file), dir.join(file)).expect("copy the package files");
        }
        eprintln!("installing {what} from npm into {}; once per lock file", dir.display());
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .status_within(INSTALL_LIMIT)
            .unwrap_or_else(|e| {
                panic!("cannot run npm ({e}): these tests need Node.js and npm (./test installs them)")
            });
        assert!(status.success(), "npm ci in {} failed: see its output above", dir.display());
        after(&dir);
        std::fs::write(&marker, &wanted).expect("record the installed lock file");
    }
    dir.join("node_modules").join(".bin")
}

/// A program of `tests/tools` (buf).
pub fn tool(name: &str) -> PathBuf {
    static READY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = READY.get_or_init(|| installed("tools", "the test tools (buf)", |_| {}));
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing after npm ci", path.display());
    path
}
