//! TLS on client-facing listeners (`[[listener.certificate]]`): the
//! certificates read from their PEM files and checked (readable, a key
//! that matches, valid now), the certificate chosen by SNI, and the one
//! place the rustls `ServerConfig` of a listener is built.
//!
//! Everything a listener's TLS needs is built by [`server_config`], at
//! start-up, by `portico check`, and again at each reload (SIGHUP), so a
//! renewed certificate is picked up by new handshakes while connections
//! already established keep the keys they negotiated. The session cache
//! and ticketer (`tls_resume`) are set there too, and ALPN protocols belong there.
//!
//! The handshake and the record layer of an established connection are
//! in `http1::tls`.

use crate::config::{CertificateConfig, Config, ListenerConfig, TlsVersion};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, ServerConfig};
use rustls::sign::CertifiedKey;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// The TLS configuration of listener `l` (None: a plain TCP listener).
/// The error names the listener, the config key and the file.
pub fn server_config(l: &ListenerConfig) -> Result<Option<Arc<ServerConfig>>, String> {
    server_config_at(l, now_unix())
}

/// [`server_config`] with the clock a parameter (seconds since the epoch).
fn server_config_at(l: &ListenerConfig, now: i64) -> Result<Option<Arc<ServerConfig>>, String> {
    if l.certificate.is_empty() {
        return Ok(None);
    }
    let provider = Arc::new(provider());
    let mut certs = Vec::with_capacity(l.certificate.len());
    for (i, c) in l.certificate.iter().enumerate() {
        let cert = load_certificate(c, &provider, now)
            .map_err(|e| format!("listener {} (listener.certificate[{i}]): {e}", l.address))?;
        certs.push(cert);
    }
    // rustls's defaults otherwise: its cipher suites (AEAD with forward
    // secrecy only: no CBC, RC4 or static RSA key exchange) in Portico's
    // order ([`provider`]), its key exchange groups (X25519, P-256,
    // P-384, then the X25519MLKEM768 hybrid), no client certificates.
    let versions: &[&rustls::SupportedProtocolVersion] = match l.tls_min_version {
        TlsVersion::V1_2 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::V1_3 => &[&rustls::version::TLS13],
    };
    let resumption = crate::tls_resume::listener_id(
        &l.address,
        certs.iter().flat_map(|c| c.key.cert.iter().map(|d| d.as_ref())),
    );
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| format!("listener {}: TLS: {e}", l.address))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(BySni { certs }));
    config.alpn_protocols = alpn_protocols(l);
    // The suite is Portico's first choice among the client's, not the
    // client's first: see `provider`.
    config.ignore_client_order = true;
    // Session resumption ([tls]): the process's session cache and ticket
    // keys, which outlive this config (a reload keeps sessions resumable).
    crate::tls_resume::apply(&mut config, resumption);
    Ok(Some(Arc::new(config)))
}

/// rustls's aws-lc-rs provider (AWS-LC) with its cipher suites reordered.
///
/// AWS-LC rather than ring for the server side, because of what dominates a
/// handshake's CPU: AWS-LC signs with RSA-2048 using AVX-512 IFMA where the
/// CPU has it (as OpenSSL 3 does; ring has no such path) and computes
/// X25519 in assembly. On the bench machine (AMD EPYC, AVX-512), full
/// handshakes per core went from 1,740 to 2,690 (nginx with OpenSSL 3.0:
/// about 1,930) and resumed ones from 7,400 to 7,740.
///
/// The order: AES-128-GCM, then ChaCha20-Poly1305, then AES-256-GCM, for
/// TLS 1.3 and 1.2 alike (Go's crypto/tls orders them so too). Clients
/// (OpenSSL's, so curl's and wrk's) list AES-256-GCM first, and TLS 1.3's
/// AES-256 suite computes its key schedule with SHA-384, which x86 CPUs
/// without SHA-512 instructions (most of them) run in plain code, where
/// SHA-256 has instructions: a tenth of a resumed handshake's CPU was that
/// SHA-384. AES-128 is 128-bit security, the level of the X25519 and P-256
/// exchanges that carry its key.
fn provider() -> CryptoProvider {
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    // Stable: within a rank, rustls's order (TLS 1.3 first, ECDSA first).
    p.cipher_suites.sort_by_key(|s| suite_rank(s.suite()));
    p
}

/// A suite's place in Portico's order: 0 AES-128-GCM, 1 ChaCha20-Poly1305,
/// 2 the others (AES-256-GCM).
fn suite_rank(s: rustls::CipherSuite) -> u8 {
    use rustls::CipherSuite as C;
    match s {
        C::TLS13_AES_128_GCM_SHA256
        | C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 0,
        C::TLS13_CHACHA20_POLY1305_SHA256
        | C::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        | C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => 1,
        _ => 2,
    }
}

/// The ALPN protocols a TLS listener offers, preferred first: `h2` when
/// `http2` allows it, then `http/1.1`. A client that offers neither (or
/// no ALPN at all) is served HTTP/1.1, as before ALPN existed.
fn alpn_protocols(l: &ListenerConfig) -> Vec<Vec<u8>> {
    let mut p = Vec::with_capacity(2);
    if l.offers_h2() {
        p.push(b"h2".to_vec());
    }
    p.push(b"http/1.1".to_vec());
    p
}

/// Checks every TLS listener's certificates (start-up and `portico check`).
pub fn check_listeners(c: &Config) -> Result<(), String> {
    for l in &c.listener {
        server_config(l)?;
    }
    Ok(())
}

/// The current time in seconds since the epoch.
fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// One certificate of a listener: its chain and key, and the host names
/// it answers for.
#[derive(Debug)]
struct Named {
    /// Lower-case DNS names (`*.example.com` for a wildcard).
    names: Vec<String>,
    key: Arc<CertifiedKey>,
}

/// Reads and checks one `[[listener.certificate]]`.
fn load_certificate(c: &CertificateConfig, provider: &CryptoProvider, now: i64) -> Result<Named, String> {
    let cert_file = c.cert.display();
    let key_file = c.key.display();
    let cert_pem = read(&c.cert, "certificate")?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("certificate file {cert_file}: not valid PEM: {e}"))?;
    let Some(leaf) = chain.first() else {
        return Err(format!(
            "certificate file {cert_file}: no certificate in it (expected a PEM `BEGIN CERTIFICATE` block)"
        ));
    };
    let (validity, names) = leaf_facts(leaf).map_err(|e| format!("certificate file {cert_file}: {e}"))?;
    check_validity(validity, now).map_err(|e| format!("certificate file {cert_file}: {e}"))?;
    let key_pem = read(&c.key, "key")?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => format!(
            "key file {key_file}: no private key in it (expected a PEM `BEGIN PRIVATE KEY`, `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY` block)"
        ),
        e => format!("key file {key_file}: not valid PEM: {e}"),
    })?;
    let key = CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            format!("key file {key_file} does not match the certificate in {cert_file}")
        }
        e => format!("key file {key_file}: unusable private key: {e}"),
    })?;
    Ok(Named {
        names,
        key: Arc::new(key),
    })
}

/// Reads a PEM file; the error names it.
fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    if path.as_os_str().is_empty() {
        return Err(format!(
            "no {what} file given (`{}` is empty)",
            if what == "key" { "key" } else { "cert" }
        ));
    }
    std::fs::read(path).map_err(|e| {
        format!(
            "{what} file {}: cannot read it: {}",
            path.display(),
            crate::util::io_cause(&e)
        )
    })
}

/// A certificate's validity period, seconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Validity {
    not_before: i64,
    not_after: i64,
}

/// The validity period and DNS names (subjectAltName dNSName entries,
/// else the subject's common name) of a DER certificate.
fn leaf_facts(der: &[u8]) -> Result<(Validity, Vec<String>), String> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| format!("the certificate cannot be parsed: {e}"))?;
    let v = cert.validity();
    let validity = Validity {
        not_before: v.not_before.timestamp(),
        not_after: v.not_after.timestamp(),
    };
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                names.push(d.to_ascii_lowercase());
            }
        }
    }
    if names.is_empty() {
        names.extend(
            cert.subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok())
                .map(str::to_ascii_lowercase),
        );
    }
    Ok((validity, names))
}

/// Refuses a certificate that has expired or is not valid yet at `now`:
/// every client would refuse it, so it is better found at start-up.
fn check_validity(v: Validity, now: i64) -> Result<(), String> {
    let date = |t: i64| {
        time::OffsetDateTime::from_unix_timestamp(t)
            .ok()
            .and_then(|d| {
                d.format(time::macros::format_description!(
                    "[year]-[month]-[day] [hour]:[minute]:[second] UTC"
                ))
                .ok()
            })
            .unwrap_or_else(|| t.to_string())
    };
    if now > v.not_after {
        return Err(format!("the certificate expired on {}", date(v.not_after)));
    }
    if now < v.not_before {
        return Err(format!("the certificate is not valid before {}", date(v.not_before)));
    }
    Ok(())
}

/// Chooses a listener's certificate by the name the client sent (SNI):
/// the first whose names match, else the first one (clients without SNI,
/// an IP address, an unknown name), as nginx's default server does.
#[derive(Debug)]
struct BySni {
    certs: Vec<Named>,
}

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let i = pick(&self.certs, hello.server_name());
        self.certs.get(i).map(|c| c.key.clone())
    }
}

/// The index of the certificate for `name`: the first with an exact
/// match, else the first with a matching wildcard, else 0.
fn pick(certs: &[Named], name: Option<&str>) -> usize {
    let Some(name) = name.map(str::to_ascii_lowercase) else {
        return 0;
    };
    let name = name.trim_end_matches('.');
    certs
        .iter()
        .position(|c| c.names.iter().any(|n| n == name))
        .or_else(|| {
            certs
                .iter()
                .position(|c| c.names.iter().any(|n| wildcard_matches(n, name)))
        })
        .unwrap_or(0)
}

/// RFC 6125 6.4.3, as browsers apply it: `*.example.com` matches exactly
/// one whole label in front of `example.com` (`www.example.com`, not
/// `example.com` nor `a.b.example.com`).
fn wildcard_matches(pattern: &str, name: &str) -> bool {
    let Some(suffix) = pattern.strip_prefix("*.") else {
        return false;
    };
    match name.split_once('.') {
        Some((label, rest)) => !label.is_empty() && rest == suffix,
        None => false,
    }
}

/// The TLS handshakes of this process's listeners, as the statistics
/// show them (`stats::snapshot::TlsInfo`). Process-wide: they outlive
/// reloads, which replace every listener's configuration.
#[derive(Debug, Default)]
pub struct Counters {
    done: AtomicU64,
    protocol: AtomicU64,
    certificate: AtomicU64,
    timeout: AtomicU64,
    other: AtomicU64,
}

static COUNTERS: Counters = Counters {
    done: AtomicU64::new(0),
    protocol: AtomicU64::new(0),
    certificate: AtomicU64::new(0),
    timeout: AtomicU64::new(0),
    other: AtomicU64::new(0),
};

/// This process's handshake counters.
pub fn counters() -> &'static Counters {
    &COUNTERS
}

impl Counters {
    /// Counts a completed handshake.
    pub fn handshake_done(&self) {
        self.done.fetch_add(1, Relaxed);
    }

    /// Counts a failed handshake by its reason.
    pub fn handshake_failed(&self, why: crate::http1::tls::HandshakeFailure) {
        use crate::http1::tls::HandshakeFailure as F;
        let c = match why {
            F::Protocol => &self.protocol,
            F::Certificate => &self.certificate,
            F::Timeout => &self.timeout,
            F::Other => &self.other,
        };
        c.fetch_add(1, Relaxed);
    }

    /// Completed, and failed by reason: protocol, certificate, timeout, other.
    pub fn read(&self) -> (u64, [u64; 4]) {
        (
            self.done.load(Relaxed),
            [
                self.protocol.load(Relaxed),
                self.certificate.load(Relaxed),
                self.timeout.load(Relaxed),
                self.other.load(Relaxed),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_suite_is_offered_aes_128_first_then_chacha20_then_aes_256() {
        let names = |p: &CryptoProvider| p.cipher_suites.iter().map(|s| s.suite()).collect::<Vec<_>>();
        let ours = names(&provider());
        let mut theirs = names(&rustls::crypto::aws_lc_rs::default_provider());
        assert_eq!(ours.len(), theirs.len());
        for s in &ours {
            assert!(theirs.contains(s), "{s:?} is not one of rustls's defaults");
        }
        theirs.sort_by_key(|s| format!("{s:?}"));
        let mut sorted = ours.clone();
        sorted.sort_by_key(|s| format!("{s:?}"));
        assert_eq!(sorted, theirs, "the same suites, reordered only");
        use rustls::CipherSuite as C;
        let at = |s: C| ours.iter().position(|x| *x == s).expect("offered");
        assert!(at(C::TLS13_AES_128_GCM_SHA256) < at(C::TLS13_CHACHA20_POLY1305_SHA256));
        assert!(at(C::TLS13_CHACHA20_POLY1305_SHA256) < at(C::TLS13_AES_256_GCM_SHA384));
        assert!(at(C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256) < at(C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256));
        assert!(at(C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256) < at(C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384));
        assert!(at(C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256) < at(C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384));
    }

    fn named(names: &[&str]) -> Named {
        // The key is never used by `pick`: any parsed certificate will do.
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["x.test".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let der = PrivateKeyDer::try_from(key.serialize_der()).expect("key der");
        let provider = rustls::crypto::ring::default_provider();
        let key = CertifiedKey::from_der(vec![cert.der().clone()], der, &provider).expect("certified");
        Named {
            names: names.iter().map(|n| n.to_string()).collect(),
            key: Arc::new(key),
        }
    }

    #[test]
    fn a_client_without_sni_or_with_an_unknown_name_gets_the_first_certificate() {
        let certs = [named(&["a.test"]), named(&["b.test"])];
        assert_eq!(pick(&certs, None), 0);
        assert_eq!(pick(&certs, Some("c.test")), 0);
        assert_eq!(pick(&certs, Some("b.test")), 1);
        assert_eq!(pick(&certs, Some("B.Test.")), 1);
    }

    #[test]
    fn an_exact_name_wins_over_an_earlier_wildcard() {
        let certs = [named(&["*.example.com"]), named(&["www.example.com"])];
        assert_eq!(pick(&certs, Some("www.example.com")), 1);
        assert_eq!(pick(&certs, Some("img.example.com")), 0);
    }

    #[test]
    fn a_wildcard_matches_exactly_one_label() {
        assert!(wildcard_matches("*.example.com", "www.example.com"));
        assert!(!wildcard_matches("*.example.com", "example.com"));
        assert!(!wildcard_matches("*.example.com", "a.b.example.com"));
        assert!(!wildcard_matches("*.example.com", ".example.com"));
        assert!(!wildcard_matches("www.example.com", "www.example.com"));
    }

    #[test]
    fn a_certificate_is_refused_outside_its_validity_period() {
        let v = Validity {
            not_before: 1_000,
            not_after: 2_000,
        };
        assert!(check_validity(v, 1_500).is_ok());
        assert!(check_validity(v, 1_000).is_ok());
        let e = check_validity(v, 2_001).expect_err("expired");
        assert!(e.contains("expired on 1970-01-01 00:33:20 UTC"), "{e}");
        let e = check_validity(v, 999).expect_err("not yet valid");
        assert!(e.contains("not valid before 1970-01-01 00:16:40 UTC"), "{e}");
    }
}
