//! The serving certificate. From files, it is loaded when the server binds, so a bad
//! pair fails at start-up, then the files are polled and reloaded when their content
//! changes. Renewed by the guard ([`crate::certs::renewal`]), it starts empty (handshakes fail
//! and the server is not ready) until the renewer hands it a certificate to serve. Polling
//! the content (not inotify on the path) also catches the atomic symlink swap a
//! Kubernetes secret volume makes. A pair that does not load (say, the certificate is
//! written and the key not yet) keeps the previous one in service.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, RwLock,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use rustls::{
    ServerConfig,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use tokio_util::sync::CancellationToken;

use crate::{Error, Result, observe::metrics::Metrics};

/// The current serving certificate, swapped in place on rotation.
#[derive(Debug)]
pub struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Option<Arc<CertifiedKey>>>,
    /// When the current certificate expires (Unix time).
    not_after: AtomicI64,
    provider: Arc<CryptoProvider>,
}

/// The contents of the two files as last seen, to notice changes.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    cert: Vec<u8>,
    key: Vec<u8>,
}

// === impl CertStore ===

impl CertStore {
    /// Loads the pair, failing if it does not make a usable certificate.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>> {
        let provider = default_provider();
        let seen = Seen::read(cert_path, key_path)?;
        let (key, not_after) = certified_key(&seen, &provider)?;
        Ok(Arc::new(Self {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            current: RwLock::new(Some(Arc::new(key))),
            not_after: AtomicI64::new(not_after),
            provider,
        }))
    }

    /// A store with nothing to serve yet, for certificates handed over by [`Self::serve`].
    pub fn empty() -> Arc<Self> {
        Arc::new(Self {
            cert_path: PathBuf::new(),
            key_path: PathBuf::new(),
            current: RwLock::new(None),
            not_after: AtomicI64::new(0),
            provider: default_provider(),
        })
    }

    /// The crypto provider certificates are checked with.
    pub fn provider(&self) -> Arc<CryptoProvider> {
        self.provider.clone()
    }

    /// Serves `key` from the next handshake on; whether it was not served already.
    pub fn serve(&self, key: Arc<CertifiedKey>, not_after: i64) -> bool {
        let mut current = self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.as_ref().is_some_and(|served| served.cert == key.cert) {
            return false;
        }
        *current = Some(key);
        self.not_after.store(not_after, Ordering::SeqCst);
        true
    }

    /// When the certificate in service expires (Unix time).
    pub fn not_after(&self) -> i64 {
        self.not_after.load(Ordering::SeqCst)
    }

    /// A rustls server configuration that serves the current certificate, speaking
    /// HTTP/2 and HTTP/1.1 (ALPN).
    pub fn server_config(self: &Arc<Self>) -> Result<ServerConfig> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|error| Error::Tls(error.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    /// Polls the files every `interval` and swaps in a changed pair that loads, until
    /// `shutdown` is cancelled.
    pub async fn watch(self: Arc<Self>, interval: Duration, metrics: Arc<Metrics>, shutdown: CancellationToken) {
        metrics.certificate_expiry(self.not_after());
        let mut seen = Seen::read(&self.cert_path, &self.key_path).ok();
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let now = match Seen::read(&self.cert_path, &self.key_path) {
                Ok(now) => now,
                Err(error) => {
                    tracing::debug!(%error, "certificate files unreadable, keeping the current pair");
                    continue;
                }
            };
            if seen.as_ref() == Some(&now) {
                continue;
            }
            match certified_key(&now, &self.provider) {
                Ok((key, not_after)) => {
                    *self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Arc::new(key));
                    self.not_after.store(not_after, Ordering::SeqCst);
                    metrics.certificate_expiry(not_after);
                    metrics.certificate_reload(true);
                    tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                }
                Err(error) => {
                    metrics.certificate_reload(false);
                    tracing::warn!(%error, "changed certificate files do not load yet, keeping the current pair");
                }
            }
            seen = Some(now);
        }
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

// === impl Seen ===

impl Seen {
    fn read(cert: &Path, key: &Path) -> Result<Self> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| Error::Io {
                path: path.to_owned(),
                source,
            })
        };
        Ok(Self {
            cert: read(cert)?,
            key: read(key)?,
        })
    }
}

/// The process's rustls provider (`main` installs ring), or ring.
fn default_provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// Parses a PEM certificate chain and key, and checks that they belong together; also
/// returns when the leaf certificate expires.
fn certified_key(seen: &Seen, provider: &CryptoProvider) -> Result<(CertifiedKey, i64)> {
    let chain = CertificateDer::pem_slice_iter(&seen.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| Error::Tls(format!("certificate: {error}")))?;
    if chain.is_empty() {
        return Err(Error::Tls("certificate file holds no certificate".to_owned()));
    }
    let (_, leaf) =
        x509_parser::parse_x509_certificate(&chain[0]).map_err(|error| Error::Tls(format!("certificate: {error}")))?;
    let not_after = leaf.validity().not_after.timestamp();
    let key = PrivateKeyDer::from_pem_slice(&seen.key).map_err(|error| Error::Tls(format!("key: {error}")))?;
    let certified = CertifiedKey::from_der(chain, key, provider)
        .map_err(|error| Error::Tls(format!("certificate and key: {error}")))?;
    Ok((certified, not_after))
}
