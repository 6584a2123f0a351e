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
        relay_tests::signal(self.0.id(), libc::SIGTERM);
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

    let console = format!("127.0.0.1:{}", free_port());
    let dev = Command::new(bin("relay-server"))
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--data-dir", data])
        .env("RELAY_CONSOLE_LISTEN", &console)
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
    // And where its web console is.
    assert!(printed.contains(&format!("\nconsole: http://{console}  (sign in with a human token: ")), "{printed}");
    let sign_in = relay_tests::http::get(&console, "/sign-in").await;
    assert!(sign_in.is_some_and(|(status, page)| status == 200 && page.contains("Sign in to Relay")));

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

/// Someone whose default data dir and home are a test's own: the tests' user, or, when the tests run
/// as root (whose default data dir is the fixed /var/lib/agent-relay), the postgres user with its
/// HOME and XDG_DATA_HOME here, so nothing outside the test's directories is touched.
struct Newcomer {
    ids: Option<(u32, u32)>,
    home: PathBuf,
    /// The relay-server it runs: for another user, a copy beside its home, as the build's own may
    /// lie in a checkout only its owner can enter (a home directory of mode 0700).
    program: PathBuf,
}

impl Newcomer {
    fn new(dirs: &Dirs) -> Self {
        use std::os::unix::fs::MetadataExt;
        let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
        let ids = root.then(|| {
            let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
            let entry = passwd.lines().find(|l| l.starts_with("postgres:")).expect("a postgres user");
            let fields: Vec<&str> = entry.split(':').collect();
            (fields[2].parse().unwrap(), fields[3].parse().unwrap())
        });
        let mut program = bin("relay-server");
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::chown(&dirs.home, Some(uid), Some(gid)).unwrap();
            let copy = dirs.home.parent().expect("the test's directory").join("relay-server");
            std::fs::copy(&program, &copy).expect("copy relay-server for the postgres user");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
            program = copy;
        }
        Self { ids, home: dirs.home.clone(), program }
    }

    /// Where `relay-server dev` keeps its cluster by default, for this user.
    fn default_data_dir(&self) -> PathBuf {
        self.home.join(".local/share/agent-relay")
    }

    /// `relay-server ARGS` as this user, with no database settings and no RELAY_CONFIG.
    fn relay_server(&self, args: &[&str]) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(&self.program);
        cmd.args(args)
            .env_remove("DATABASE_URL")
            .env_remove("RELAY_DATA_DIR")
            .env_remove("RELAY_CONFIG")
            .env("HOME", &self.home)
            .env("XDG_DATA_HOME", self.home.join(".local/share"))
            .env("RELAY_LOG", "warn")
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.ids {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    /// `relay-server dev` on `port` with nothing but defaults; its output goes to `log`.
    async fn dev(&self, port: u16, log: &Path) -> Running {
        let child = self
            .relay_server(&["dev", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let dev = Running(child);
        wait_serving(&format!("http://127.0.0.1:{port}")).await;
        dev
    }
}

/// Runs a command to its end, within [`COMMAND_LIMIT`].
async fn output(cmd: Command) -> Output {
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    tokio::time::timeout(COMMAND_LIMIT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{cmd:?} took longer than {COMMAND_LIMIT:?}"))
        .expect("run the command")
}

/// `first | second`, as a shell runs it: what the first prints goes straight into the second, never
/// through this test or a file. Returns the first's stderr and the second's output.
async fn pipe(mut first: Command, mut second: Command) -> (String, Output) {
    first.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut first = tokio::process::Command::from(first);
    let mut first = first.kill_on_drop(true).spawn().unwrap();
    let piped: Stdio = first.stdout.take().unwrap().try_into().unwrap();
    second.stdin(piped).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut second = tokio::process::Command::from(second);
    second.kill_on_drop(true);
    let (first, second) =
        tokio::time::timeout(COMMAND_LIMIT, async { tokio::join!(first.wait_with_output(), second.output()) })
            .await
            .unwrap_or_else(|_| panic!("a pipeline took longer than {COMMAND_LIMIT:?}"));
    let first = first.unwrap();
    assert!(first.status.success(), "the first command failed: {}", stderr(&first));
    (stderr(&first), second.unwrap())
}

/// `agent-bridge ARGS` on a computer of its own: `home` holds its config, and no relay settings
/// come from the test's environment.
fn agent_bridge(home: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin("agent-bridge"));
    cmd.args(args)
        .current_dir(home)
        .env("HOME", home)
        .env_remove("RELAY_CONFIG")
        .env_remove("RELAY_HUMAN_CONFIG")
        .env_remove("RELAY_SERVER")
        .env_remove("RELAY_TOKEN")
        .env_remove("RELAY_HUMAN_TOKEN")
        .env_remove("RELAY_CA")
        .stdin(Stdio::null());
    cmd
}

fn said(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &stderr(out)
}

#[tokio::test]
async fn admin_with_no_flag_and_no_database_url_uses_the_default_dev_cluster() {
    let dirs = dirs();
    let user = Newcomer::new(&dirs);
    let default = user.default_data_dir();

    // Before dev ever ran, the error names the default data dir (derived from the user's data dir).
    let none = output(user.relay_server(&["admin", "account", "create", "globex"])).await;
    assert!(!none.status.success());
    assert!(stderr(&none).contains(&format!("no dev database under {}", default.display())), "{}", stderr(&none));

    let port = free_port();
    let mut dev = user.dev(port, &dirs.log).await;
    assert!(default.join("pg").join("PG_VERSION").exists(), "dev keeps its cluster under {}", default.display());

    // No --data-dir, no RELAY_DATA_DIR, no DATABASE_URL: admin finds dev's cluster by itself.
    let created = output(user.relay_server(&["admin", "account", "create", "globex"])).await;
    assert!(created.status.success(), "{}", stderr(&created));
    let added = output(user.relay_server(&["admin", "machine", "add", "globex/box"])).await;
    assert!(added.status.success(), "{}", stderr(&added));
    let token = String::from_utf8(added.stdout).unwrap();
    let agent =
        Agent::hello(&format!("http://127.0.0.1:{port}"), token.trim(), "worker").await.expect("the token works");
    assert_eq!(agent.address, "globex/box/worker");

    assert!(terminate(&mut dev.0).await.success());
}

/// The walk-through of the README and docs/reach-and-trust.md, as a newcomer runs it: `relay-server dev`, a second account and
/// machines added with `relay-server admin` (no database settings), each machine logged in with its
/// token piped straight in, the two accounts' people making the contact from the human CLI, and then
/// an agent of one account messaging an agent of the other.
#[tokio::test]
async fn from_relay_server_dev_to_two_accounts_talking() {
    use relay_tests::mcp::{Bridge, text};
    use serde_json::json;

    let dirs = dirs();
    let user = Newcomer::new(&dirs);
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut dev = user.dev(port, &dirs.log).await;
    let admin = |args: &[&str]| user.relay_server(&[&["admin"][..], args].concat());

    // The laptop: dev wrote its bridge config. Then a second machine of `local`, and account globex
    // with a machine and people for both accounts.
    let laptop_config = user.home.join(".config/agent-relay/bridge.toml");
    assert!(laptop_config.exists(), "dev writes this machine's bridge config");
    let created = output(admin(&["account", "create", "globex"])).await;
    assert!(created.status.success(), "{}", stderr(&created));
    let computers = tempfile::tempdir().unwrap();
    let computer = |name: &str| {
        let home = computers.path().join(name);
        std::fs::create_dir(&home).unwrap();
        home
    };
    let (buildbox, globex_box) = (computer("buildbox"), computer("globex-box"));
    let (local_person, globex_person) = (computer("local-person"), computer("globex-person"));
    for (machine, home) in [("local/buildbox", &buildbox), ("globex/box", &globex_box)] {
        let (_, login) =
            pipe(admin(&["machine", "add", machine]), agent_bridge(home, &["login", "--server", &url])).await;
        assert!(login.status.success(), "{}", said(&login));
        assert!(said(&login).contains(&format!("logged in as machine {machine}")), "{}", said(&login));
    }
    for (account, home) in [("local", &local_person), ("globex", &globex_person)] {
        let (_, login) =
            pipe(admin(&["human", "add", account]), agent_bridge(home, &["human", "login", "--server", &url])).await;
        assert!(login.status.success(), "{}", said(&login));
    }

    // Agents on the laptop (account local), the build box (local) and globex's box.
    let mut alice = Bridge::start_configured(&laptop_config, "alice");
    let mut bob = Bridge::start_configured(&buildbox.join(".config/agent-relay/bridge.toml"), "bob");
    let mut carol = Bridge::start_configured(&globex_box.join(".config/agent-relay/bridge.toml"), "carol");
    for b in [&mut alice, &mut bob, &mut carol] {
        b.initialize("2025-06-18").await;
    }
    let me = alice.tool_ok("relay_whoami", json!({})).await;
    let alice_address = me["structuredContent"]["address"].as_str().unwrap().to_owned();
    assert!(alice_address.starts_with("local/") && alice_address.ends_with("/alice"), "{alice_address}");
    carol.tool_ok("relay_whoami", json!({})).await;

    // Without a contact globex's agents are out of reach.
    let refused = alice.tool("relay_send", json!({ "to": "globex/box/carol", "body": "hello?" })).await;
    assert_eq!(refused["isError"], true, "{refused}");

    // The two accounts' people make the contact.
    let asked = output(agent_bridge(&local_person, &["human", "contact", "request", "globex"])).await;
    assert!(asked.status.success() && said(&asked).contains("asked globex for a contact"), "{}", said(&asked));
    let accepted = output(agent_bridge(&globex_person, &["human", "contact", "accept", "local"])).await;
    assert!(accepted.status.success() && said(&accepted).contains("contact with local made"), "{}", said(&accepted));

    // Across accounts, and back.
    alice.tool_ok("relay_send", json!({ "to": "globex/box/carol", "body": "the build is green" })).await;
    let inbox = carol.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    let got = &inbox["structuredContent"]["messages"];
    assert_eq!(got[0]["from"], alice_address.as_str(), "{inbox}");
    assert!(got[0]["body"].as_str().unwrap().contains("the build is green"), "{inbox}");
    carol.tool_ok("relay_reply", json!({ "id": "last", "body": "thanks, deploying" })).await;
    let answer = alice.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    assert!(text(&answer).contains("thanks, deploying") && text(&answer).contains("globex/box/carol"), "{answer}");

    // And to the account's own second machine, by machine/handle.
    alice.tool_ok("relay_send", json!({ "to": "buildbox/bob", "body": "pull main" })).await;
    let inbox = bob.tool_ok("relay_inbox", json!({ "wait_s": 10 })).await;
    assert_eq!(inbox["structuredContent"]["messages"][0]["from"], alice_address.as_str(), "{inbox}");

    for b in [&mut alice, &mut bob, &mut carol] {
        b.close();
    }
    assert!(terminate(&mut dev.0).await.success());
}
