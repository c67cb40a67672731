//! Test certificates made by the `openssl` command: a CA and certificates it signs, laid out as
//! Envoy Gateway mounts them (`tls.crt`, `tls.key`, `ca.crt` in one directory). Keys are RSA 2048
//! in PKCS#1 PEM (`BEGIN RSA PRIVATE KEY`), the form Envoy Gateway's certificate generator
//! writes, so the tests load what a real deployment loads.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tempfile::TempDir;

/// What a certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// A TLS server (extended key usage `serverAuth`).
    Server,
    /// A TLS client (extended key usage `clientAuth`).
    Client,
}

/// A certificate authority in a temporary directory; its files live as long as it does.
#[derive(Debug)]
pub struct Authority {
    dir: TempDir,
    name: String,
}

/// A certificate issued by an [`Authority`]: a directory holding `tls.crt`, `tls.key` and the
/// CA's `ca.crt`.
#[derive(Debug, Clone)]
pub struct Issued {
    dir: PathBuf,
}

impl Issued {
    /// Files written by another issuer: `dir` must hold `tls.crt`, `tls.key` and `ca.crt`. For a
    /// server that has to share its CA with certificates a test made by other means.
    pub fn from_dir(dir: PathBuf) -> Issued {
        Issued { dir }
    }

    /// The directory (`/certs` in Envoy Gateway's pods).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The certificate, PEM.
    pub fn cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    /// Its private key, PKCS#1 PEM.
    pub fn key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }

    /// The issuing CA's certificate, PEM.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
}

/// One CA shared by every test of a test binary (making RSA keys takes a moment), with the
/// certificates the xDS tests use, issued once.
#[derive(Debug)]
pub struct TestPki {
    /// The CA.
    pub authority: Authority,
    /// The management server's: Envoy Gateway's names, plus `localhost` and `127.0.0.1`.
    pub server: Issued,
    /// tollgate's client certificate (Envoy Gateway gives the rate-limit pods CN `*`).
    pub client: Issued,
}

impl TestPki {
    /// The shared set, made on first use.
    pub fn shared() -> &'static TestPki {
        static PKI: OnceLock<TestPki> = OnceLock::new();
        PKI.get_or_init(|| {
            let authority = Authority::new("tollgate test CA");
            let server = authority.issue(
                "envoy-gateway",
                Usage::Server,
                &[
                    "DNS:envoy-gateway",
                    "DNS:envoy-gateway.envoy-gateway-system",
                    "DNS:envoy-gateway.envoy-gateway-system.svc",
                    "DNS:envoy-gateway.envoy-gateway-system.svc.cluster.local",
                    "DNS:localhost",
                    "IP:127.0.0.1",
                ],
            );
            let client = authority.issue("*", Usage::Client, &["DNS:*.envoy-gateway-system"]);
            TestPki {
                authority,
                server,
                client,
            }
        })
    }
}

impl Authority {
    /// A new self-signed CA called `name`.
    pub fn new(name: &str) -> Authority {
        let dir = tempfile::tempdir().expect("create a directory for certificates");
        let config = dir.path().join("ca.cnf");
        std::fs::write(
            &config,
            format!(
                "[req]\ndistinguished_name = dn\nprompt = no\nx509_extensions = v3\n\
                 [dn]\nCN = {name}\n\
                 [v3]\nbasicConstraints = critical,CA:TRUE\n\
                 keyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n"
            ),
        )
        .expect("write the CA's openssl config");
        openssl(
            dir.path(),
            &[
                "req", "-x509", "-config", "ca.cnf", "-newkey", "rsa:2048", "-nodes", "-keyout",
                "ca.key", "-out", "ca.crt", "-days", "7",
            ],
        );
        Authority {
            dir,
            name: name.to_owned(),
        }
    }

    /// The CA certificate, PEM.
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// Issues a certificate with common name `common_name`, for `usage`, valid for
    /// `subject_alt_names` (openssl's spelling: `DNS:name`, `IP:127.0.0.1`).
    pub fn issue(&self, common_name: &str, usage: Usage, subject_alt_names: &[&str]) -> Issued {
        let label = format!(
            "{}-{}",
            match usage {
                Usage::Server => "server",
                Usage::Client => "client",
            },
            std::fs::read_dir(self.dir.path()).map_or(0, |d| d.count())
        );
        let dir = self.dir.path().join(&label);
        std::fs::create_dir(&dir).expect("create a certificate directory");
        let extensions = format!(
            "[v3]\nbasicConstraints = critical,CA:FALSE\n\
             keyUsage = critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage = {}\nsubjectAltName = {}\n\
             subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n",
            match usage {
                Usage::Server => "serverAuth",
                Usage::Client => "clientAuth",
            },
            subject_alt_names.join(",")
        );
        std::fs::write(dir.join("ext.cnf"), extensions).expect("write the extensions");
        std::fs::write(
            dir.join("req.cnf"),
            format!("[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = {common_name}\n"),
        )
        .expect("write the request config");
        openssl(&dir, &["genrsa", "-traditional", "-out", "tls.key", "2048"]);
        openssl(
            &dir,
            &[
                "req", "-new", "-config", "req.cnf", "-key", "tls.key", "-out", "tls.csr",
            ],
        );
        let serial = format!("0x{:016x}", fastrand_serial());
        let ca = self.cert();
        let ca_key = self.dir.path().join("ca.key");
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "tls.csr",
                "-CA",
                ca.to_str().expect("a UTF-8 path"),
                "-CAkey",
                ca_key.to_str().expect("a UTF-8 path"),
                "-set_serial",
                &serial,
                "-days",
                "7",
                "-extfile",
                "ext.cnf",
                "-extensions",
                "v3",
                "-out",
                "tls.crt",
            ],
        );
        std::fs::copy(&ca, dir.join("ca.crt")).expect("copy the CA certificate");
        Issued { dir }
    }

    /// The CA's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A serial number unlikely to repeat between certificates of one CA.
fn fastrand_serial() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos as u64) ^ (u64::from(std::process::id()) << 32) | 1
}

/// Runs `openssl args` in `dir`; panics with its output if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|err| panic!("cannot run openssl: {err}"));
    assert!(
        output.status.success(),
        "openssl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}
