//! Self-signed certificates for the TLS tests (rcgen), written as PEM
//! files, and the `[[listener.certificate]]` table that names them.

use std::path::{Path, PathBuf};

/// A certificate and its key written as PEM files.
pub struct Pem {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The certificate (DER), for a client's root store.
    pub der: Vec<u8>,
}

impl Pem {
    /// A self-signed certificate for `names` (CN the first name), valid
    /// from the start of year `from` to the start of year `to`, written as
    /// `<stem>.pem` and `<stem>.key` in `dir`.
    pub fn between(dir: &Path, stem: &str, names: &[&str], from: i32, to: i32) -> Pem {
        let key = rcgen::KeyPair::generate().expect("key pair");
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, names[0]);
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(to, 1, 1);
        let cert = params.self_signed(&key).expect("self-signed certificate");
        let pem = Pem {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
            der: cert.der().to_vec(),
        };
        std::fs::write(&pem.cert, cert.pem()).expect("write certificate");
        std::fs::write(&pem.key, key.serialize_pem()).expect("write key");
        pem
    }

    /// [`Pem::between`], valid now (2020 to 2100).
    pub fn new(dir: &Path, stem: &str, names: &[&str]) -> Pem {
        Pem::between(dir, stem, names, 2020, 2100)
    }
}

/// A `[[listener.certificate]]` table for `pem`.
pub fn cert_table(pem: &Pem) -> String {
    format!(
        "[[listener.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
        pem.cert.display(),
        pem.key.display()
    )
}
