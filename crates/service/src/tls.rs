//! TLS material (rustls with `ring`): server identity, client trust, and development certificates.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use crate::error::{Result, ServiceError};

/// Server identity: a PEM certificate chain and its PEM private key.
#[derive(Clone)]
pub struct TlsConfig {
    /// PEM certificate chain (leaf first).
    pub cert_pem: Vec<u8>,
    /// PEM private key of the leaf certificate.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("cert_pem_bytes", &self.cert_pem.len())
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Reads `--tls-cert` and `--tls-key` files. Errors: [`ServiceError::Io`].
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self> {
        Ok(Self {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        })
    }
}

/// What a client trusts: a PEM CA certificate and the server name to check.
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// PEM certificate of the CA that signed the server certificate.
    pub ca_pem: Vec<u8>,
    /// Name the server certificate must be valid for (e.g. `localhost`).
    pub domain: String,
}

impl ClientTls {
    /// Reads the CA certificate from a file. Errors: [`ServiceError::Io`].
    pub fn from_file(ca: &Path, domain: impl Into<String>) -> Result<Self> {
        Ok(Self {
            ca_pem: read(ca)?,
            domain: domain.into(),
        })
    }
}

fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).map_err(|e| ServiceError::io(format!("reading {}", p.display()), e))
}

/// A development PKI: a throw-away CA and a server certificate it signed.
#[derive(Clone)]
pub struct DevCert {
    /// PEM certificate of the CA (what clients trust).
    pub ca_pem: String,
    /// PEM server certificate.
    pub cert_pem: String,
    /// PEM private key of the server certificate.
    pub key_pem: String,
}

impl DevCert {
    /// The server side of this PKI.
    pub fn server_tls(&self) -> TlsConfig {
        TlsConfig {
            cert_pem: self.cert_pem.clone().into_bytes(),
            key_pem: self.key_pem.clone().into_bytes(),
        }
    }

    /// The client side of this PKI, checking `domain`.
    pub fn client_tls(&self, domain: &str) -> ClientTls {
        ClientTls {
            ca_pem: self.ca_pem.clone().into_bytes(),
            domain: domain.into(),
        }
    }
}

/// A fresh CA (ECDSA P-256, OS CSPRNG) and a server certificate for `names` (DNS names or IPs), for
/// development and tests only. Errors: [`ServiceError::Certificate`] when rcgen fails.
pub fn dev_cert(names: &[&str]) -> Result<DevCert> {
    let err = |e: rcgen::Error| ServiceError::Certificate(e.to_string());
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "cipherlora dev CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(err)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let leaf_key = KeyPair::generate().map_err(err)?;
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut leaf_params = CertificateParams::new(names).map_err(err)?;
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "cipherlora adapter server");
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).map_err(err)?;
    Ok(DevCert {
        ca_pem: ca_cert.pem(),
        cert_pem: leaf.pem(),
        key_pem: leaf_key.serialize_pem(),
    })
}

/// Paths written by [`write_dev_cert`].
#[derive(Debug, Clone)]
pub struct DevCertPaths {
    /// `DIR/ca.pem`: give to clients.
    pub ca: PathBuf,
    /// `DIR/cert.pem`: `--tls-cert`.
    pub cert: PathBuf,
    /// `DIR/key.pem`: `--tls-key` (mode 0600 on Unix).
    pub key: PathBuf,
}

/// Makes a [`dev_cert`] and writes `ca.pem`, `cert.pem` and `key.pem` into `dir`. Errors:
/// [`ServiceError::Certificate`], [`ServiceError::Io`].
pub fn write_dev_cert(dir: &Path, names: &[&str]) -> Result<DevCertPaths> {
    let c = dev_cert(names)?;
    std::fs::create_dir_all(dir)
        .map_err(|e| ServiceError::io(format!("creating {}", dir.display()), e))?;
    let paths = DevCertPaths {
        ca: dir.join("ca.pem"),
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    let write = |p: &Path, s: &str| {
        std::fs::write(p, s).map_err(|e| ServiceError::io(format!("writing {}", p.display()), e))
    };
    write(&paths.ca, &c.ca_pem)?;
    write(&paths.cert, &c.cert_pem)?;
    write(&paths.key, &c.key_pem)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&paths.key, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| ServiceError::io(format!("chmod {}", paths.key.display()), e))?;
    }
    Ok(paths)
}
