//! The ops port as a platform uses it: liveness and readiness probes, gRPC health that follows
//! readiness, and metrics a collector scrapes.

use std::time::Duration;

use relay_proto::v1::*;
use relay_tests::client::{Agent, caught_up, next_message};
use relay_tests::http::{get, sample};
use relay_tests::pg::TestDb;
use relay_tests::server::Server;
use relay_tests::{eventually, free_port};
use tokio_postgres::NoTls;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

async fn with_ops(db: &TestDb) -> (Server, String) {
    let ops = format!("127.0.0.1:{}", free_port());
    let server = Server::start_with_env(db, free_port(), &[("RELAY_OPS_LISTEN", &ops)]).await;
    (server, ops)
}

async fn health(url: &str) -> Option<ServingStatus> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned()).ok()?.connect().await.ok()?;
    let answer = HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await.ok()?;
    Some(answer.into_inner().status())
}

async fn metrics(ops: &str) -> String {
    let (status, body) = get(ops, "/metrics").await.expect("the ops port answers");
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn probes_answer_and_metrics_count_what_happened() {
    let db = TestDb::new().await;
    let (server, ops) = with_ops(&db).await;
    assert_eq!(get(&ops, "/healthz").await, Some((200, "ok\n".to_owned())));
    assert_eq!(get(&ops, "/readyz").await, Some((200, "ready\n".to_owned())));
    assert_eq!(get(&ops, "/nope").await.map(|(status, _)| status), Some(404));

    let laptop = server.machine("acme", "laptop");
    let mut alice = Agent::hello(&server.url, &laptop, "alice").await.unwrap();
    let mut bob = Agent::hello(&server.url, &laptop, "bob").await.unwrap();
    let mut stream = bob.subscribe(0).await;
    caught_up(&mut stream, Duration::from_secs(5)).await;
    alice.send(&["laptop/bob"], "counted").await.unwrap();
    assert_eq!(next_message(&mut stream, Duration::from_secs(5)).await.body, "counted");
    let missing = alice.send(&["laptop/nobody"], "refused").await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    // The stream counts its push once it has marked it.
    let text = eventually(Duration::from_secs(5), "the push to be counted", || async {
        let text = metrics(&ops).await;
        (sample(&text, r#"relay_deliveries_total{step="pushed"}"#) == Some(1.0)).then_some(text)
    })
    .await;
    let count = |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"));
    assert_eq!(count("relay_pushes_handed_total"), 1.0, "the writer handed its stream the message");
    assert!(count(r#"relay_rpcs_total{method="/relay.v1.Relay/Send",code="OK"}"#) >= 1.0);
    assert!(count(r#"relay_rpcs_total{method="/relay.v1.Relay/Send",code="NOT_FOUND"}"#) >= 1.0);
    assert!(count(r#"relay_rpc_duration_seconds_count{method="/relay.v1.Relay/Send"}"#) >= 2.0);
    assert_eq!(count("relay_sends_total"), 1.0);
    assert_eq!(count(r#"relay_deliveries_total{step="delivered"}"#), 1.0);
    assert!(count("relay_send_write_duration_seconds_count") >= 1.0);
    assert!(count("relay_connections") >= 1.0, "the agents' connection is held");
    assert_eq!(count("relay_db_pool_max"), 8.0, "the pool size the server was given");
    assert_eq!(count("relay_listen_connected"), 1.0);
    assert_eq!(count(r#"relay_approvals_waiting{state="pending"}"#), 0.0);
    assert_eq!(count("relay_push_lag_seconds_count"), 1.0, "the live push was timed");
    assert_eq!(count("relay_push_streams"), 1.0);
    // A path the server does not serve is counted under one label, whatever the client sends.
    assert!(!text.contains("NoSuchMethod"));
}

#[tokio::test]
async fn readiness_and_grpc_health_follow_the_database() {
    let db = TestDb::new().await;
    let (server, ops) = with_ops(&db).await;
    assert_eq!(health(&server.url).await, Some(ServingStatus::Serving));

    // The database refuses this server: its connections are cut and no new one is let in.
    // From the cluster's maintenance database: a database cannot refuse the session changing it.
    let (admin, connection) = tokio_postgres::connect(&db.url.replace(&db.name, "postgres"), NoTls).await.unwrap();
    tokio::spawn(connection);
    admin.batch_execute(&format!("alter database {} allow_connections false", db.name)).await.unwrap();
    admin
        .execute("select pg_terminate_backend(pid) from pg_stat_activity where datname = $1", &[&db.name])
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "readiness to fail with the database away", || async {
        let (status, body) = get(&ops, "/readyz").await?;
        (status == 503).then_some(body)
    })
    .await;
    eventually(Duration::from_secs(20), "gRPC health to say NOT_SERVING", || async {
        (health(&server.url).await? == ServingStatus::NotServing).then_some(())
    })
    .await;
    assert_eq!(get(&ops, "/healthz").await.map(|(status, _)| status), Some(200), "alive all the same");
    assert_eq!(sample(&metrics(&ops).await, "relay_listen_connected"), Some(0.0));

    admin.batch_execute(&format!("alter database {} allow_connections true", db.name)).await.unwrap();
    eventually(Duration::from_secs(30), "readiness to come back with the database", || async {
        (get(&ops, "/readyz").await? == (200, "ready\n".to_owned())).then_some(())
    })
    .await;
    eventually(Duration::from_secs(10), "gRPC health to say SERVING again", || async {
        (health(&server.url).await? == ServingStatus::Serving).then_some(())
    })
    .await;
    assert!(sample(&metrics(&ops).await, "relay_listen_reconnects_total").unwrap() >= 1.0);
}

/// Sends one message from each sender to `acme/laptop/inbox`, all at once, each retried with its
/// client id (as a bridge does) while the server says the database is away.
async fn send_together(senders: &[Agent], round: &str) {
    let mut sends = tokio::task::JoinSet::new();
    for (i, sender) in senders.iter().enumerate() {
        let rpc = sender.rpc.clone();
        let request = SendRequest {
            to: vec!["laptop/inbox".into()],
            body: format!("{round} {i}"),
            client_id: format!("{round}-{i}"),
            ..Default::default()
        };
        sends.spawn(async move {
            eventually(Duration::from_secs(20), "a send to be stored", || {
                let (mut rpc, request) = (rpc.clone(), request.clone());
                async move {
                    match rpc.send(request).await {
                        Ok(_) => Some(()),
                        Err(status) if status.code() == Code::Unavailable => None,
                        Err(status) => panic!("a send failed otherwise than as unavailable: {status:?}"),
                    }
                }
            })
            .await
        });
    }
    sends.join_all().await;
}

/// Batches of more than one send committed so far.
fn batches(metrics: &str) -> f64 {
    sample(metrics, "relay_send_batch_size_count").unwrap()
        - sample(metrics, r#"relay_send_batch_size_bucket{le="1.0"}"#).unwrap()
}

/// Rounds of sends arriving together (`prefix-0`, `prefix-1`, …) until the writer has committed
/// one as a batch; answers how many rounds that took.
async fn sent_until_batched(senders: &[Agent], ops: &str, prefix: &str) -> usize {
    let before = batches(&metrics(ops).await);
    let mut rounds = 0;
    while batches(&metrics(ops).await) <= before {
        assert!(rounds < 10, "no batch written in {rounds} rounds of sends arriving together");
        send_together(senders, &format!("{prefix}-{rounds}")).await;
        rounds += 1;
    }
    rounds
}

#[tokio::test]
async fn sends_written_together_go_on_once_the_database_has_cut_every_connection() {
    let db = TestDb::new().await;
    let (server, ops) = with_ops(&db).await;
    let laptop = server.machine("acme", "laptop");
    let mut inbox = Agent::hello(&server.url, &laptop, "inbox").await.unwrap();
    let mut senders = Vec::new();
    for i in 0..32 {
        senders.push(Agent::hello(&server.url, &laptop, &format!("s{i}")).await.unwrap());
    }
    // The writer has its connection once it has written a batch.
    let before = sent_until_batched(&senders, &ops, "before").await;

    // The database ends every session of this server: the pool's, the listener's and the writer's.
    let sql = db.sql().await;
    let ended: i64 = sql
        .query_one(
            "select count(*) filter (where pg_terminate_backend(pid, 5000)) from pg_stat_activity \
             where datname = current_database() and pid <> pg_backend_pid() and backend_type = 'client backend'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ended >= 3, "the listener, the writer and a pooled connection at least: {ended} ended");
    let after = sent_until_batched(&senders, &ops, "after").await;

    // Each send stored once, every one numbered without a gap.
    let (mut seqs, mut bodies) = (Vec::new(), Vec::new());
    loop {
        let page = inbox.rpc.inbox(InboxRequest { wait_s: 0, ack: true, limit: 200 }).await.unwrap().into_inner();
        if page.messages.is_empty() {
            break;
        }
        for m in page.messages {
            seqs.push(m.seq);
            bodies.push(m.body);
        }
    }
    let sent = (32 * (before + after)) as u64;
    assert_eq!(seqs, (1..=sent).collect::<Vec<_>>());
    bodies.sort();
    let rounds = (0..before).map(|r| format!("before-{r}")).chain((0..after).map(|r| format!("after-{r}")));
    let mut wanted: Vec<String> = rounds.flat_map(|r| (0..32).map(move |i| format!("{r} {i}"))).collect();
    wanted.sort();
    assert_eq!(bodies, wanted);
}
