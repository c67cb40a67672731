//! TLS for the gRPC listener: the server certificate, and with a client CA, mutual TLS (client
//! certificates required and verified, optionally carrying a given DNS SAN).
//!
//! Certificates are re-read when their files change: cert-manager renews them in place and a
//! Kubernetes Secret mount swaps a symlink, and neither restarts the process. The files are
//! polled ([`ServerTls::watch`]); a change is loaded whole (certificate, key and CA together) and
//! installed for the next handshakes, while connections already established keep the session they
//! have. A change that does not load (a key that does not match the certificate while the files
//! are half-written, say) is logged and the last good material stays.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use tokio_rustls::TlsAcceptor;

/// Where the server's TLS material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA that client certificates must chain to; when set, clients must present one.
    pub client_ca: Option<PathBuf>,
    /// A DNS name client certificates must carry as a subject alternative name.
    pub client_san: Option<String>,
}

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file does not hold what it should.
    #[error("{path}: {message}")]
    Content {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the material.
    #[error("TLS setup failed: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Loaded material, swapped whole on reload.
#[derive(Debug)]
struct Material {
    key: Arc<CertifiedKey>,
    /// The verifier of client certificates (mTLS only).
    clients: Option<Arc<dyn ClientCertVerifier>>,
    /// A digest of the files it was loaded from.
    fingerprint: u64,
}

/// The gRPC listener's TLS: an acceptor whose certificate and client CA follow their files.
pub struct ServerTls {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: Arc<ArcSwap<Material>>,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the material for the first time; any error stops start-up, naming the file.
    pub fn load(files: TlsFiles) -> Result<Arc<ServerTls>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let material = load_material(&files, &provider)?;
        let mutual = material.clients.is_some();
        let current = Arc::new(ArcSwap::from_pointee(material));
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?;
        let builder = if mutual {
            builder.with_client_cert_verifier(Arc::new(CurrentClients {
                current: Arc::clone(&current),
                supported: provider
                    .signature_verification_algorithms
                    .supported_schemes(),
            }))
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_cert_resolver(Arc::new(CurrentKey {
            current: Arc::clone(&current),
        }));
        // gRPC is HTTP/2; gRPC clients (and Envoy) offer h2 and some insist on it.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(ServerTls {
            files,
            provider,
            current,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        }))
    }

    /// Accepts TLS connections with the material in force at each handshake.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }

    /// Whether clients must present a certificate.
    pub fn is_mutual(&self) -> bool {
        self.current.load().clients.is_some()
    }

    /// Re-reads the files when they change, every `interval`, forever.
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(100)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_failed = None;
        loop {
            ticker.tick().await;
            self.reload_if_changed(&mut last_failed);
        }
    }

    /// Loads the files if they differ from the material in force; answers whether it did.
    fn reload_if_changed(&self, last_failed: &mut Option<u64>) -> bool {
        let fingerprint = fingerprint(&self.files);
        if fingerprint == self.current.load().fingerprint || Some(fingerprint) == *last_failed {
            return false;
        }
        match load_material(&self.files, &self.provider) {
            Ok(material) if material.clients.is_some() == self.is_mutual() => {
                self.current.store(Arc::new(material));
                *last_failed = None;
                tracing::info!(cert = %self.files.cert.display(), "gRPC TLS certificate reloaded");
                true
            }
            Ok(_) => {
                *last_failed = Some(fingerprint);
                tracing::error!(
                    "gRPC TLS reload skipped: turning client verification on or off needs a restart"
                );
                false
            }
            Err(error) => {
                // Files swapped one by one can be inconsistent for a moment; the next change
                // (the last file written) is tried again.
                *last_failed = Some(fingerprint);
                tracing::error!(%error, "gRPC TLS reload failed; still serving the last good certificate");
                false
            }
        }
    }
}

/// A digest of the TLS files' contents (following symlinks, as a Secret mount needs).
fn fingerprint(files: &TlsFiles) -> u64 {
    let mut hasher = DefaultHasher::new();
    for path in [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        std::fs::read(path).ok().hash(&mut hasher);
    }
    hasher.finish()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| TlsError::Content {
            path: path.to_path_buf(),
            message: format!("not a PEM certificate file: {err}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Content {
            path: path.to_path_buf(),
            message: "no certificate in the file (expected -----BEGIN CERTIFICATE-----)".into(),
        });
    }
    Ok(certs)
}

fn load_material(files: &TlsFiles, provider: &CryptoProvider) -> Result<Material, TlsError> {
    let fingerprint = fingerprint(files);
    let chain = certificates(&files.cert, &read(&files.cert)?)?;
    let key_pem = read(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|err| TlsError::Content {
        path: files.key.clone(),
        message: format!("no private key in the file ({err})"),
    })?;
    let key = CertifiedKey::from_der(chain, key, provider).map_err(|err| TlsError::Content {
        path: files.key.clone(),
        message: format!("the key does not fit {}: {err}", files.cert.display()),
    })?;
    let clients = match &files.client_ca {
        None => None,
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca, &read(ca)?)? {
                roots.add(cert).map_err(|err| TlsError::Content {
                    path: ca.clone(),
                    message: format!("not a usable CA certificate: {err}"),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                Arc::new(provider.clone()),
            )
            .build()
            .map_err(|err| TlsError::Content {
                path: ca.clone(),
                message: format!("cannot verify clients with this CA: {err}"),
            })?;
            let verifier: Arc<dyn ClientCertVerifier> = match &files.client_san {
                Some(san) => Arc::new(RequireSan {
                    inner: verifier,
                    san: ServerName::try_from(san.clone()).map_err(|err| TlsError::Content {
                        path: ca.clone(),
                        message: format!("client SAN `{san}` is not a DNS name: {err}"),
                    })?,
                }),
                None => verifier,
            };
            Some(verifier)
        }
    };
    Ok(Material {
        key: Arc::new(key),
        clients,
        fingerprint,
    })
}

/// Serves the certificate in force.
#[derive(Debug)]
struct CurrentKey {
    current: Arc<ArcSwap<Material>>,
}

impl ResolvesServerCert for CurrentKey {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.current.load().key))
    }
}

/// Verifies client certificates with the CA in force.
#[derive(Debug)]
struct CurrentClients {
    current: Arc<ArcSwap<Material>>,
    supported: Vec<SignatureScheme>,
}

impl CurrentClients {
    fn verifier(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        self.current
            .load()
            .clients
            .clone()
            .ok_or_else(|| rustls::Error::General("client verification is off".into()))
    }
}

impl ClientCertVerifier for CurrentClients {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    // No CA names are hinted (they would have to outlive a reload); clients send the
    // certificate they are configured with.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.verifier()?
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier()?.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.supported.clone()
    }
}

/// A client verifier that also requires a DNS subject alternative name.
#[derive(Debug)]
struct RequireSan {
    inner: Arc<dyn ClientCertVerifier>,
    san: ServerName<'static>,
}

impl ClientCertVerifier for RequireSan {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        cert.verify_is_valid_for_subject_name(&self.san)
            .map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            })?;
        Ok(verified)
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
