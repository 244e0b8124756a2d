//! `cds-secret-guard certs`: a development CA and a serving certificate signed by it,
//! for the local control plane and for tests. In a cluster, use cert-manager.

use std::{
    fs,
    path::{Path, PathBuf},
};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use time::{Duration, OffsetDateTime};

use super::renewal::pki;

use crate::{Error, Result};

/// The files `certs` writes.
#[derive(Debug)]
pub struct CertFiles {
    /// CA certificate: the webhooks' caBundle.
    pub ca_cert: PathBuf,
    /// Serving certificate.
    pub tls_cert: PathBuf,
    /// Serving key.
    pub tls_key: PathBuf,
}

/// Writes `ca.crt`, `ca.key`, `tls.crt` and `tls.key` to `out`. A CA already in `out`
/// is reused, so a fresh serving certificate is trusted by the caBundle already registered.
pub fn write(out: &Path, hosts: &[String]) -> Result<CertFiles> {
    fs::create_dir_all(out).map_err(|source| Error::Io {
        path: out.to_owned(),
        source,
    })?;
    let (ca_cert_path, ca_key_path) = (out.join("ca.crt"), out.join("ca.key"));

    let (ca_pem, ca_key) = if ca_cert_path.exists() && ca_key_path.exists() {
        let key = KeyPair::from_pem(&read(&ca_key_path)?)?;
        (read(&ca_cert_path)?, key)
    } else {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = pki::distinguished_name("cds-secret-guard development CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        (params.not_before, params.not_after) = validity(Duration::days(3650));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        write_file(&ca_cert_path, &cert.pem(), false)?;
        write_file(&ca_key_path, &key.serialize_pem(), true)?;
        (cert.pem(), key)
    };
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;

    let mut params = pki::leaf_params(hosts)?;
    (params.not_before, params.not_after) = validity(Duration::days(365));
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    let files = CertFiles {
        ca_cert: ca_cert_path,
        tls_cert: out.join("tls.crt"),
        tls_key: out.join("tls.key"),
    };
    // Each file is replaced atomically; a server polling the pair keeps serving the old
    // one until both new files are in place.
    write_file(&files.tls_key, &key.serialize_pem(), true)?;
    write_file(&files.tls_cert, &cert.pem(), false)?;
    Ok(files)
}

/// From an hour ago (clock skew) to `lifetime` from now.
fn validity(lifetime: Duration) -> (OffsetDateTime, OffsetDateTime) {
    let now = OffsetDateTime::now_utc();
    (now - Duration::hours(1), now + lifetime)
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

/// Writes through a temporary file and a rename, so readers never see half a file.
fn write_file(path: &Path, contents: &str, private: bool) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, contents).map_err(io)?;
    if private {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    fs::rename(&tmp, path).map_err(io)
}
