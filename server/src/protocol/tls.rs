//! The server's TLS: a certificate that follows its files, so a rotated certificate (a renewed
//! Let's Encrypt pair, an updated Kubernetes secret) is served without a restart. New connections
//! get the new certificate; open ones keep the session they have.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::domain::{Error, Result};

/// How often the files are looked at for a change.
pub const RELOAD_CHECK: Duration = Duration::from_secs(5);

/// The certificate and key files, and what is served from them now.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' modification times and sizes when last loaded.
    seen: RwLock<Stamp>,
}

type Stamp = Option<(SystemTime, u64, SystemTime, u64)>;

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let (c, k) = (std::fs::metadata(cert).ok()?, std::fs::metadata(key).ok()?);
    Some((c.modified().ok()?, c.len(), k.modified().ok()?, k.len()))
}

fn load(cert: &Path, key: &Path) -> Result<CertifiedKey> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| Error::invalid(format!("cannot read tls certificate {}: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(Error::invalid(format!("no certificate in {}", cert.display())));
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| Error::invalid(format!("cannot read tls key {}: {e}", key.display())))?;
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain, key_der, &provider).map_err(|e| {
        Error::invalid(format!("tls certificate {} and key {} do not go together: {e}", cert.display(), key.display()))
    })?;
    Ok(certified)
}

impl ReloadingCert {
    /// Loads the pair once; an unreadable or mismatched pair is an error at start.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Self>> {
        let seen = stamp(cert, key);
        let current = load(cert, key)?;
        Ok(Arc::new(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(Arc::new(current)),
            seen: RwLock::new(seen),
        }))
    }

    /// Loads the pair again if either file changed. A pair that does not load (caught mid-write,
    /// or a key for another certificate) is logged and the one served stays.
    pub fn check(&self) {
        let now = stamp(&self.cert, &self.key);
        if now.is_none() || *self.seen.read().expect("tls stamp lock") == now {
            return;
        }
        match load(&self.cert, &self.key) {
            Ok(fresh) => {
                *self.current.write().expect("tls certificate lock") = Arc::new(fresh);
                *self.seen.write().expect("tls stamp lock") = now;
                tracing::info!(cert = %self.cert.display(), "tls certificate reloaded");
            }
            Err(e) => {
                tracing::warn!(error = %e, "tls certificate files changed but do not load; serving the previous one")
            }
        }
    }

    /// Looks at the files every [`RELOAD_CHECK`] until `shutdown`.
    pub fn watch(self: &Arc<Self>, shutdown: CancellationToken) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(RELOAD_CHECK);
            loop {
                tokio::select! {
                    _ = every.tick() => me.check(),
                    () = shutdown.cancelled() => return,
                }
            }
        });
    }

    /// The TLS acceptor serving the current certificate, speaking HTTP/2 (gRPC).
    pub fn acceptor(self: &Arc<Self>) -> Result<TlsAcceptor> {
        self.acceptor_for(b"h2")
    }

    /// The TLS acceptor serving the current certificate for the protocol `alpn` (`h2`, `http/1.1`).
    pub fn acceptor_for(self: &Arc<Self>, alpn: &[u8]) -> Result<TlsAcceptor> {
        let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Internal(format!("tls setup failed: {e}")))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("tls certificate lock").clone())
    }
}
