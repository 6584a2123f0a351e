//! How soon an idle agent acts on its mail: a real Claude Code session (pinned, from npm),
//! interactive in a terminal, installed with `agent-bridge install claude`, sits idle; another
//! machine's agent sends it a message; the figure is the time from the send to the new model
//! request its wake hook starts. A scripted Messages API stands in for the model, answering at once.
//!
//! usage: relay-wake-bench [--wakes N]   (default 20, at most 200)
//! Before each send it waits until the session's waiter is back (`relay_mail_waiters` on the
//! server's /metrics), so each figure is one wake of an idle session. Bounded in count and time.
//! Build with `cargo build --release --workspace` and run `target/release/relay-wake-bench`.

use std::time::Duration;

use relay_tests::clients::{self, ClaudeProject};
use relay_tests::http;
use relay_tests::model_api::{Api, ModelApi};
use relay_tests::pg::{self, TestDb};
use relay_tests::server::Server;
use relay_tests::terminal::Terminal;
use serde_json::json;

/// No one wait may take longer than this.
const LIMIT: Duration = Duration::from_secs(60);

#[tokio::main]
pub async fn main() {
    let mut args = std::env::args().skip(1);
    let mut wakes = 20usize;
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next().and_then(|n| n.parse().ok())) {
            ("--wakes", Some(n)) if (1..=200).contains(&n) => wakes = n,
            _ => {
                eprintln!("usage: relay-wake-bench [--wakes N]   (1-200, default 20)");
                std::process::exit(2);
            }
        }
    }
    if std::env::var_os("DATABASE_URL").is_none() {
        pg::durable_cluster();
    }
    let db = TestDb::new().await;
    let ops = format!("127.0.0.1:{}", relay_tests::free_port());
    let server = Server::start_with_env(&db, relay_tests::free_port(), &[("RELAY_OPS_LISTEN", &ops)]).await;
    let (laptop, ci) = (server.machine("acme", "laptop"), server.machine("acme", "ci"));
    let api = ModelApi::start().await;
    let mut bob = relay_tests::mcp::bridge(&server.url, &ci, "bob");
    bob.initialize("2025-06-18").await;

    let project = ClaudeProject::new(&server.url, &laptop, &api.url);
    let env = project.env("alice");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let claude = clients::program("claude");
    let version = std::process::Command::new(&claude).arg("--version").output().unwrap();
    let term = Terminal::start(&project.dir(), &env, &claude, &[]);
    let waiting =
        || async { http::get(&ops, "/metrics").await.and_then(|(_, text)| http::sample(&text, "relay_mail_waiters")) };

    bob.wait_online("acme/laptop/alice", LIMIT).await;
    term.wait_for("\u{276f}", LIMIT).await;
    term.type_line("say hello");
    let (mut seen, _) = api.wait_for("the first turn", 0, LIMIT, |r| r.last_turn().contains("say hello")).await;
    let mut samples = Vec::with_capacity(wakes);
    for n in 0..wakes {
        relay_tests::eventually(LIMIT, "the session's waiter", || async {
            (waiting().await == Some(1.0)).then_some(())
        })
        .await;
        let sent_at = tokio::time::Instant::now();
        let sent = bob.tool_ok("relay_send", json!({ "to": "laptop/alice", "body": format!("wake {n}") })).await;
        let short = relay_tests::short_id(sent["structuredContent"]["id"].as_str().unwrap()).to_owned();
        let (index, woken) = api
            .wait_for("the woken turn", seen + 1, LIMIT, |r| {
                r.api == Api::Anthropic && r.last_turn().contains("<relay-mail>") && r.last_turn().contains(&short)
            })
            .await;
        seen = index;
        samples.push(woken.at.duration_since(sent_at));
    }

    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    println!("{} against relay-server at {}", String::from_utf8_lossy(&version.stdout).trim(), server.url);
    println!("send -> woken model request, {} wakes of an idle interactive session:", samples.len());
    println!(
        "  p50 {:.0} ms   p95 {:.0} ms   min {:.0} ms   max {:.0} ms",
        ms(at(0.50)),
        ms(at(0.95)),
        ms(samples[0]),
        ms(samples[samples.len() - 1])
    );
    println!("  every wake (ms): {}", samples.iter().map(|d| format!("{:.0}", ms(*d))).collect::<Vec<_>>().join(" "));
}
