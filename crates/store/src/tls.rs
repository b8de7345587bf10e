//! TLS to PostgreSQL, as libpq reads it from the connection string: `sslmode`
//! (`disable`, `prefer`, `require`, `verify-ca`, `verify-full`) and `sslrootcert`.
//!
//! tokio-postgres knows only `disable`, `prefer` and `require` (and then never checks the
//! certificate), refuses `sslrootcert` as an unknown option, and does not expose its
//! parser. So the two keys are taken out of the string here, the rest goes to
//! tokio-postgres unchanged, and the certificate checks are rustls's, configured per mode:
//!
//! | sslmode | TLS | certificate |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (the default) | when the server offers it | not checked |
//! | `require` | always | not checked; with a root certificate, chain checked (libpq: like `verify-ca`) |
//! | `verify-ca` | always | chain checked against the root certificate |
//! | `verify-full` | always | chain and host name checked |
//!
//! The root certificate is `sslrootcert` (a PEM file of one or more certificates), else
//! `~/.postgresql/root.crt` when it exists, as in libpq; `sslrootcert=system` uses the
//! operating system's trusted roots and implies `verify-full` (libpq 16). Unix-socket
//! connections never use TLS (PostgreSQL does not offer it there).

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`, all the values this service supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS when the server offers it, without checking the certificate.
    Prefer,
    /// TLS always; the certificate is checked only when a root certificate is given.
    Require,
    /// TLS always, certificate chain checked against the root certificate.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host connected to.
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = TlsError;

    fn from_str(s: &str) -> Result<SslMode, TlsError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => {
                return Err(TlsError::Unsupported(
                    "sslmode=allow (try plain first, then TLS) is not supported; use prefer or disable"
                        .into(),
                ))
            }
            other => {
                return Err(TlsError::Unsupported(format!(
                    "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
                )))
            }
        })
    }
}

/// A connection string that cannot be used: what is wrong, in words.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A value this service does not accept.
    #[error("{0}")]
    Unsupported(String),
    /// The root certificate file is missing, unreadable or holds no certificate.
    #[error("sslrootcert: {0}")]
    RootCert(String),
    /// Everything else tokio-postgres refused.
    #[error("{0}")]
    Syntax(String),
}

/// Where the root certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    /// None given and no `~/.postgresql/root.crt`.
    None,
    /// A PEM file.
    File(PathBuf),
    /// The operating system's trust store (`sslrootcert=system`).
    System,
}

/// A parsed connection string: tokio-postgres's configuration and the TLS connector
/// that goes with it. Every connection of the service (pool, LISTEN, owner) is made
/// from one of these, so they all agree on TLS.
#[derive(Clone)]
pub struct PgTarget {
    /// Everything but TLS, with tokio-postgres's `ssl_mode` set to match `mode`.
    pub config: tokio_postgres::Config,
    /// The requested mode (after libpq's defaults are applied).
    pub mode: SslMode,
    /// The connector: rustls, checking certificates as `mode` says.
    pub tls: MakeRustlsConnect,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTarget").field("config", &self.config).field("mode", &self.mode).finish()
    }
}

impl PgTarget {
    /// Parses a libpq-style URL or `key=value` string.
    pub fn parse(url: &str) -> Result<PgTarget, TlsError> {
        let split = split_tls_keys(url)?;
        let mut config =
            tokio_postgres::Config::from_str(&split.rest).map_err(|e| TlsError::Syntax(e.to_string()))?;
        let roots = match split.sslrootcert.as_deref() {
            Some("system") => Roots::System,
            Some(path) => Roots::File(expand_home(path)),
            None => match default_root_cert() {
                Some(path) if path.is_file() => Roots::File(path),
                _ => Roots::None,
            },
        };
        let mode = match split.sslmode.as_deref() {
            Some(m) => m.parse()?,
            // libpq 16: the system's roots are only worth using with a host name check.
            None if roots == Roots::System => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        if roots == Roots::System && mode != SslMode::VerifyFull {
            return Err(TlsError::Unsupported(format!(
                "weak sslmode \"{}\" may not be used with sslrootcert=system (use \"verify-full\")",
                split.sslmode.as_deref().unwrap_or("prefer")
            )));
        }
        let unix_only = config.get_hosts().iter().all(|h| !matches!(h, tokio_postgres::config::Host::Tcp(_)));
        config.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            // PostgreSQL never offers TLS on a Unix socket; do not even ask.
            _ if unix_only && !config.get_hosts().is_empty() => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let tls = MakeRustlsConnect::new(client_config(mode, &roots)?);
        Ok(PgTarget { config, mode, tls })
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls client configuration for `mode` and `roots`.
fn client_config(mode: SslMode, roots: &Roots) -> Result<rustls::ClientConfig, TlsError> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Unsupported(format!("TLS set-up: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, roots) {
        (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, Roots::None) => {
            Arc::new(EncryptOnly(provider))
        }
        (SslMode::VerifyCa | SslMode::VerifyFull, Roots::None) => {
            let path = default_root_cert()
                .map(|p| p.display().to_string())
                .unwrap_or("~/.postgresql/root.crt".into());
            return Err(TlsError::RootCert(format!(
                "root certificate file \"{path}\" does not exist. Either provide the file with sslrootcert=PATH, \
                 use the system's trusted roots with sslrootcert=system, or change sslmode to disable server \
                 certificate verification"
            )));
        }
        (SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull, roots) => Arc::new(Checked {
            inner: WebPkiServerVerifier::builder_with_provider(load_roots(roots)?, provider)
                .build()
                .map_err(|e| TlsError::RootCert(format!("cannot use the root certificates: {e}")))?,
            check_name: mode == SslMode::VerifyFull,
        }),
    };
    Ok(builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth())
}

fn load_roots(roots: &Roots) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::None => {}
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found.errors.first().map(|e| format!(": {e}")).unwrap_or_default();
                return Err(TlsError::RootCert(format!("no trusted roots found on this system{why}")));
            }
        }
        Roots::File(path) => {
            let shown = path.display();
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| TlsError::RootCert(format!("cannot read \"{shown}\": {e}")))?
                .collect::<Result<_, _>>()
                .map_err(|e| TlsError::RootCert(format!("\"{shown}\" is not a PEM certificate file: {e}")))?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(TlsError::RootCert(format!("\"{shown}\" holds no usable certificate")));
            }
        }
    }
    Ok(Arc::new(store))
}

/// libpq's default root certificate file.
fn default_root_cert() -> Option<PathBuf> {
    dirs::home_dir().map(|h| h.join(".postgresql").join("root.crt"))
}

fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), dirs::home_dir()) {
        (Some(rest), Some(home)) => home.join(rest),
        _ => PathBuf::from(path),
    }
}

/// `prefer`, and `require` without a root certificate: encrypted, but any certificate is
/// accepted (libpq's meaning). The handshake's signature is still checked against the
/// certificate's key, as OpenSSL does under libpq: the server must hold that key, which
/// is what makes SCRAM's channel binding (bound to the certificate) mean something.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl EncryptOnly {
    /// Checks `dss` over `message` with the key in `cert`, trying `candidates` (the
    /// algorithms of the signature's scheme). webpki would do it, but refuses X.509 v1
    /// certificates, which some servers make for themselves (Citus does); x509-cert
    /// reads the key from any version.
    fn check(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
        tls13: bool,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        use x509_cert::der::Decode;
        let parsed = x509_cert::Certificate::from_der(cert.as_ref())
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        let key = parsed.tbs_certificate.subject_public_key_info.subject_public_key.raw_bytes();
        let algorithms = &self.0.signature_verification_algorithms;
        let candidates =
            algorithms.mapping.iter().find(|(scheme, _)| *scheme == dss.scheme).map(|(_, algs)| *algs);
        let Some(candidates) = candidates else {
            return Err(rustls::Error::PeerMisbehaved(
                rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
            ));
        };
        // TLS 1.3 names one algorithm per scheme (the first); TLS 1.2 may mean several.
        let candidates = if tls13 { &candidates[..1] } else { candidates };
        if candidates.iter().any(|alg| alg.verify_signature(key, message, dss.signature()).is_ok()) {
            Ok(HandshakeSignatureValid::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(CertificateError::BadSignature))
        }
    }
}

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.check(message, cert, dss, false)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.check(message, cert, dss, true)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `require` with a root certificate, `verify-ca` and `verify-full`: rustls's webpki
/// checks, with the name check skipped for the first two (webpki checks the chain before
/// the name, so a name mismatch means the chain was good).
#[derive(Debug)]
struct Checked {
    inner: Arc<WebPkiServerVerifier>,
    check_name: bool,
}

impl ServerCertVerifier for Checked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The connection string without `sslmode` and `sslrootcert`, and their values.
#[derive(Debug, PartialEq, Eq)]
struct Split {
    rest: String,
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

/// Takes libpq's TLS keys out of a URL (`postgres://...?sslmode=require`) or a
/// `key=value` string, leaving the rest as it was for tokio-postgres.
fn split_tls_keys(url: &str) -> Result<Split, TlsError> {
    let mut out = Split { rest: String::new(), sslmode: None, sslrootcert: None };
    let mut take = |key: &str, value: String| match key {
        "sslmode" => {
            out.sslmode = Some(value);
            true
        }
        "sslrootcert" => {
            out.sslrootcert = Some(value);
            true
        }
        _ => false,
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (url, None),
        };
        let mut kept = vec![];
        for pair in query.into_iter().flat_map(|q| q.split('&')).filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode(k)?;
            refuse_client_certs(&key)?;
            if !take(&key, decode(v)?) {
                kept.push(pair);
            }
        }
        out.rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    } else {
        let mut kept = vec![];
        for (key, value) in key_values(url)? {
            refuse_client_certs(&key)?;
            if !take(&key, value.clone()) {
                kept.push(format!("{key}='{}'", value.replace('\\', "\\\\").replace('\'', "\\'")));
            }
        }
        out.rest = kept.join(" ");
    }
    Ok(out)
}

fn refuse_client_certs(key: &str) -> Result<(), TlsError> {
    match key {
        "sslcert" | "sslkey" | "sslpassword" | "sslcrl" | "sslcrldir" => Err(TlsError::Unsupported(format!(
            "{key} is not supported: this service checks the server's certificate (sslmode, sslrootcert) \
             but does not present a client certificate"
        ))),
        _ => Ok(()),
    }
}

fn decode(s: &str) -> Result<String, TlsError> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| TlsError::Syntax(format!("invalid percent-encoding in {s:?}")))
}

/// The pairs of a libpq `key=value` string: values may be single-quoted, and `\`
/// escapes the next character, quoted or not.
fn key_values(s: &str) -> Result<Vec<(String, String)>, TlsError> {
    let mut out = vec![];
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(TlsError::Syntax(format!("missing \"=\" after \"{key}\" in the connection string")));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => return Err(TlsError::Syntax(format!("unterminated quoted value of \"{key}\""))),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> Split {
        split_tls_keys(s).expect("split")
    }

    #[test]
    fn the_tls_keys_are_taken_out_of_a_url() {
        let s = split("postgres://u:p%40ss@db.example.com:6543/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem");
        assert_eq!(s.rest, "postgres://u:p%40ss@db.example.com:6543/app?application_name=x");
        assert_eq!(s.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(s.sslrootcert.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(split("postgresql://h/db?sslmode=require").rest, "postgresql://h/db");
        assert_eq!(split("postgres://h/db").rest, "postgres://h/db");
    }

    #[test]
    fn the_tls_keys_are_taken_out_of_a_key_value_string() {
        let s = split("host=db port=5432  sslmode = 'verify-ca' password='it\\'s' sslrootcert=/tmp/my\\ ca.pem dbname=x");
        assert_eq!(s.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(s.sslrootcert.as_deref(), Some("/tmp/my ca.pem"));
        assert_eq!(s.rest, "host='db' port='5432' password='it\\'s' dbname='x'");
        let cfg = tokio_postgres::Config::from_str(&s.rest).expect("tokio-postgres reads what is left");
        assert_eq!(cfg.get_password(), Some(&b"it's"[..]));
    }

    #[test]
    fn modes_follow_libpq() {
        let t = PgTarget::parse("host=127.0.0.1 user=u").unwrap();
        assert_eq!(t.mode, SslMode::Prefer, "libpq's default");
        assert_eq!(t.config.get_ssl_mode(), tokio_postgres::config::SslMode::Prefer);
        let t = PgTarget::parse("postgres://u@h/db?sslmode=require").unwrap();
        assert_eq!(t.config.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
        let t = PgTarget::parse("postgres://u@h/db?sslmode=disable").unwrap();
        assert_eq!(t.config.get_ssl_mode(), tokio_postgres::config::SslMode::Disable);
        // A Unix socket never carries TLS: not even asked for.
        let t = PgTarget::parse("host=/tmp/pg user=u").unwrap();
        assert_eq!(t.config.get_ssl_mode(), tokio_postgres::config::SslMode::Disable);
    }

    #[test]
    fn bad_values_are_explained() {
        let e = |s: &str| PgTarget::parse(s).map(|_| ()).expect_err(s).to_string();
        assert!(e("postgres://h/db?sslmode=allow").contains("not supported"));
        assert!(e("postgres://h/db?sslmode=bogus").contains("not one of disable"));
        assert!(
            e("postgres://h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem").contains("cannot read")
        );
        assert!(e("postgres://h/db?sslmode=require&sslrootcert=system").contains("use \"verify-full\""));
        assert!(e("postgres://h/db?sslcert=/x.pem").contains("client certificate"));
        assert!(e("host=h sslmode").contains("missing \"=\""));
    }
}
