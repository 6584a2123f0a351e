//! Setting a server up: admin commands that find a dev server's database by its data dir, and the
//! warnings that keep a database password off the command line.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use relay_tests::client::Agent;
use relay_tests::pg::TestDb;
use relay_tests::server::{terminate, wait_serving};
use relay_tests::{bin, free_port};

/// Longest any one command of these tests may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(60);

/// Runs `relay-server ARGS` without any database settings from the test's environment.
async fn relay_server(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = tokio::process::Command::new(bin("relay-server"));
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("RELAY_DATA_DIR")
        .env("RELAY_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (key, value) in env {
        cmd.env(key, value);
    }
    tokio::time::timeout(COMMAND_LIMIT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("relay-server {args:?} took longer than {COMMAND_LIMIT:?}"))
        .expect("run relay-server")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A `relay-server` process (dev or serve); dropped early (a failed assertion), it is still stopped with
/// SIGTERM, so that dev stops its Postgres too.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        for _ in 0..200 {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A data dir the postgres user can reach when the tests run as root (the dev cluster then runs as
/// postgres), and a home for the bridge config dev writes.
struct Dirs {
    _root: tempfile::TempDir,
    data: PathBuf,
    home: PathBuf,
    log: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::Builder::new().prefix("relay-setup-test-").tempdir_in("/tmp").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = root.path().join("home");
    std::fs::create_dir(&home).unwrap();
    Dirs { data: root.path().join("data"), log: root.path().join("dev.log"), home, _root: root }
}

#[tokio::test]
async fn admin_finds_the_dev_servers_database_by_its_data_dir() {
    let dirs = dirs();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let data = dirs.data.to_str().unwrap();

    // Before dev ever ran there is no database to find, and the error says how to make one.
    let none = relay_server(&["admin", "--data-dir", data, "account", "create", "globex"], &[]).await;
    assert!(!none.status.success());
    let said = stderr(&none);
    assert!(
        said.contains("no dev database under") && said.contains(&format!("relay-server dev --data-dir {data}")),
        "{said}"
    );

    let dev = Command::new(bin("relay-server"))
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--data-dir", data])
        .env_remove("DATABASE_URL")
        .env_remove("RELAY_DATA_DIR")
        .env("HOME", &dirs.home)
        .env("RELAY_CONFIG", dirs.home.join("bridge.toml"))
        .env("RELAY_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&dirs.log).unwrap())
        .spawn()
        .unwrap();
    let mut dev = Running(dev);
    wait_serving(&url).await;

    // It says how a second machine joins: the admin command for here, the login for there.
    let printed = std::fs::read_to_string(&dirs.log).unwrap();
    assert!(
        printed.contains(&format!("\n  relay-server admin --data-dir {data} machine add local/OTHER\n")),
        "{printed}"
    );
    assert!(printed.contains(&format!("\n  agent-bridge login --server {url}\n")), "{printed}");

    // No DATABASE_URL anywhere: the data dir is enough, as a flag or from RELAY_DATA_DIR.
    let created = relay_server(&["admin", "--data-dir", data, "account", "create", "globex"], &[]).await;
    assert!(created.status.success(), "{}", stderr(&created));
    let added = relay_server(&["admin", "machine", "add", "globex/box"], &[("RELAY_DATA_DIR", &dirs.data)]).await;
    assert!(added.status.success(), "{}", stderr(&added));
    let token = String::from_utf8(added.stdout).unwrap();
    assert_eq!(token.lines().count(), 1, "the token alone on stdout: {token:?}");
    let agent = Agent::hello(&url, token.trim(), "worker").await.expect("the new machine's token works");
    assert_eq!(agent.address, "globex/box/worker");

    // The flag may also come after the subcommand.
    let contact = relay_server(&["admin", "contact", "add", "local", "globex", "--data-dir", data], &[]).await;
    assert!(contact.status.success(), "{}", stderr(&contact));

    assert!(terminate(&mut dev.0).await.success());

    // With dev stopped, its cluster is down too: the error says so and how to start it.
    let down = relay_server(&["admin", "--data-dir", data, "machine", "add", "globex/other"], &[]).await;
    assert!(!down.status.success());
    assert!(down.stdout.is_empty());
    let said = stderr(&down);
    assert!(
        said.contains(&format!("the dev database under {data} is not running"))
            && said.contains(&format!("`relay-server dev --data-dir {data}`")),
        "{said}"
    );
}
/// A database URL for the test database with a password in it, and that password. The harness's
/// cluster trusts local connections, so any password is accepted.
fn url_with_password(db: &TestDb) -> (String, String) {
    let config: tokio_postgres::Config = db.url.parse().unwrap();
    if let Some(password) = config.get_password() {
        return (db.url.clone(), String::from_utf8_lossy(password).into_owned());
    }
    let password = "pw-on-the-command-line-7f3a".to_owned();
    let url = if db.url.starts_with("postgres://") || db.url.starts_with("postgresql://") {
        let sep = if db.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}password={password}", db.url)
    } else {
        format!("{} password={password}", db.url)
    };
    (url, password)
}

const ARGV_WARNING: &str = "the password in --database-url is visible to every user of this machine";

#[tokio::test]
async fn a_password_on_the_command_line_draws_a_warning_that_does_not_repeat_it() {
    let db = TestDb::new().await;
    let (url, password) = url_with_password(&db);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let port = free_port();
    let server = Command::new(bin("relay-server"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--database-url", &url])
        .env_remove("DATABASE_URL")
        .env("RELAY_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut server = Running(server);
    wait_serving(&format!("http://127.0.0.1:{port}")).await;
    assert!(terminate(&mut server.0).await.success());
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(said.matches(ARGV_WARNING).count(), 1, "warned once: {said}");
    assert!(said.contains("DATABASE_URL") && !said.contains(&password), "{said}");

    // admin takes --database-url too, and warns the same way.
    let admin = relay_server(&["admin", "--database-url", &url, "account", "create", "acme"], &[]).await;
    assert!(admin.status.success(), "{}", stderr(&admin));
    let said = stderr(&admin);
    assert!(said.contains(ARGV_WARNING) && !said.contains(&password), "{said}");

    // The same URL from the environment is not on the command line: no warning.
    let quiet = Command::new(bin("relay-server"))
        .args(["admin", "account", "create", "initech"])
        .env("DATABASE_URL", &url)
        .output()
        .unwrap();
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    assert!(!stderr(&quiet).contains(ARGV_WARNING), "{}", stderr(&quiet));
}
