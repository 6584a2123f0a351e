//! The workspace compiled for macOS and Windows from this Linux machine, so a change that builds
//! only on Linux is caught here and not first on their CI runners: `cargo check` of every crate and
//! target for `x86_64-pc-windows-gnu` (MinGW compiles ring's C) and, through cargo-zigbuild (zig
//! compiles it), for `aarch64-apple-darwin`. It compiles; it links nothing and runs nothing, which only
//! those runners do (docs/testing.md).
//!
//! Slow (the dependencies compiled twice more), so it runs when asked: `./test --slow`, which installs
//! the two targets, MinGW and the zig venv (`target/cross-venv`), or
//! `cargo test -p relay-tests --test it -- --ignored cross::`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use relay_tests::process::RunWithin;

/// A check of the workspace for another target, its dependencies compiled cold.
const CHECK_LIMIT: Duration = Duration::from_secs(40 * 60);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `cargo check` (or `cargo-zigbuild check`) of the whole workspace for `target`; its errors when it fails.
fn check(mut cargo: Command, target: &str) {
    // The workspace's own warnings fail it too (dependencies' are capped by cargo, as always).
    let out = cargo
        .args(["check", "--workspace", "--all-targets", "--locked", "--target", target])
        .env("RUSTFLAGS", "-D warnings")
        .current_dir(workspace())
        .stdin(Stdio::null())
        .output_within(CHECK_LIMIT)
        .unwrap_or_else(|e| panic!("cannot run the check for {target} ({e}): ./test --slow installs what it needs"));
    assert!(out.status.success(), "the workspace for {target}:\n{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
#[ignore = "slow: the workspace compiled for two more targets; ./test --slow runs it"]
fn the_workspace_compiles_for_windows() {
    check(Command::new("cargo"), "x86_64-pc-windows-gnu");
}

#[test]
#[ignore = "slow: the workspace compiled for two more targets; ./test --slow runs it"]
fn the_workspace_compiles_for_macos() {
    let venv = workspace().join("target/cross-venv/bin");
    let mut zigbuild = Command::new(venv.join("cargo-zigbuild"));
    // cargo-zigbuild finds zig as `python -m ziglang` of the venv's Python.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![venv];
    dirs.extend(std::env::split_paths(&path));
    zigbuild.env("PATH", std::env::join_paths(dirs).unwrap());
    check(zigbuild, "aarch64-apple-darwin");
}
