//! TLS to the database with libpq's settings and their meaning. The driver knows only `sslmode`
//! disable, prefer and require; the rest of what libpq accepts (`verify-ca`, `verify-full`,
//! `allow`, `sslrootcert`, `sslcert`, `sslkey`) is read here, taken out of the connection string,
//! and becomes the rustls configuration.
//!
//! | sslmode | encrypted | certificate checked |
//! | --- | --- | --- |
//! | disable | no | — |
//! | allow, prefer | when the server offers it | no |
//! | require | yes | no; against the CA when one is given (as libpq) |
//! | verify-ca | yes | chain to a trusted CA |
//! | verify-full | yes | chain to a trusted CA, and the host name |
//!
//! Trusted CAs are the system's plus `sslrootcert` or `--db-ca`. Without `sslmode` the connection
//! is plaintext, as with `disable` (libpq would try TLS first).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use percent_encoding::percent_decode_str;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::SslMode as DriverMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::domain::{Error, Result};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self> {
        Ok(match value {
            "disable" => Self::Disable,
            "allow" => Self::Allow,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(Error::invalid(format!(
                    "invalid database url: sslmode {other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                )));
            }
        })
    }
}

/// The TLS settings of a connection string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: Option<SslMode>,
    pub root_cert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

const OURS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

impl TlsSettings {
    fn set(&mut self, key: &str, value: String) -> Result<()> {
        match key {
            "sslmode" => self.mode = Some(SslMode::parse(&value)?),
            "sslrootcert" => self.root_cert = Some(PathBuf::from(value)),
            "sslcert" => self.cert = Some(PathBuf::from(value)),
            "sslkey" => self.key = Some(PathBuf::from(value)),
            _ => unreachable!("only the keys of OURS are set"),
        }
        Ok(())
    }
}

/// Splits a URL (`postgres://…?sslmode=…`) or key=value string into what the driver reads and the
/// TLS settings read here.
pub fn split(conninfo: &str) -> Result<(String, TlsSettings)> {
    let mut tls = TlsSettings::default();
    if conninfo.starts_with("postgres://") || conninfo.starts_with("postgresql://") {
        let Some((base, query)) = conninfo.split_once('?') else { return Ok((conninfo.to_owned(), tls)) };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if OURS.contains(&key) {
                let value = percent_decode_str(value)
                    .decode_utf8()
                    .map_err(|_| Error::invalid(format!("invalid database url: {key} is not UTF-8")))?;
                tls.set(key, value.into_owned())?;
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        return Ok((rest, tls));
    }
    let mut kept = Vec::new();
    for (key, value, raw) in key_values(conninfo)? {
        if OURS.contains(&key.as_str()) {
            tls.set(&key, value)?;
        } else {
            kept.push(raw);
        }
    }
    Ok((kept.join(" "), tls))
}

/// The settings of a libpq key=value string: key, unquoted value, and the setting as written.
fn key_values(conninfo: &str) -> Result<Vec<(String, String, String)>> {
    let bad = || Error::invalid("invalid database url: a key=value setting is malformed");
    let chars: Vec<char> = conninfo.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if i == chars.len() {
            return Ok(out);
        }
        let start = i;
        while i < chars.len() && chars[i] != '=' && !chars[i].is_whitespace() {
            i += 1;
        }
        let key: String = chars[start..i].iter().collect();
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if key.is_empty() || i == chars.len() || chars[i] != '=' {
            return Err(bad());
        }
        i += 1;
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        let mut value = String::new();
        if i < chars.len() && chars[i] == '\'' {
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(bad()),
                    Some('\'') => {
                        i += 1;
                        break;
                    }
                    Some('\\') => {
                        value.push(*chars.get(i + 1).ok_or_else(bad)?);
                        i += 2;
                    }
                    Some(c) => {
                        value.push(*c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < chars.len() && !chars[i].is_whitespace() {
                if chars[i] == '\\' {
                    i += 1;
                }
                value.push(*chars.get(i).ok_or_else(bad)?);
                i += 1;
            }
        }
        out.push((key, value, chars[start..i].iter().collect()));
    }
}

/// How to connect: the driver's mode and the connector, when TLS may be used.
pub fn connector(settings: &TlsSettings, extra_ca: Option<&Path>) -> Result<(DriverMode, Option<MakeRustlsConnect>)> {
    let ca = settings.root_cert.as_deref().or(extra_ca);
    let mode = settings.mode.unwrap_or(SslMode::Disable);
    if mode == SslMode::Disable {
        if ca.is_some() || settings.cert.is_some() {
            return Err(Error::invalid(
                "a database CA or client certificate was given, but the URL does not ask for TLS: add sslmode=verify-full (or require, verify-ca)",
            ));
        }
        return Ok((DriverMode::Disable, None));
    }
    let check = match mode {
        SslMode::VerifyFull => Check::Full,
        SslMode::VerifyCa => Check::Chain,
        // libpq checks the chain under `require` when a root certificate is given.
        SslMode::Require if ca.is_some() => Check::Chain,
        _ => Check::Nothing,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match check {
        Check::Nothing => Arc::new(Unchecked(provider())),
        Check::Chain => Arc::new(ChainOnly(webpki(ca)?)),
        Check::Full => webpki(ca)?,
    };
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Internal(format!("tls setup failed: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&settings.cert, &settings.key) {
        (Some(cert), Some(key)) => {
            let chain = read_certs(cert)?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| Error::invalid(format!("cannot read the database client key {}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| Error::invalid(format!("the database client certificate and key do not match: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err(Error::invalid("sslcert and sslkey go together: give both or neither")),
    };
    let driver = match mode {
        SslMode::Allow | SslMode::Prefer => DriverMode::Prefer,
        _ => DriverMode::Require,
    };
    Ok((driver, Some(MakeRustlsConnect::new(config))))
}

enum Check {
    Nothing,
    Chain,
    Full,
}

fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| Error::invalid(format!("cannot read certificates from {}: {e}", path.display())))
}

/// The system's roots plus `ca`, checked the way a browser checks a site.
fn webpki(ca: Option<&Path>) -> Result<Arc<WebPkiServerVerifier>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca {
        for cert in read_certs(path)? {
            roots.add(cert).map_err(|e| Error::invalid(format!("bad certificate in {}: {e}", path.display())))?;
        }
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::new(provider()))
        .build()
        .map_err(|e| Error::invalid(format!("no CA to check the database's certificate against: {e}")))
}

/// `verify-ca`: the chain must lead to a trusted CA; the name in the certificate is not compared.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `allow`, `prefer` and `require` without a CA: encrypted, the certificate taken as it comes (the
/// handshake's signatures are still checked, so the session is with the certificate's holder).
#[derive(Debug)]
struct Unchecked(rustls::crypto::CryptoProvider);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_tls_settings_are_taken_out_of_urls() {
        let (rest, tls) = split(
            "postgres://relay:p%40ss@db:5432/relay?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://relay:p%40ss@db:5432/relay?application_name=x");
        assert_eq!(tls.mode, Some(SslMode::VerifyFull));
        assert_eq!(tls.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        let (rest, tls) = split("postgres://db/relay?sslmode=verify-ca").unwrap();
        assert_eq!((rest.as_str(), tls.mode), ("postgres://db/relay", Some(SslMode::VerifyCa)));
        assert_eq!(split("postgres://db/relay").unwrap().1, TlsSettings::default());
    }

    #[test]
    fn libpq_tls_settings_are_taken_out_of_key_value_strings() {
        let (rest, tls) =
            split("host=db user=relay password='it\\'s a=b' sslmode = verify-ca sslcert=/c.pem sslkey='/k ey.pem'")
                .unwrap();
        assert_eq!(rest, "host=db user=relay password='it\\'s a=b'");
        assert_eq!(tls.mode, Some(SslMode::VerifyCa));
        assert_eq!(tls.cert, Some(PathBuf::from("/c.pem")));
        assert_eq!(tls.key, Some(PathBuf::from("/k ey.pem")));
    }

    #[test]
    fn unknown_modes_and_half_client_certificates_are_refused() {
        let err = split("postgres://db/relay?sslmode=verify_full").unwrap_err().to_string();
        assert!(err.contains("verify-ca, verify-full"), "{err}");
        let settings = TlsSettings { mode: Some(SslMode::Require), cert: Some("/c.pem".into()), ..Default::default() };
        assert!(connector(&settings, None).is_err());
        let ca_without_tls = connector(&TlsSettings::default(), Some(Path::new("/ca.pem"))).err().unwrap().to_string();
        assert!(ca_without_tls.contains("does not ask for TLS"), "{ca_without_tls}");
    }

    #[test]
    fn each_mode_maps_to_what_the_driver_does() {
        let mode = |m| connector(&TlsSettings { mode: Some(m), ..Default::default() }, None).unwrap().0;
        assert_eq!(mode(SslMode::Disable), DriverMode::Disable);
        assert_eq!(mode(SslMode::Allow), DriverMode::Prefer);
        assert_eq!(mode(SslMode::Prefer), DriverMode::Prefer);
        assert_eq!(mode(SslMode::Require), DriverMode::Require);
        assert_eq!(mode(SslMode::VerifyCa), DriverMode::Require);
        assert_eq!(mode(SslMode::VerifyFull), DriverMode::Require);
    }
}
