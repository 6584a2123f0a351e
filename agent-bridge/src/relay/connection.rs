//! Where the server is and how to reach it.

use std::time::Duration;

use relay_proto::bridge_config::{self, BridgeConfig};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "no relay server configured: run `agent-bridge login --server URL --token TOKEN`, or set RELAY_SERVER and RELAY_TOKEN"
    )]
    NotConfigured,
    #[error("invalid server url {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("cannot read the CA certificate {path}: {source}")]
    Ca { path: String, source: std::io::Error },
    #[error(transparent)]
    Config(#[from] bridge_config::ConfigError),
}

/// Server, credential and trust anchor: from `RELAY_SERVER` + `RELAY_TOKEN` (+ `RELAY_CA`), else the
/// config file.
pub fn resolve() -> Result<BridgeConfig, ConnectError> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let (Some(server), Some(token)) = (env("RELAY_SERVER"), env("RELAY_TOKEN")) {
        return Ok(BridgeConfig { server, token, ca: env("RELAY_CA"), human_token: env("RELAY_HUMAN_TOKEN") });
    }
    let path = bridge_config::default_path()?;
    bridge_config::read(&path).ok_or(ConnectError::NotConfigured)
}

/// A lazily connecting channel: it dials on first use and redials after a drop by itself.
pub fn channel(server: &str, ca: Option<&str>) -> Result<Channel, ConnectError> {
    let bad = |reason: String| ConnectError::BadUrl { url: server.to_owned(), reason };
    let mut endpoint = Endpoint::from_shared(server.to_owned())
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_keepalive(Some(Duration::from_secs(30)))
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    if server.starts_with("https://") {
        let mut tls = ClientTlsConfig::new().with_native_roots();
        if let Some(path) = ca {
            let pem = std::fs::read(path).map_err(|source| ConnectError::Ca { path: path.to_owned(), source })?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| bad(e.to_string()))?;
    } else if !server.starts_with("http://") {
        return Err(bad("use http:// or https://".into()));
    }
    Ok(endpoint.connect_lazy())
}
