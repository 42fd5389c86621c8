//! Routing between the members of a proxy array: which member serves a
//! request (its CARP owner, or the next member up by CARP score when the
//! owner is down), the one-hop marker, and the members' health (passive,
//! on a failed connect, plus a periodic TCP probe that brings a member
//! back).
//!
//! Each other member is a parent proxy of its own one-server group
//! (`crate::upstream::Group`, `parent = true`), so forwarding to it goes
//! through the same client, timeouts, `Via` and passive health as a
//! `[[upstream]]` parent group; the groups follow the configured ones in
//! `Shared`'s group list.

use super::carp;
use crate::config::{Config, HostHeader, UpstreamConfig};
use crate::upstream::Group;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The header a member adds to a request it forwards to the owner
/// (`Portico-Array: <sender's CARP name>`). The owner serves such a request
/// itself and never forwards it again, when it comes from a member's
/// address; from anyone else the header is removed and means nothing.
pub const MARKER: http::HeaderName = http::HeaderName::from_static("portico-array");

/// One member's routing state.
pub struct Member {
    /// The CARP name (`name`, else `address`).
    pub name: String,
    /// Its parent group (one server: the member's address).
    pub group: Arc<Group>,
    /// The member's address when it is an IP literal: requests carrying
    /// the marker are honoured only from these.
    pub ip: Option<IpAddr>,
    /// Requests this node forwarded to the member.
    pub forwarded: AtomicU64,
}

/// The array as one node routes in it.
pub struct Router {
    carp: carp::Array,
    /// In configuration order; this node's own entry included.
    pub members: Vec<Member>,
    /// This node's position in `members`.
    pub self_index: usize,
    /// `[array] forward`.
    pub forward: bool,
    /// Position of member 0's group in `Shared`'s group list.
    pub group_base: usize,
    /// Requests received from other members (marked, from a member's address).
    pub received: AtomicU64,
    /// Requests for URLs this node owns (by CARP with every member up),
    /// served here: from clients or received from members.
    pub owned: AtomicU64,
    /// Requests for URLs another member owns, served here anyway: the
    /// owner was down, or members do not forward (`forward = false`,
    /// members named by DNS). Each may leave a copy that the owner holds
    /// too: the array's duplicates.
    pub not_owned: AtomicU64,
    probe_interval: Duration,
}

/// The address part of `host:port` when it is an IP literal.
fn literal_ip(address: &str) -> Option<IpAddr> {
    let (host, _) = address.rsplit_once(':')?;
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

impl Router {
    /// The router of `c`'s array, when it lists members; its members'
    /// groups are to sit at `group_base` onwards in the group list.
    pub fn new(c: &Config, group_base: usize) -> Result<Option<Router>, String> {
        let Some(a) = &c.array else { return Ok(None) };
        let Some(listed) = &a.members else { return Ok(None) };
        let Some(self_index) = super::self_index(a) else {
            return Ok(None);
        };
        let named: Vec<(&str, f64)> = listed.iter().map(|m| (m.carp_name(), m.load_factor)).collect();
        let members = listed
            .iter()
            .map(|m| {
                let group = Group::new(&UpstreamConfig {
                    name: format!("array:{}", m.carp_name()),
                    servers: vec![m.address.clone()],
                    host_header: HostHeader::Preserve,
                    down_time: a.down_time,
                    retry: false,
                    parent: true,
                    credentials_file: None,
                    max_connections: None,
                })?;
                Ok(Member {
                    name: m.carp_name().to_string(),
                    group: Arc::new(group),
                    ip: literal_ip(&m.address),
                    forwarded: AtomicU64::new(0),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        // The marker is honoured only from a member's IP address, and the
        // forwarded requests are sent from ours: with a member named by
        // DNS, the owner could not tell its requests from a client's (and
        // would answer them 508 when the members share a Via pseudonym).
        let named_by_dns: Vec<&str> = listed
            .iter()
            .zip(&members)
            .filter(|(_, m)| m.ip.is_none())
            .map(|(c, _)| c.address.as_str())
            .collect();
        let forward = a.forward && named_by_dns.is_empty();
        if a.forward && !forward {
            tracing::warn!(
                "[array] members {} are named by host name, not IP address: members do not forward \
                 to each other (only the PAC file routes); list them by IP address",
                named_by_dns.join(", ")
            );
        }
        Ok(Some(Router {
            carp: carp::Array::new(&named),
            members,
            self_index,
            forward,
            group_base,
            received: AtomicU64::new(0),
            owned: AtomicU64::new(0),
            not_owned: AtomicU64::new(0),
            probe_interval: a.probe_interval.get(),
        }))
    }

    /// This node's own address, when an IP literal: what forwarded
    /// requests are sent from, so the owner recognises a member.
    pub fn self_ip(&self) -> Option<IpAddr> {
        self.members[self.self_index].ip.filter(|ip| !ip.is_unspecified())
    }

    /// The addresses of the members other than this node (those given as
    /// IP literals).
    fn other_ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.members
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.self_index)
            .filter_map(|(_, m)| m.ip)
    }

    /// [`Router::other_ips`], collected (for the per-client limits' exemption).
    pub fn member_ips(&self) -> Vec<IpAddr> {
        self.other_ips().collect()
    }

    /// Whether `ip` is the address of a member other than this node.
    pub fn is_member(&self, ip: IpAddr) -> bool {
        self.other_ips().any(|m| m == ip)
    }

    /// The member that serves `url`: the highest CARP score among this node
    /// and the members that are up (a down owner's URLs go to the next by
    /// score, and only those move).
    pub fn serving_member(&self, url: &str) -> usize {
        self.serving_and_owner(url).0
    }

    /// The member that serves `url` (as [`Router::serving_member`]) and
    /// its CARP owner whatever the members' health, from one scoring.
    pub fn serving_and_owner(&self, url: &str) -> (usize, usize) {
        let order = self.carp.order(url);
        let serving = order
            .iter()
            .copied()
            .find(|&i| i == self.self_index || !self.members[i].group.is_down(0))
            .unwrap_or(self.self_index);
        (serving, order.first().copied().unwrap_or(self.self_index))
    }

    /// Whether member `i` is up (this node always is).
    pub fn is_up(&self, i: usize) -> bool {
        i == self.self_index || !self.members[i].group.is_down(0)
    }

    /// Starts the periodic probe of the other members (a TCP connect every
    /// `probe_interval`, which is also its timeout): a member that accepts
    /// is marked up, one that does not is marked down for `down_time`. The
    /// task ends when the router is dropped (a reload builds a new one).
    pub fn start_probe(router: &Arc<Router>) {
        // Health only matters to forwarding (and a member named by DNS,
        // which turns it off, is never looked up by the system's resolver).
        if !router.forward || router.probe_interval.is_zero() || router.members.len() < 2 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak: Weak<Router> = Arc::downgrade(router);
        let interval = router.probe_interval;
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(router) = weak.upgrade() else { return };
                for (i, m) in router.members.iter().enumerate() {
                    if i == router.self_index {
                        continue;
                    }
                    let server = m.group.server(0);
                    let host = server.authority.host().trim_start_matches('[').trim_end_matches(']');
                    let port = server.authority.port_u16().unwrap_or(80);
                    let ok = matches!(
                        tokio::time::timeout(interval, tokio::net::TcpStream::connect((host, port))).await,
                        Ok(Ok(_))
                    );
                    match (ok, m.group.is_down(0)) {
                        (true, true) => {
                            tracing::info!(member = %m.name, "array member is up again (probe)");
                            m.group.mark_up(0);
                        }
                        (false, false) => {
                            tracing::warn!(member = %m.name, "array member is down (probe: no connection)");
                            m.group.mark_down(0);
                        }
                        _ => {}
                    }
                }
            }
        });
    }

    /// Counts a request forwarded to member `i`.
    pub fn count_forwarded(&self, i: usize) {
        self.members[i].forwarded.fetch_add(1, Ordering::Relaxed);
    }
}
