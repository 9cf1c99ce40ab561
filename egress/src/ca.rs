//! The certificate authority of inspected HTTPS: a CA made fresh for each run (or service
//! start), installed in the guests that have request rules, and leaf certificates it mints
//! per host; and the trust store the proxy checks upstream TLS against.

/// Why a certificate or a TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{what}")]
    Certificate {
        what: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("{what}")]
    Tls {
        what: String,
        #[source]
        source: rustls::Error,
    },
    #[error("FARM_EGRESS_EXTRA_CA = {path}: {message}")]
    ExtraCa { path: String, message: String },
}

/// The certificate authority a VM's proxy answers inspected HTTPS hosts with: made fresh for
/// each run (or service start) and installed in the guests that have request rules. Its key
/// never leaves the host. Leaf certificates are minted per host on first use.
pub struct Ca {
    pem: String,
    der: rustls::pki_types::CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    leaves: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<rustls::ServerConfig>>>,
}

impl Ca {
    pub fn generate(name: &str) -> Result<Ca, CaError> {
        let certificate = |what: &str| {
            let what = what.to_string();
            move |source| CaError::Certificate { what, source }
        };
        let key = rcgen::KeyPair::generate().map_err(certificate("making the egress CA's key"))?;
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("farm egress CA ({name})"));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).map_err(certificate("making the egress CA"))?;
        Ok(Ca {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: rcgen::Issuer::new(params, key),
            leaves: Default::default(),
        })
    }

    /// The CA certificate, PEM (what guests trust).
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A TLS server configuration presenting a certificate for `host`, signed by the CA.
    pub fn server_config(&self, host: &str) -> Result<std::sync::Arc<rustls::ServerConfig>, CaError> {
        let host = host.to_ascii_lowercase();
        if let Some(c) = self.leaves.lock().unwrap_or_else(|e| e.into_inner()).get(&host) {
            return Ok(c.clone());
        }
        let certificate = |what: &str| {
            let what = format!("{what} for {host}");
            move |source| CaError::Certificate { what, source }
        };
        let tls = |what: &str| {
            let what = format!("{what} for {host}");
            move |source| CaError::Tls { what, source }
        };
        let key = rcgen::KeyPair::generate().map_err(certificate("a key"))?;
        let mut params = rcgen::CertificateParams::new(vec![host.clone()]).map_err(certificate("a certificate"))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, host.clone());
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(certificate("signing a certificate"))?;
        let key_der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(tls("TLS versions"))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone(), self.der.clone()], key_der)
            .map_err(tls("a TLS configuration"))?;
        let config = std::sync::Arc::new(config);
        self.leaves
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(host, config.clone());
        Ok(config)
    }
}

/// How the proxy checks upstream TLS: the host's trust store (`/etc/ssl/certs`, through
/// rustls-native-certs), plus the PEM file `FARM_EGRESS_EXTRA_CA` names (a private CA of the
/// operator's services). Made once.
pub fn upstream_tls() -> Result<std::sync::Arc<rustls::ClientConfig>, std::sync::Arc<CaError>> {
    type Made = Result<std::sync::Arc<rustls::ClientConfig>, std::sync::Arc<CaError>>;
    static CONFIG: std::sync::OnceLock<Made> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| make_upstream_tls().map_err(std::sync::Arc::new))
        .clone()
}

fn make_upstream_tls() -> Result<std::sync::Arc<rustls::ClientConfig>, CaError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if let Ok(path) = std::env::var("FARM_EGRESS_EXTRA_CA") {
        use rustls::pki_types::pem::PemObject;
        let extra = |message: String| CaError::ExtraCa {
            path: path.clone(),
            message,
        };
        let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(&path)
            .map_err(|e| extra(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| extra(e.to_string()))?;
        for cert in certs {
            roots.add(cert).map_err(|e| extra(e.to_string()))?;
        }
    }
    if roots.is_empty() {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| CaError::Tls {
            what: "TLS versions for upstream connections".into(),
            source,
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_ca_mints_certificates_a_guest_trusting_it_accepts_for_that_host_only() {
        use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
        let ca = Ca::generate("test").unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap())
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let client = std::sync::Arc::new(
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        );
        let handshake = |asked: &'static str, served: &'static str| {
            let (client, server_config) = (client.clone(), ca.server_config(served).unwrap());
            async move {
                let (a, b) = tokio::io::duplex(1 << 16);
                let server =
                    tokio::spawn(async move { tokio_rustls::TlsAcceptor::from(server_config).accept(b).await.is_ok() });
                let ok = tokio_rustls::TlsConnector::from(client)
                    .connect(ServerName::try_from(asked).unwrap(), a)
                    .await
                    .is_ok();
                let _ = server.await;
                ok
            }
        };
        assert!(
            handshake("api.internal", "api.internal").await,
            "a guest trusting the CA accepts the host's certificate"
        );
        assert!(
            !handshake("bank.example", "api.internal").await,
            "and no other name with it"
        );
        assert!(
            std::sync::Arc::ptr_eq(
                &ca.server_config("API.internal").unwrap(),
                &ca.server_config("api.internal").unwrap()
            ),
            "minted once per host"
        );
        assert!(
            !Ca::generate("other").unwrap().pem().is_empty() && Ca::generate("x").unwrap().pem() != ca.pem(),
            "a new CA each time"
        );
    }
}
