//! Peek: let agents that may message you see your last turns, and see theirs.

use std::time::Duration;

use relay_proto::v1::*;
use serde_json::{Map, Value};

use super::args::{Flag, needed, parse};
use super::input;
use super::{Outcome, ToolError, Tools};
use crate::frame;

type Result<T> = std::result::Result<T, ToolError>;

pub async fn call(tools: &Tools, name: &str, arguments: &Map<String, Value>) -> Result<Outcome> {
    let relay = tools.relay();
    match name {
        "relay_set_peek" => {
            let args: input::SetPeek = parse(arguments)?;
            let on = args.on.0;
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
            let args: input::Peek = parse(arguments)?;
            if Flag::or(args.who, false) {
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
            let endpoint = needed(args.endpoint, "endpoint")?.0.trim().to_owned();
            let full = Flag::or(args.full, false);
            let turns = args.turns.map_or(if full { 10 } else { 3 }, |t| t.0);
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
