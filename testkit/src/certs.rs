//! Certificates made by the test: a private CA that issues server and client certificates with
//! chosen subject alternative names, as PEM text.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// What a certificate may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// A TLS server.
    Server,
    /// A TLS client.
    Client,
    /// Both (as Envoy Gateway's one certificate per component is).
    Both,
}

/// A certificate and its key, PEM-encoded.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PKCS#8 PEM).
    pub key_pem: String,
    /// The certificate (DER), to compare with what a server presents.
    pub cert_der: Vec<u8>,
}

impl Issued {
    /// Writes the certificate and key as `dir/<name>.crt` and `dir/<name>.key`.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write a certificate");
        std::fs::write(&key, &self.key_pem).expect("write a key");
        (cert, key)
    }
}

/// A private certificate authority.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// A new CA called `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, name);
        params.distinguished_name = subject;
        let key = KeyPair::generate().expect("a CA key");
        let cert = params
            .self_signed(&key)
            .expect("a self-signed CA certificate");
        Ca {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// The CA certificate (PEM).
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// Writes the CA certificate to `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, &self.pem).expect("write the CA certificate");
    }

    /// Issues a certificate named `common_name` for `sans` (DNS names or IP addresses).
    pub fn issue(&self, common_name: &str, sans: &[&str], usage: Usage) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("parameters");
        params.subject_alt_names = sans
            .iter()
            .map(|san| match san.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*san).try_into().expect("a DNS name")),
            })
            .collect();
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, common_name);
        params.distinguished_name = subject;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::Both => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        let key = KeyPair::generate().expect("a key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a certificate signed by the CA");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
        }
    }
}

/// Completes a TLS handshake with `addr` as `server_name`, trusting `ca_pem` and presenting
/// `client` if given, and answers the certificate the server presented (DER).
pub fn presented_certificate(
    addr: std::net::SocketAddr,
    server_name: &str,
    ca_pem: &str,
    client: Option<&Issued>,
) -> Result<Vec<u8>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::sync::Arc;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match client {
        Some(client) => {
            let chain = CertificateDer::pem_slice_iter(client.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            let key = PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes())
                .map_err(|e| e.to_string())?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| e.to_string())?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let mut connection =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let mut socket = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    while connection.is_handshaking() {
        connection
            .complete_io(&mut socket)
            .map_err(|e| format!("handshake: {e}"))?;
    }
    connection
        .peer_certificates()
        .and_then(|certs| certs.first())
        .map(|cert| cert.to_vec())
        .ok_or_else(|| "the server presented no certificate".to_owned())
}
