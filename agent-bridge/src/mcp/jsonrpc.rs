//! JSON-RPC 2.0 over newline-delimited stdio: bounded line reading and message shapes.

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const NOT_INITIALIZED: i64 = -32002;

/// Longest accepted input line; longer ones are refused and skipped whole.
pub const MAX_LINE: usize = 4 * 1024 * 1024;

/// One input line, or the fact that one was too long.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Text(String),
    TooLong,
}

/// Reads lines of at most [`MAX_LINE`] bytes without ever holding more than that in memory.
pub struct LineReader<R> {
    inner: R,
    max: usize,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub fn new(inner: R) -> Self {
        Self { inner, max: MAX_LINE }
    }

    #[cfg(test)]
    fn with_max(inner: R, max: usize) -> Self {
        Self { inner, max }
    }

    /// The next line without its terminator; `None` at end of input.
    pub async fn next(&mut self) -> std::io::Result<Option<Line>> {
        let mut buf = Vec::new();
        let mut too_long = false;
        loop {
            let chunk = self.inner.fill_buf().await?;
            if chunk.is_empty() {
                return Ok(match (too_long, buf.is_empty()) {
                    (true, _) => Some(Line::TooLong),
                    (false, true) => None,
                    (false, false) => Some(Line::Text(String::from_utf8_lossy(&buf).into_owned())),
                });
            }
            let (part, found) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (&chunk[..i], Some(i + 1)),
                None => (chunk, None),
            };
            if !too_long {
                if buf.len() + part.len() > self.max {
                    too_long = true;
                    buf = Vec::new();
                } else {
                    buf.extend_from_slice(part);
                }
            }
            let used = found.unwrap_or(chunk.len());
            self.inner.consume(used);
            if found.is_some() {
                if too_long {
                    return Ok(Some(Line::TooLong));
                }
                if buf.last() == Some(&b'\r') {
                    buf.pop();
                }
                return Ok(Some(Line::Text(String::from_utf8_lossy(&buf).into_owned())));
            }
        }
    }
}

pub fn result(id: &Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

pub fn error(id: &Value, code: i64, message: impl Into<String>) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message.into() } })
}

pub fn notification(method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "method": method, "params": params })
}

/// What an incoming JSON value is.
#[derive(Debug)]
pub enum Incoming {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// A response to a request of ours; the bridge sends none, so these are ignored.
    Response,
    /// Not a valid message: answer with this error (and this id, when one could be read).
    Invalid {
        id: Value,
        message: &'static str,
    },
}

pub fn classify(value: Value) -> Incoming {
    let Value::Object(mut object) = value else {
        return Incoming::Invalid { id: Value::Null, message: "a message is a JSON object" };
    };
    let id = object.remove("id");
    let valid_id = matches!(id, Some(Value::String(_) | Value::Number(_)));
    let method = object.remove("method");
    let params = object.remove("params").unwrap_or(Value::Null);
    match (method, id) {
        (Some(Value::String(method)), Some(id)) if valid_id => Incoming::Request { id, method, params },
        (Some(Value::String(_)), Some(id)) => Incoming::Invalid {
            id: if id.is_null() { Value::Null } else { id },
            message: "a request id is a string or a number",
        },
        (Some(Value::String(method)), None) => Incoming::Notification { method, params },
        (Some(_), id) => Incoming::Invalid { id: id.unwrap_or(Value::Null), message: "method must be a string" },
        (None, Some(_)) if object.contains_key("result") || object.contains_key("error") => Incoming::Response,
        (None, id) => Incoming::Invalid { id: id.unwrap_or(Value::Null), message: "a request names its method" },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &str, max: usize) -> Vec<Line> {
        let mut reader = LineReader::with_max(tokio::io::BufReader::with_capacity(4, input.as_bytes()), max);
        let mut out = Vec::new();
        while let Some(line) = reader.next().await.unwrap() {
            out.push(line);
        }
        out
    }

    #[tokio::test]
    async fn splits_lines_and_strips_terminators() {
        let got = lines("a\r\nbb\n\nlast", 10).await;
        let want = ["a", "bb", "", "last"].map(|s| Line::Text(s.into()));
        assert_eq!(got, want);
    }

    #[tokio::test]
    async fn an_overlong_line_is_skipped_whole_and_the_next_one_works() {
        let got = lines("0123456789abc\nok\n0123456789abcdef", 10).await;
        assert_eq!(got, [Line::TooLong, Line::Text("ok".into()), Line::TooLong]);
        assert_eq!(lines("0123456789\n", 10).await, [Line::Text("0123456789".into())]);
    }

    #[test]
    fn classifies_messages() {
        assert!(matches!(classify(json!({"jsonrpc":"2.0","id":1,"method":"ping"})), Incoming::Request { .. }));
        assert!(matches!(classify(json!({"jsonrpc":"2.0","method":"x"})), Incoming::Notification { .. }));
        assert!(matches!(classify(json!({"jsonrpc":"2.0","id":1,"result":{}})), Incoming::Response));
        assert!(matches!(classify(json!({"id":{},"method":"ping"})), Incoming::Invalid { .. }));
        assert!(matches!(classify(json!({"id":null,"method":"ping"})), Incoming::Invalid { .. }));
        assert!(matches!(classify(json!({"id":3})), Incoming::Invalid { id, .. } if id == json!(3)));
        assert!(matches!(classify(json!("text")), Incoming::Invalid { .. }));
    }
}
