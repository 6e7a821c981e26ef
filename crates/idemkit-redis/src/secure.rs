//! What secures and authenticates a store's connections: TLS material (a certificate
//! authority, a client certificate, from files or bytes), an ACL user's credentials (never
//! printed), the crypto provider rustls needs, and the errors of a refused handshake.

use std::path::PathBuf;

use idemkit_core::{StoreError, StoreErrorKind};
use redis::{ClientTlsConfig, TlsCertificates};

use crate::errors::map_err;

/// A user (or the default one) and its password, which `Debug` never prints.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) user: Option<String>,
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// A PEM file's bytes, or the file to read them from at connect.
#[derive(Clone)]
pub(crate) enum Pem {
    Bytes(Vec<u8>),
    File(PathBuf),
}

impl Pem {
    fn read(&self, what: &str) -> Result<Vec<u8>, StoreError> {
        match self {
            Pem::Bytes(b) => Ok(b.clone()),
            Pem::File(path) => std::fs::read(path).map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Other,
                    format!("the {what} file {}: {e}", path.display()),
                )
            }),
        }
    }
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // A client key is a secret: its bytes are never printed.
            Pem::Bytes(b) => write!(f, "<{} bytes of PEM>", b.len()),
            Pem::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// What a `rediss://` connection trusts and presents beyond the defaults (the system's
/// roots, no client certificate).
#[derive(Debug, Clone, Default)]
pub(crate) struct Tls {
    pub(crate) ca: Option<Pem>,
    pub(crate) client: Option<(Pem, Pem)>,
}

impl Tls {
    pub(crate) fn certificates(&self) -> Result<Option<TlsCertificates>, StoreError> {
        if self.ca.is_none() && self.client.is_none() {
            return Ok(None);
        }
        let root_cert = match &self.ca {
            Some(ca) => Some(ca.read("certificate authority")?),
            None => None,
        };
        let client_tls = match &self.client {
            Some((cert, key)) => Some(ClientTlsConfig {
                client_cert: cert.read("client certificate")?,
                client_key: key.read("client key")?,
            }),
            None => None,
        };
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}

/// Makes sure rustls has a process-wide crypto provider for `rediss://` connections: ring,
/// unless the application installed one (which is then used). Without it, rustls picks one
/// from its crate features, and panics in a build where both ring and aws-lc-rs are on.
pub(crate) fn crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one first: either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A failed first connect. Over TLS, an I/O failure that is not a refusal, a timeout or a
/// dropped connection is the handshake refused (a certificate not trusted, a name that does
/// not match, a client certificate missing): rustls' errors come as I/O errors of invalid
/// data. A configuration to fix, not an outage to wait out: `Other`.
pub(crate) fn connect_err(e: redis::RedisError, tls: bool) -> StoreError {
    if tls
        && e.is_io_error()
        && !(e.is_connection_refusal() || e.is_timeout() || e.is_connection_dropped())
    {
        return StoreError::new(StoreErrorKind::Other, e);
    }
    map_err(e)
}

/// TLS material given for a plain `redis://` URL: refused, never sent in plain text.
pub(crate) fn plain_url_with_tls() -> StoreError {
    StoreError::new(
        StoreErrorKind::Other,
        "a certificate authority or client certificate was given, but the URL is redis:// \
         (plain text): use rediss://",
    )
}
