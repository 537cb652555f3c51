//! TLS for the fake API server: a certificate authority made by the test, and the server
//! certificate it signs, served by rustls with the crypto provider the crate's features
//! give it (kube's in cni-nodes: ring).

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// A certificate authority with a key of its own, named `kubernetes` as kubeadm names a
/// cluster's: two of them differ only in their keys, so a client that accepts the wrong
/// one does not check signatures.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Default for Ca {
    /// A new CA, with a key of its own.
    fn default() -> Self {
        Self::new()
    }
}

impl Ca {
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "kubernetes");
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let key = KeyPair::generate().expect("a CA key");
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).expect("a CA certificate"),
        }
    }

    /// The CA's certificate in PEM, as a service account's `ca.crt` or a kubeconfig's
    /// `certificate-authority` holds it.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server configuration for an API server reached at `ip`: a new key, and a
    /// certificate from this CA naming that address (an IP SAN, as the API server's
    /// certificate names its Service's ClusterIP). HTTP/1.1 only, by ALPN too.
    pub fn server_config(&self, ip: IpAddr) -> Arc<ServerConfig> {
        let mut params = CertificateParams::new(vec![ip.to_string()]).expect("server parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("a server key");
        let certificate = params
            .signed_by(&key, &self.issuer)
            .expect("a server certificate");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![certificate.der().clone()], key)
            .expect("the server certificate and its key");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}
