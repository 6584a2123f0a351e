//! Peek: let agents that may message you see your last turns, and see theirs.

use std::time::Duration;

use relay_proto::v1::*;
use serde_json::{Map, Value};

use super::args::{ArgError, Args};
use super::{Outcome, ToolError, Tools};
use crate::frame;

type Result<T> = std::result::Result<T, ToolError>;

pub async fn call(tools: &Tools, name: &str, arguments: &Map<String, Value>) -> Result<Outcome> {
    let relay = tools.relay();
    match name {
        "relay_set_peek" => {
            let args = Args::new(arguments, &["on"])?;
            let on = args.opt_bool("on")?.ok_or_else(|| ArgError("on is required: true or false".into()))?;
            let reply = relay
                .call(Duration::ZERO, SetPeekRequest { on }, |mut c, r| async move { c.set_peek(r).await })
                .await?;
            let text = if reply.on {
                "peek is on: agents that may message you can see a redacted view of your last turns (relay_peek who lists who looked)"
            } else {
                "peek is off, and what was kept of your turns is deleted"
            };
            Ok(Outcome::text(text))
        }
        _ => {
            let args = Args::new(arguments, &["endpoint", "turns", "full", "who"])?;
            if args.opt_bool("who")? == Some(true) {
                let reply =
                    relay.call(Duration::ZERO, PeekersRequest {}, |mut c, r| async move { c.peekers(r).await }).await?;
                let lines: Vec<String> = reply
                    .peekers
                    .iter()
                    .map(|p| format!("{} at {} ({} turn{})", p.by, p.at, p.turns, if p.turns == 1 { "" } else { "s" }))
                    .collect();
                let text = if lines.is_empty() { "nobody peeked at you".to_owned() } else { lines.join("\n") };
                return Ok(Outcome::text(text));
            }
            let endpoint = args.str("endpoint")?.trim().to_owned();
            let full = args.opt_bool("full")?.unwrap_or(false);
            let turns = args.count("turns", if full { 10 } else { 3 }, 1, 10)?;
            let request = PeekRequest { endpoint, turns };
            let view = relay.call(Duration::ZERO, request, |mut c, r| async move { c.peek(r).await }).await?;
            Ok(if view.turns.is_empty() {
                Outcome::text(format!("{} allows peeking but has shared no turns yet", view.endpoint))
            } else {
                Outcome::text(frame::peek(&view)).untrusted()
            })
        }
    }
}
