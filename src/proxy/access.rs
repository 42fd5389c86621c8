//! Who may use the proxy: client address allow-lists (CIDR, IPv4 and IPv6).

use ipnet::IpNet;
use std::net::IpAddr;

/// A list of networks; an address is allowed if any network contains it.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    nets: Vec<IpNet>,
}

impl AllowList {
    /// Builds the list from the config's networks.
    pub fn new(nets: &[IpNet]) -> AllowList {
        AllowList { nets: nets.to_vec() }
    }

    /// True if `ip` is inside one of the networks. IPv4-mapped IPv6
    /// addresses (`::ffff:a.b.c.d`, seen on dual-stack listeners) are
    /// checked as the IPv4 address they carry.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        self.nets.iter().any(|n| n.contains(&ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_v4_and_v6() {
        let list = AllowList::new(&[
            "127.0.0.0/8".parse().unwrap(),
            "::1/128".parse().unwrap(),
            "192.168.1.0/24".parse().unwrap(),
        ]);
        assert!(list.allows("127.0.0.2".parse().unwrap()));
        assert!(list.allows("192.168.1.77".parse().unwrap()));
        assert!(!list.allows("192.168.2.1".parse().unwrap()));
        assert!(list.allows("::1".parse().unwrap()));
        assert!(list.allows("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!list.allows("::2".parse().unwrap()));
        assert!(!AllowList::default().allows("127.0.0.1".parse().unwrap()));
    }
}
