//! tls: the TLS settings crius serves and dials with, over rustls and ring. The streaming server's
//! identity comes from a certificate and key pair the operator gives, or is a self-signed
//! ECDSA P-256 certificate made at start (as containerd's `enable_tls_streaming` does); clients
//! that by design do not verify the peer (kubelet-style HTTPS probes, which skip verification as
//! kubelet's do) use `unverified_client`. Uses no other module of crius.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("TLS certificate file {path}: {reason}")]
    Cert { path: PathBuf, reason: String },
    #[error("TLS key file {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("making a self-signed certificate: {0}")]
    SelfSigned(String),
    #[error("TLS settings: {0}")]
    Config(#[from] rustls::Error),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server identity: the certificate chain (leaf first) and its key.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Identity {
    /// Reads a PEM certificate chain and a PEM key (PKCS#8, PKCS#1 or SEC1).
    pub fn from_files(cert: &Path, key: &Path) -> Result<Identity, Error> {
        let cert_err = |reason: String| Error::Cert {
            path: cert.to_path_buf(),
            reason,
        };
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|e| cert_err(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| cert_err(e.to_string()))?;
        if chain.is_empty() {
            return Err(cert_err("no PEM certificate in it".to_string()));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| Error::Key {
            path: key.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(Identity { chain, key })
    }

    /// A self-signed certificate for `names` (DNS names or IP addresses), valid from a day ago
    /// (clock skew) for a year; a new one is made at every start.
    pub fn self_signed(names: Vec<String>) -> Result<Identity, Error> {
        let err = |e: rcgen::Error| Error::SelfSigned(e.to_string());
        let mut params = rcgen::CertificateParams::new(names).map_err(err)?;
        let day = Duration::from_secs(86_400);
        let now = SystemTime::now();
        params.not_before = (now - day).into();
        params.not_after = (now + 365 * day).into();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "crius streaming server");
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let cert = params.self_signed(&key).map_err(err)?;
        Ok(Identity {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        })
    }

    /// The server side, offering HTTP/1.1 only (the streaming upgrades need it).
    pub fn server_config(self) -> Result<rustls::ServerConfig, Error> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(self.chain, self.key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// A client that accepts any server certificate (signatures are still checked against the
/// certificate it presents); for peers that are not verified by design.
pub fn unverified_client() -> Result<rustls::ClientConfig, Error> {
    let provider = provider();
    Ok(
        rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
            .with_no_client_auth(),
    )
}

/// A client that trusts only the certificates in the PEM file `ca` (a CA, or the server's own
/// self-signed certificate).
pub fn client_trusting(ca: &Path) -> Result<rustls::ClientConfig, Error> {
    let cert_err = |reason: String| Error::Cert {
        path: ca.to_path_buf(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| cert_err(e.to_string()))? {
        roots
            .add(cert.map_err(|e| cert_err(e.to_string()))?)
            .map_err(|e| cert_err(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(cert_err("no PEM certificate in it".to_string()));
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_identity_makes_a_server_config() {
        let id = Identity::self_signed(vec!["localhost".into(), "127.0.0.1".into()])
            .expect("self-signed");
        assert_eq!(id.chain.len(), 1);
        id.server_config().expect("server config");
    }

    #[test]
    fn missing_files_are_named() {
        let e = Identity::from_files(Path::new("/nonexistent/c.pem"), Path::new("/x/k.pem"))
            .err()
            .expect("error");
        assert!(e.to_string().contains("/nonexistent/c.pem"), "{e}");
    }
}
