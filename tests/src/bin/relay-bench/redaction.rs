//! What redaction costs the server: every body an agent sends passes `redact` before it is stored.
//! Bodies of 64 KiB (the most a body may be is 64 KiB) of three kinds: prose with code words and
//! no secret, a config and log dump with secrets among look-alikes (names that say token or key,
//! hashes, URLs), and the same dump JSON-escaped (the decoding path). The first call, which compiles
//! the rules, is timed apart.

use std::time::{Duration, Instant};

use relay_server::domain::redact::redact;

use super::{Quantiles, quantiles};

/// The size of each body.
const BODY: usize = 64 * 1024;

/// What one kind of body cost.
pub struct Cost {
    pub kind: &'static str,
    pub found: u32,
    pub times: Quantiles,
}

fn repeat_to(unit: &str) -> String {
    let mut body = String::with_capacity(BODY + unit.len());
    while body.len() + unit.len() <= BODY {
        body.push_str(unit);
    }
    body
}

fn bodies() -> Vec<(&'static str, String)> {
    let prose = repeat_to(
        "The worker picks the card, runs the tests and posts what failed; the key point is that a \
         token of the session is never written to the log. See src/auth/session.rs for the refresh \
         path, and keep the secret manager out of the hot loop. Commit 4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a \
         fixed the retry; the password field is required. ",
    );
    let dump = repeat_to(
        "[2026-12-07T07:30:00Z] INFO connecting to https://api.example.com/v1 (attempt 2)\n\
         config: {\"region\": \"eu-west-1\", \"max_tokens\": 4096, \"api_key\": \"${API_KEY}\"}\n\
         image@sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 pulled\n\
         export GITHUB_TOKEN=ghp_8pQz3LmW1xKc7RtY5nV2bJ0dF9gH4sA6eUoT\n\
         DATABASE_URL=postgres://app:Wd8kz2Lq7@db.internal:5432/app\n\
         password_file = /run/secrets/db; token_ttl_s = 3600\n",
    );
    let escaped = serde_json::to_string(&dump).expect("a string serializes").replace('_', "\\u005f");
    vec![
        ("prose", prose),
        ("config and log dump", dump),
        ("the dump JSON-escaped", escaped[..BODY.min(escaped.len())].to_owned()),
    ]
}

/// The first call's time (the rules compiled), then each kind of body `runs` times.
pub fn measure(runs: usize) -> (Duration, Vec<Cost>) {
    let started = Instant::now();
    redact("warm up: compiles the rules");
    let first = started.elapsed();
    let costs = bodies()
        .into_iter()
        .map(|(kind, body)| {
            let found = redact(&body).total();
            let times = (0..runs)
                .map(|_| {
                    let started = Instant::now();
                    std::hint::black_box(redact(std::hint::black_box(&body)));
                    started.elapsed()
                })
                .collect();
            Cost { kind, found, times: quantiles(times) }
        })
        .collect();
    (first, costs)
}
