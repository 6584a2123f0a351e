//! The web console: the pages a person uses to see and drive the account — the board, its agents,
//! the human's inbox (holds and permission requests with it) and contacts — served over HTTP/1.1
//! on a listener of its own, with TLS when the server has a certificate (the same certificate,
//! reloaded with it).
//!
//! A person signs in with the account's human token, checked as the Human gRPC service checks it;
//! the console then keeps a session in the database (see `app::console`) named by an HttpOnly,
//! SameSite=Strict cookie, Secure under TLS. Every form carries the session's CSRF token and every
//! POST must come from the console's own origin. Pages are rendered on the server by templates
//! that escape every value (maud); the one script is a file (the Content-Security-Policy allows no
//! inline script), and it only fetches a page's live part again when `/events` says something
//! changed.

mod html;
mod pages;
mod routes;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::tls::ReloadingCert;
use super::web;
use crate::app::App;

/// Where `dev` serves the console unless told otherwise.
pub const DEV_CONSOLE_LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7449);

/// Refuses a plaintext console on an address other machines reach, as the gRPC listener does:
/// the human token and the session cookie would cross the network in the clear.
pub fn check(addr: SocketAddr, tls: bool, insecure_plaintext: bool) -> anyhow::Result<()> {
    web::check("console", addr, tls, insecure_plaintext)
}

/// Binds the console's port. Apart from serving, so that a taken port is reported before anything
/// starts.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    web::bind("the console", addr).await
}

/// Serves the console on `listener` until `shutdown`, over TLS with `tls` when given.
pub fn serve(
    listener: TcpListener,
    app: App,
    tls: Option<Arc<ReloadingCert>>,
    shutdown: CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let secure = tls.is_some();
    let router = routes::router(&app, secure, shutdown.clone());
    web::serve("the web console", listener, router, tls, shutdown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_plaintext_only_on_loopback_unless_asked() {
        let any: SocketAddr = "0.0.0.0:7449".parse().unwrap();
        assert!(check("127.0.0.1:7449".parse().unwrap(), false, false).is_ok());
        assert!(check("[::1]:7449".parse().unwrap(), false, false).is_ok());
        let refused = check(any, false, false).unwrap_err().to_string();
        assert!(refused.contains("refusing a plaintext console"), "{refused}");
        assert!(check(any, true, false).is_ok() && check(any, false, true).is_ok());
    }
}
