//! A transparent listener's requests checked against where their client
//! was connecting. Traffic the kernel's NAT redirected to Portico (an
//! `iptables`/`nftables` `REDIRECT` or `DNAT` rule) was on its way to an
//! address of the client's own choosing; routed by its `Host` field alone,
//! a page in a browser behind the proxy could connect to its own server
//! with `Host: intranet.example` and have the proxy fetch that host for it,
//! past the browser's same-origin policy (CVE-2009-0801, the hole Squid's
//! `host_verify_strict` closed), and what it fetched would be stored under
//! that name for everyone.
//!
//! So a request on a redirected connection (`http1::LocalAddr::
//! redirected_from`, over HTTP/1 or HTTP/2) must name the address it was
//! redirected from: its URL's port (the scheme's default when it names
//! none: 80, or 443 for the `https` URLs of a TLS listener) that port; its
//! host that address or a name that resolves to it (with the resolver
//! origins are fetched with). Otherwise it is answered `409 Conflict`, as
//! Squid answers with `host_verify_strict on`. One that does is fetched
//! from that very address (`upstream::Pinned`, Squid's
//! `client_dst_passthru`), never from another the name resolves to when
//! fetched: a name whose DNS answers both the client's server and an
//! intranet address (or the one, then the other) passes the check and
//! must not be fetched from the intranet. A connection made to Portico's
//! own address (no redirection: the client chose the proxy) is not
//! checked, as a forward listener's requests are not.

use std::net::SocketAddr;

/// Why a request for `host` on `port` (its URL's, the scheme's default
/// when it names none) on a connection redirected from `original` does
/// not name it: None when it does. The default port is compared too: an
/// `http://` URL on a TLS connection redirected from port 443 would be
/// fetched in cleartext from port 80. `resolve` gives the addresses of a
/// name (none when it does not resolve).
pub async fn mismatch<F, Fut>(host: &str, port: u16, original: SocketAddr, resolve: F) -> Option<String>
where
    F: FnOnce(String, u16) -> Fut,
    Fut: std::future::Future<Output = Vec<SocketAddr>>,
{
    if port != original.port() {
        return Some(format!(
            "the request is for port {port}, and its redirected connection was to {original}"
        ));
    }
    let wanted = original.ip().to_canonical();
    if let Some(ip) = crate::util::host_ip(host) {
        return (ip.to_canonical() != wanted)
            .then(|| format!("the request names {host}, and its redirected connection was to {original}"));
    }
    let found = resolve(host.to_string(), port).await;
    if found.iter().any(|a| a.ip().to_canonical() == wanted) {
        return None;
    }
    Some(if found.is_empty() {
        format!("the request names {host}, which does not resolve, and its redirected connection was to {original}")
    } else {
        format!(
            "the request names {host}, which does not resolve to {wanted}, the address its redirected connection was to"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn original() -> SocketAddr {
        "192.0.2.7:80".parse().unwrap()
    }

    async fn check(host: &str, port: u16, answers: &[&str]) -> Option<String> {
        let answers: Vec<SocketAddr> = answers.iter().map(|a| a.parse().unwrap()).collect();
        mismatch(host, port, original(), |_, _| async move { answers }).await
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_the_address_connected_to_matches() {
        assert_eq!(
            check("www.example", 80, &["198.51.100.1:80", "192.0.2.7:80"]).await,
            None
        );
    }

    #[tokio::test]
    async fn a_name_that_resolves_elsewhere_does_not() {
        let why = check("intranet.example", 80, &["10.0.0.5:80"])
            .await
            .expect("a mismatch");
        assert!(why.contains("intranet.example") && why.contains("192.0.2.7"), "{why}");
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_does_not() {
        let why = check("nowhere.example", 80, &[]).await.expect("a mismatch");
        assert!(why.contains("does not resolve"), "{why}");
    }

    #[tokio::test]
    async fn another_port_does_not_match_whatever_the_host() {
        assert!(check("www.example", 8080, &["192.0.2.7:8080"]).await.is_some());
    }

    #[tokio::test]
    async fn the_default_port_is_compared_too() {
        // `http://www.example/` on a connection redirected from port 443.
        let from_443: SocketAddr = "192.0.2.7:443".parse().unwrap();
        let why = mismatch("www.example", 80, from_443, |_, _| async { vec![from_443] })
            .await
            .expect("a mismatch");
        assert!(why.contains("port 80") && why.contains("192.0.2.7:443"), "{why}");
        assert_eq!(
            mismatch("www.example", 443, from_443, |_, _| async { vec![from_443] }).await,
            None
        );
    }

    #[tokio::test]
    async fn an_address_is_compared_without_a_lookup() {
        assert_eq!(check("192.0.2.7", 80, &[]).await, None);
        assert!(check("192.0.2.8", 80, &["192.0.2.7:80"]).await.is_some());
        // An IPv4-mapped IPv6 address is the IPv4 address.
        assert_eq!(check("[::ffff:192.0.2.7]", 80, &[]).await, None);
    }
}
