//! The renewer's certificates: making CAs and leaves (rcgen), reading them back
//! (x509-parser), and asking rustls' own verifier whether a leaf chains to a bundle, the
//! way the apiserver will.

use std::{net::IpAddr, sync::Arc};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::{
    RootCertStore,
    client::{WebPkiServerVerifier, danger::ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
    sign::CertifiedKey,
};
use time::OffsetDateTime;

use super::plan::Cert;
use crate::{Error, Result};

/// How far back a new certificate's validity starts: clocks in a cluster differ.
const BACKDATE: i64 = 300;

/// A certificate with its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPem {
    /// The certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
}

impl std::fmt::Debug for KeyPem {
    // A key is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPem")
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

/// A new self-signed CA valid from a few minutes ago to `not_after` (Unix seconds).
pub fn new_ca(name: &str, now: i64, not_after: i64) -> Result<KeyPem> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(&format!("{name} CA {now}"));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (params.not_before, params.not_after) = (time(now - BACKDATE)?, time(not_after)?);
    let cert = params.self_signed(&key)?;
    Ok(KeyPem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A serving certificate for `hosts`, signed by `ca`, valid until `not_after`.
pub fn sign_leaf(ca: &KeyPem, hosts: &[String], now: i64, not_after: i64) -> Result<KeyPem> {
    let issuer = Issuer::from_ca_cert_pem(&ca.cert, KeyPair::from_pem(&ca.key)?)?;
    let mut params = leaf_params(hosts)?;
    (params.not_before, params.not_after) = (time(now - BACKDATE)?, time(not_after)?);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(KeyPem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// What a serving certificate for `hosts` says, its validity aside: named after the
/// first host, for every host by DNS name or IP address, for TLS servers only.
pub fn leaf_params(hosts: &[String]) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(hosts.first().map_or("cds-secret-guard", String::as_str));
    params.subject_alt_names = hosts
        .iter()
        .map(|host| match host.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => host.clone().try_into().map(SanType::DnsName),
        })
        .collect::<Result<_, rcgen::Error>>()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

/// The certificates of a PEM bundle; what does not parse is left out.
pub fn bundle(pem: &[u8]) -> Vec<Cert> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(|der| der.ok())
        .filter_map(|der| cert(&der).ok())
        .collect()
}

/// A PEM bundle of `certs`.
pub fn bundle_pem(certs: &[Cert]) -> String {
    certs
        .iter()
        .map(|cert| {
            let block = pem::Pem::new("CERTIFICATE", cert.der.clone());
            pem::encode_config(&block, pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF))
        })
        .collect()
}

/// One certificate, DER, as the plan sees it.
pub fn cert(der: &[u8]) -> Result<Cert> {
    let (_, parsed) = x509_parser::parse_x509_certificate(der).map_err(|error| Error::Tls(error.to_string()))?;
    Ok(Cert {
        der: der.to_vec(),
        not_after: parsed.validity().not_after.timestamp(),
    })
}

/// The first certificate of a PEM text.
pub fn first_cert(pem: &str) -> Result<Cert> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|error| Error::Tls(error.to_string()))?;
    cert(&der)
}

/// When a certificate's validity starts (Unix seconds).
pub fn not_before(der: &[u8]) -> Result<i64> {
    let (_, parsed) = x509_parser::parse_x509_certificate(der).map_err(|error| Error::Tls(error.to_string()))?;
    Ok(parsed.validity().not_before.timestamp())
}

/// A serving key for rustls, if the certificate and key belong together.
pub fn certified_key(leaf: &KeyPem, provider: &CryptoProvider) -> Result<CertifiedKey> {
    let der = CertificateDer::from_pem_slice(leaf.cert.as_bytes()).map_err(|error| Error::Tls(error.to_string()))?;
    let key =
        PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).map_err(|error| Error::Tls(format!("key: {error}")))?;
    CertifiedKey::from_der(vec![der], key, provider)
        .map_err(|error| Error::Tls(format!("certificate and key: {error}")))
}

/// Whether `leaf` verifies, now, for `host`, against the CAs of `roots`: what the
/// apiserver will check when it holds `roots` as a webhook's caBundle.
pub fn chains_to(leaf: &[u8], roots: &[Cert], host: &str, provider: &Arc<CryptoProvider>) -> bool {
    let mut store = RootCertStore::empty();
    for root in roots {
        // A root that webpki cannot use is no root; the others still count.
        let _ = store.add(CertificateDer::from(root.der.clone()));
    }
    let Ok(verifier) = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone()).build() else {
        return false;
    };
    let Ok(name) = ServerName::try_from(host.to_owned()) else {
        return false;
    };
    verifier
        .verify_server_cert(&CertificateDer::from(leaf.to_vec()), &[], &name, &[], UnixTime::now())
        .is_ok()
}

/// Whether `leaf` names exactly `hosts` (DNS names and IP addresses, in any order).
pub fn names_exactly(leaf: &[u8], hosts: &[String]) -> bool {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(leaf) else {
        return false;
    };
    let Ok(Some(names)) = parsed.subject_alternative_name() else {
        return hosts.is_empty();
    };
    let named: Vec<String> = names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            x509_parser::extensions::GeneralName::IPAddress(bytes) => ip(bytes).map(|ip| ip.to_string()),
            _ => None,
        })
        .collect();
    let wanted: Vec<String> = hosts
        .iter()
        .map(|host| {
            host.parse::<IpAddr>()
                .map_or_else(|_| host.clone(), |ip| ip.to_string())
        })
        .collect();
    named.len() == wanted.len() && wanted.iter().all(|host| named.contains(host))
}

fn ip(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

fn time(unix: i64) -> Result<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp(unix).map_err(|error| Error::Tls(format!("time {unix}: {error}")))
}

/// A name of its common name alone.
pub(crate) fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn now() -> i64 {
        OffsetDateTime::now_utc().unix_timestamp()
    }

    #[test]
    fn a_leaf_chains_to_its_ca_only_for_its_hosts() {
        let hosts = vec!["guard.ns.svc".to_owned(), "127.0.0.1".to_owned()];
        let ca = new_ca("test", now(), now() + 3600).unwrap();
        let other = new_ca("other", now(), now() + 3600).unwrap();
        let leaf = sign_leaf(&ca, &hosts, now(), now() + 600).unwrap();
        let leaf_der = first_cert(&leaf.cert).unwrap().der;
        let (ca, other) = (first_cert(&ca.cert).unwrap(), first_cert(&other.cert).unwrap());

        assert!(chains_to(
            &leaf_der,
            std::slice::from_ref(&ca),
            "guard.ns.svc",
            &provider()
        ));
        assert!(chains_to(
            &leaf_der,
            &[other.clone(), ca.clone()],
            "127.0.0.1",
            &provider()
        ));
        assert!(!chains_to(&leaf_der, &[other], "guard.ns.svc", &provider()));
        assert!(!chains_to(&leaf_der, &[ca], "elsewhere.ns.svc", &provider()));
        assert!(!chains_to(&leaf_der, &[], "guard.ns.svc", &provider()));
        assert!(names_exactly(&leaf_der, &hosts));
        assert!(!names_exactly(&leaf_der, &hosts[..1]));
    }

    #[test]
    fn an_expired_ca_verifies_nothing_and_a_bundle_round_trips() {
        let hosts = vec!["guard.ns.svc".to_owned()];
        let ca = new_ca("test", now() - 7200, now() - 60).unwrap();
        let leaf = sign_leaf(&ca, &hosts, now() - 7200, now() - 60).unwrap();
        let ca = first_cert(&ca.cert).unwrap();
        assert!(!chains_to(
            &first_cert(&leaf.cert).unwrap().der,
            std::slice::from_ref(&ca),
            "guard.ns.svc",
            &provider()
        ));

        let fresh = first_cert(&new_ca("b", now(), now() + 60).unwrap().cert).unwrap();
        let certs = vec![ca, fresh];
        assert_eq!(bundle(bundle_pem(&certs).as_bytes()), certs);
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let ca = new_ca("test", now(), now() + 3600).unwrap();
        let a = sign_leaf(&ca, &["a".to_owned()], now(), now() + 60).unwrap();
        let b = sign_leaf(&ca, &["a".to_owned()], now(), now() + 60).unwrap();
        assert!(certified_key(&a, &provider()).is_ok());
        let mixed = KeyPem {
            cert: a.cert,
            key: b.key,
        };
        assert!(certified_key(&mixed, &provider()).is_err());
    }
}
