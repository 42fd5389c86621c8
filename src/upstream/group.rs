//! Server groups (origin servers, or parent proxies with `parent = true`):
//! round-robin over the servers that are up; a server whose connect failed
//! is skipped for `down_time` (passive health check).

use crate::config::{HostHeader, UpstreamConfig};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One origin server of a group: scheme and authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddr {
    /// `http` or `https`.
    pub scheme: http::uri::Scheme,
    /// `host:port`.
    pub authority: http::uri::Authority,
}

impl ServerAddr {
    /// Parses `host:port`, `http://host[:port]` or `https://host[:port]`.
    pub fn parse(text: &str) -> Result<ServerAddr, String> {
        let with_scheme = if text.contains("://") {
            text.to_string()
        } else {
            format!("http://{text}")
        };
        let uri: http::Uri = with_scheme
            .parse()
            .map_err(|e| format!("invalid server {text:?}: {e}"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| format!("invalid server {text:?}"))?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(format!("invalid server {text:?}: scheme must be http or https"));
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(format!("invalid server {text:?}: no path allowed, only host and port"));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("invalid server {text:?}: no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!("invalid server {text:?}: user info is not allowed"));
        }
        Ok(ServerAddr { scheme, authority })
    }

    /// The absolute URI for `path_and_query` on this server.
    pub fn uri(&self, path_and_query: &str) -> Result<http::Uri, http::Error> {
        // From its parts, not through `Uri::builder`: the builder carries
        // its parts in a `Result` through every step (about 300
        // instructions of moves for every request sent to a group).
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path_and_query.parse()?);
        Ok(http::Uri::from_parts(parts)?)
    }
}

struct Server {
    addr: ServerAddr,
    /// `host:port` as a `Host` field value, made once rather than per request.
    host: http::HeaderValue,
    /// `scheme://host:port`: how the server's own absolute URLs (in
    /// `Location`) start.
    prefix: std::sync::Arc<str>,
    /// Milliseconds since the group's epoch until which the server is skipped.
    down_until: AtomicU64,
}

/// A named group of origin servers.
pub struct Group {
    /// The group's name.
    pub name: String,
    servers: Vec<Server>,
    next: AtomicUsize,
    epoch: Instant,
    down_time: Duration,
    /// How the Host header is set.
    pub host_header: HostHeader,
    /// Whether idempotent requests are retried on another server.
    pub retry: bool,
    /// The servers are parent proxies (`parent = true`), not origins.
    pub parent: bool,
    /// `Proxy-Authorization` for the parents (`credentials_file`), read
    /// when the group is built (start-up and every reload).
    pub credentials: Option<http::HeaderValue>,
    /// Connections in use at once to each server, for this group's
    /// requests (`max_connections`); None: `origin.max_connections`.
    pub max_connections: Option<usize>,
}

impl Group {
    /// Builds a group from its (already validated) config.
    pub fn new(cfg: &UpstreamConfig) -> Result<Group, String> {
        let servers = cfg
            .servers
            .iter()
            .map(|s| {
                let addr = ServerAddr::parse(s)?;
                let host = http::HeaderValue::from_str(addr.authority.as_str())
                    .map_err(|_| format!("invalid server {s:?}: not a valid Host value"))?;
                Ok::<_, String>(Server {
                    host,
                    prefix: format!("{}://{}", addr.scheme, addr.authority).into(),
                    addr,
                    down_until: AtomicU64::new(0),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let credentials = match &cfg.credentials_file {
            Some(path) => Some(super::credentials::read(path).map_err(|e| format!("upstream `{}`: {e}", cfg.name))?),
            None => None,
        };
        Ok(Group {
            credentials,
            name: cfg.name.clone(),
            servers,
            next: AtomicUsize::new(0),
            epoch: Instant::now(),
            down_time: cfg.down_time.get(),
            host_header: cfg.host_header,
            retry: cfg.retry,
            parent: cfg.parent,
            max_connections: cfg.max_connections,
        })
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The next server in turn that is up and not `exclude`; if every
    /// server is down, the next in turn anyway (better a try than a refusal).
    pub fn pick(&self, exclude: Option<usize>) -> usize {
        let n = self.servers.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        let mut fallback = None;
        for k in 0..n {
            let i = start.wrapping_add(k) % n;
            if Some(i) == exclude && n > 1 {
                continue;
            }
            if self.servers[i].down_until.load(Ordering::Relaxed) <= now {
                // The servers skipped over gave their turn to this one: move
                // the rotation past it too, or the server after a down one
                // would get the down one's share as well as its own.
                if k > 0 {
                    self.next.fetch_add(k, Ordering::Relaxed);
                }
                return i;
            }
            fallback.get_or_insert(i);
        }
        fallback.unwrap_or(start % n)
    }

    /// The address of server `i`.
    pub fn server(&self, i: usize) -> &ServerAddr {
        &self.servers[i].addr
    }

    /// Server `i`'s `host:port` as a `Host` field value.
    pub fn host_value(&self, i: usize) -> &http::HeaderValue {
        &self.servers[i].host
    }

    /// `scheme://host:port` of server `i`.
    pub fn prefix(&self, i: usize) -> &std::sync::Arc<str> {
        &self.servers[i].prefix
    }

    /// Whether server `i` is being skipped (marked down, `down_time` not over).
    pub fn is_down(&self, i: usize) -> bool {
        self.servers[i].down_until.load(Ordering::Relaxed) > self.now_ms()
    }

    /// Marks server `i` up again at once (a health probe reached it).
    pub fn mark_up(&self, i: usize) {
        self.servers[i].down_until.store(0, Ordering::Relaxed);
    }

    /// Marks server `i` down for the group's `down_time`.
    pub fn mark_down(&self, i: usize) {
        let until = self.now_ms() + u64::try_from(self.down_time.as_millis()).unwrap_or(u64::MAX / 2);
        self.servers[i].down_until.store(until, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dur;

    fn group(n: usize) -> Group {
        Group::new(&UpstreamConfig {
            name: "g".into(),
            servers: (0..n).map(|i| format!("127.0.0.1:{}", 9000 + i)).collect(),
            host_header: HostHeader::Preserve,
            down_time: Dur::secs(60),
            retry: true,
            parent: false,
            credentials_file: None,
            max_connections: None,
        })
        .unwrap()
    }

    #[test]
    fn round_robin_skips_down_servers() {
        let g = group(3);
        let picks: Vec<usize> = (0..6).map(|_| g.pick(None)).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        g.mark_down(1);
        let picks: Vec<usize> = (0..4).map(|_| g.pick(None)).collect();
        assert!(!picks.contains(&1), "{picks:?}");
        assert_ne!(g.pick(Some(0)), 0);
    }

    #[test]
    fn up_servers_share_evenly_around_a_down_one() {
        let g = group(3);
        g.mark_down(0);
        let picks: Vec<usize> = (0..6).map(|_| g.pick(None)).collect();
        assert_eq!(picks, vec![1, 2, 1, 2, 1, 2]);
        g.mark_down(2);
        g.mark_down(1);
        // All down: still rotates.
        let picks: Vec<usize> = (0..3).map(|_| g.pick(None)).collect();
        let mut sorted = picks.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2], "{picks:?}");
    }

    #[test]
    fn all_down_still_picks_one() {
        let g = group(2);
        g.mark_down(0);
        g.mark_down(1);
        assert!(g.pick(None) < 2);
    }

    #[test]
    fn server_addresses() {
        assert_eq!(
            ServerAddr::parse("h:81").unwrap().uri("/x?y").unwrap().to_string(),
            "http://h:81/x?y"
        );
        assert_eq!(ServerAddr::parse("https://h").unwrap().scheme, http::uri::Scheme::HTTPS);
        assert!(ServerAddr::parse("ftp://h").is_err());
        assert!(ServerAddr::parse("http://h/path").is_err());
        assert!(ServerAddr::parse("u@h:1").is_err());
    }
}
