//! The release as a person without a Rust toolchain gets it: dist builds this host's archives and
//! installers as the release workflow does (`dist build`, local then global artifacts), a local HTTP
//! server serves them where the installer looks, and the installer runs in a fresh Debian root (the
//! local base image, nothing of Rust in it). The bridge it installs logs in to a server here and its
//! agent talks with one on this machine. An archive whose bytes do not match the SHA-256 the
//! installer carries is refused, and nothing is installed. The Linux binaries need no glibc symbol
//! newer than the baseline (they are static: none at all).
//!
//! Slow (a release build, a fresh root with its packages), so it runs when asked: `./test --slow`, or
//! `cargo test -p relay-tests --test it -- --ignored release::` with dist on PATH or in
//! target/tools/dist (`./test --slow` installs it, and the musl target and musl-tools it builds with).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use relay_proto::release::VERSION;
use relay_tests::mcp::{Bridge, bridge, text};
use relay_tests::pg::TestDb;
use relay_tests::pg::container::LIMITS;
use relay_tests::process::{COMMAND_LIMIT, INSTALL_LIMIT, RunWithin};
use relay_tests::server::Server;
use serde_json::json;

/// The platform this host's release archives are for.
const TARGET: &str = "x86_64-unknown-linux-musl";
/// A release build of the workspace, optimized across crates.
const BUILD_LIMIT: Duration = Duration::from_secs(60 * 60);
/// glibc's version the Linux binaries may need at most.
const GLIBC_BASELINE: (u32, u32) = (2, 28);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// dist: `DIST`, else the one `./test --slow` installed, else on PATH.
fn dist() -> PathBuf {
    if let Some(dist) = std::env::var_os("DIST") {
        return PathBuf::from(dist);
    }
    let installed = workspace().join("target/tools/dist/bin/dist");
    if installed.exists() { installed } else { PathBuf::from("dist") }
}

fn said(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// The release's files for this host, built once per run: target/distrib.
fn built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let distrib = workspace().join("target/distrib");
        let _ = std::fs::remove_dir_all(&distrib);
        // As the release workflow: each platform's archives with their manifest, then the
        // installers, which carry each archive's SHA-256 from it.
        let local = Command::new(dist())
            .args(["build", "--artifacts=local", "--target", TARGET, "--output-format=json"])
            .current_dir(workspace())
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output_within(BUILD_LIMIT)
            .unwrap_or_else(|e| panic!("cannot run dist ({e}): ./test --slow installs it"));
        assert!(local.status.success(), "dist build --artifacts=local failed (its output is above)");
        std::fs::write(distrib.join(format!("{TARGET}-dist-manifest.json")), &local.stdout).unwrap();
        let global = Command::new(dist())
            .args(["build", "--artifacts=global", "--target", TARGET])
            .current_dir(workspace())
            .stdin(Stdio::null())
            .output_within(COMMAND_LIMIT)
            .unwrap();
        assert!(global.status.success(), "dist build --artifacts=global: {}", said(&global));
        distrib
    })
}

/// Serves the files of `dir` over plain HTTP on a loopback port; its URL.
async fn serve(dir: PathBuf) -> String {
    use axum::extract::{Path as UrlPath, State};
    use axum::http::StatusCode;
    async fn file(State(dir): State<PathBuf>, UrlPath(name): UrlPath<String>) -> Result<Vec<u8>, StatusCode> {
        if name.contains('/') || name.starts_with('.') {
            return Err(StatusCode::NOT_FOUND);
        }
        std::fs::read(dir.join(name)).map_err(|_| StatusCode::NOT_FOUND)
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/{name}", axum::routing::get(file)).with_state(dir);
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// A fresh Debian root: the local base image (debootstrap's minbase, built once), on this host's
/// network, removed when dropped.
struct FreshRoot {
    name: String,
}

impl FreshRoot {
    fn start() -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("container/debian-base.sh");
        let out = Command::new(&script).stdin(Stdio::null()).output_within(INSTALL_LIMIT).expect("debian-base.sh");
        assert!(out.status.success(), "the Debian base image: {}", said(&out));
        let image = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        let name = format!("relay-release-test-{}-{}", std::process::id(), rand::random::<u32>());
        let mut run = vec!["run", "-d", "--name", &name, "--network", "host"];
        run.extend(LIMITS);
        run.extend([image.as_str(), "sleep", "infinity"]);
        let started = podman(&run, &[]);
        assert!(started.status.success(), "podman run: {}", said(&started));
        let root = Self { name };
        // What the installer needs of a system: a downloader (minbase has none) and the CA roots.
        let packages = root.sh(
            "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends curl ca-certificates >/dev/null",
            &[],
        );
        assert!(packages.status.success(), "curl in the fresh root: {}", said(&packages));
        let rust = root.sh("command -v cargo || command -v rustc || ls -d /root/.cargo /usr/local/cargo", &[]);
        assert!(!rust.status.success(), "the fresh root has no Rust toolchain: {}", said(&rust));
        root
    }

    /// Runs `script` in the root with `env` passed from podman's own environment (no value on a
    /// command line).
    fn sh(&self, script: &str, env: &[(&str, &str)]) -> Output {
        let mut args = vec!["exec"];
        for (name, _) in env {
            args.extend(["-e", name]);
        }
        args.extend([self.name.as_str(), "bash", "-c", script]);
        podman(&args, env)
    }
}

impl Drop for FreshRoot {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name], &[]);
    }
}

fn podman(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("podman")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output_within(INSTALL_LIMIT)
        .expect("run podman (./test installs it)")
}

/// The one-line install as the README gives it, with the download pointed at the local server
/// (plain HTTP on loopback, where the README's is HTTPS).
const INSTALL: &str = "curl --proto '=http' -LsSf \"$AGENT_BRIDGE_DOWNLOAD_URL/agent-bridge-installer.sh\" | sh";

#[tokio::test(flavor = "multi_thread")]
#[ignore = "slow: a release build and a fresh Debian root; ./test --slow runs it"]
async fn a_fresh_debian_gets_a_working_bridge_from_one_command() {
    let distrib = tokio::task::spawn_blocking(built).await.unwrap();
    let url = serve(distrib.to_path_buf()).await;
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let fresh_token = server.machine("acme", "fresh");
    let host_token = server.machine("acme", "host");

    let root = tokio::task::spawn_blocking(FreshRoot::start).await.unwrap();
    let installed = root.sh(INSTALL, &[("AGENT_BRIDGE_DOWNLOAD_URL", &url)]);
    assert!(installed.status.success(), "the installer: {}", said(&installed));
    let version = root.sh("/root/.local/bin/agent-bridge --version", &[]);
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("agent-bridge {VERSION}"),
        "{}",
        said(&version)
    );

    // Logged in as a person does, the token from the environment, never on a command line.
    let login = root
        .sh(&format!("/root/.local/bin/agent-bridge login --server {}", server.url), &[("RELAY_TOKEN", &fresh_token)]);
    assert!(login.status.success(), "login in the fresh root: {}", said(&login));
    assert!(said(&login).contains("logged in as machine acme/fresh"), "{}", said(&login));

    // Its agent, and one on this machine.
    let mut alice = Bridge::over({
        let mut cmd = tokio::process::Command::new("podman");
        cmd.args(["exec", "-i", &root.name, "/root/.local/bin/agent-bridge", "mcp", "--handle", "alice"]);
        cmd
    });
    alice.initialize("2025-06-18").await;
    assert!(text(&alice.tool_ok("relay_whoami", json!({})).await).contains("acme/fresh/alice"));
    let mut bob = bridge(&server.url, &host_token, "bob");
    bob.initialize("2025-06-18").await;
    alice.tool_ok("relay_send", json!({ "to": "host/bob", "body": "installed in one line" })).await;
    let inbox = bob.tool_ok("relay_inbox", json!({})).await;
    assert!(
        text(&inbox).contains("installed in one line") && text(&inbox).contains("acme/fresh/alice"),
        "{}",
        text(&inbox)
    );
    bob.tool_ok("relay_send", json!({ "to": "fresh/alice", "body": "and it answers" })).await;
    let inbox = alice.tool_ok("relay_inbox", json!({})).await;
    assert!(text(&inbox).contains("and it answers"), "{}", text(&inbox));
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "slow: a release build and a fresh Debian root; ./test --slow runs it"]
async fn an_archive_that_does_not_match_its_checksum_is_refused_and_nothing_installed() {
    let distrib = tokio::task::spawn_blocking(built).await.unwrap();
    // The same release, with one byte of the bridge's archive changed on its way.
    let tampered = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(distrib).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, tampered.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let archive = tampered.path().join(format!("agent-bridge-{TARGET}.tar.gz"));
    let mut bytes = std::fs::read(&archive).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&archive, bytes).unwrap();
    let url = serve(tampered.path().to_path_buf()).await;

    let root = tokio::task::spawn_blocking(FreshRoot::start).await.unwrap();
    let refused = root.sh(INSTALL, &[("AGENT_BRIDGE_DOWNLOAD_URL", &url)]);
    assert!(!refused.status.success(), "the tampered archive was installed: {}", said(&refused));
    assert!(said(&refused).contains("checksum mismatch"), "the installer says why: {}", said(&refused));
    let nothing = root.sh("ls /root/.local/bin/agent-bridge", &[]);
    assert!(!nothing.status.success(), "nothing is installed: {}", said(&nothing));
}

#[test]
#[ignore = "slow: a release build; ./test --slow runs it"]
fn the_homebrew_formulas_fetch_the_release_archives_by_their_checksums() {
    let distrib = built();
    for program in ["agent-bridge", "relay-server"] {
        let formula = std::fs::read_to_string(distrib.join(format!("{program}.rb"))).unwrap();
        let archive = format!("{program}-{TARGET}.tar.gz");
        let checksum = std::fs::read_to_string(distrib.join(format!("{archive}.sha256"))).unwrap();
        let checksum = checksum.split_whitespace().next().unwrap();
        let url = format!("{}/download/v{VERSION}/{archive}", relay_proto::release::RELEASES);
        assert!(formula.contains(&format!("url \"{url}\"")), "{program}.rb fetches {url}:\n{formula}");
        assert!(formula.contains(&format!("sha256 \"{checksum}\"")), "{program}.rb checks {checksum}:\n{formula}");
    }
}

/// The newest glibc symbol version `binary` asks for, and whether it loads anything at run time (an
/// interpreter, a library), as readelf reads its headers.
fn glibc_needs(binary: &Path) -> (Option<(u32, u32)>, bool) {
    let readelf = |args: &[&str]| {
        let out = Command::new("readelf").args(args).arg(binary).output_within(COMMAND_LIMIT).expect("readelf");
        assert!(out.status.success(), "readelf {args:?} {}: {}", binary.display(), said(&out));
        said(&out)
    };
    let versions = readelf(&["--version-info", "--wide"]);
    let newest = versions
        .split("GLIBC_")
        .skip(1)
        .filter_map(|rest| {
            let version: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
            let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .max();
    let headers = readelf(&["--program-headers", "--dynamic", "--wide"]);
    (newest, headers.contains("INTERP") || headers.contains("(NEEDED)"))
}

#[test]
#[ignore = "slow: a release build; ./test --slow runs it"]
fn the_linux_binaries_need_no_glibc_newer_than_the_baseline() {
    // The check sees glibc where it is needed: this host's own build of the bridge links it.
    let (host_glibc, host_dynamic) = glibc_needs(&relay_tests::bin("agent-bridge"));
    assert!(host_glibc.is_some() && host_dynamic, "the check reads a glibc build's needs: {host_glibc:?}");
    let distrib = built();
    for program in ["agent-bridge", "relay-server"] {
        let binary = distrib.join(format!("{program}-{TARGET}")).join(program);
        assert!(binary.is_file(), "{} is in the release", binary.display());
        let (newest, dynamic) = glibc_needs(&binary);
        assert!(newest.is_none_or(|v| v <= GLIBC_BASELINE), "{program} needs glibc {newest:?}");
        // Static: no interpreter, no library to find on the user's system, so no glibc at all.
        assert!(!dynamic && newest.is_none(), "{program} loads something at run time");
    }
}
