//! Plain HTTP/1.1, enough for the ops port's probes and metrics and the web console's pages and forms.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Gets `path` from `addr` (host:port); the status code and the body, or `None` when nothing answers.
pub async fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let headers = head.to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") { unchunk(body) } else { body.to_owned() };
    Some((status, body))
}

/// The payload of a chunked body.
fn unchunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The value of the first sample in an exposition whose line starts with `series` (name and
/// labels, as written), or `None` when there is no such line.
pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.split(' ').next()?.parse().ok())
}

/// An HTTP/1.1 answer: its status, its headers (names in lowercase, in order) and its body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// Sends one request over a new plaintext connection to `addr` (host:port) and reads the whole
/// answer (`Connection: close`). `headers` come after `Host`.
pub async fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let stream = TcpStream::connect(addr).await.unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    request_on(stream, addr, method, path, headers, body).await
}

/// [`request`] over a stream already open (a TLS one), naming `host` in the `Host` header.
pub async fn request_on<S>(
    mut stream: S,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.expect("write the request");
    stream.write_all(body.as_bytes()).await.expect("write the body");
    let mut raw = Vec::new();
    // A TLS peer may close without close_notify; what was read is the answer.
    let _ = stream.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { unchunk(body) } else { body.to_owned() };
    Answer { status, headers, body }
}

/// A form body (`application/x-www-form-urlencoded`).
pub fn form(fields: &[(&str, &str)]) -> String {
    let encode = |text: &str| {
        text.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                b' ' => "+".to_owned(),
                other => format!("%{other:02X}"),
            })
            .collect::<String>()
    };
    fields.iter().map(|(k, v)| format!("{}={}", encode(k), encode(v))).collect::<Vec<_>>().join("&")
}
