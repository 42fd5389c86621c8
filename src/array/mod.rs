//! Proxy arrays: `[array]` lists the members among which CARP (the Cache
//! Array Routing Protocol, draft-vinod-carp-v1-03) divides the URL space,
//! and Portico serves a PAC file that sends each browser request straight
//! to the member owning its URL (as the Sun Java System Web Proxy Server
//! 4's arrays do). `carp` is the protocol's arithmetic, `pac` the
//! generated script; this module checks the configuration, builds both
//! from it, and answers `portico array owner`.
//!
//! `route` is the routing between members at run time: a member forwards a
//! GET or HEAD it does not own to the owner (one hop), watches the others'
//! health, and moves a down member's share to the next by score;
//! `proxy::purge` passes a PURGE on to every member.

pub mod carp;
pub mod pac;
pub mod route;

use crate::config::{ArrayConfig, Config, MemberConfig, Mode};
use crate::rules::PathSeg::{self, Index, Key};
use std::net::SocketAddr;

/// A configuration error: the key path and what is wrong.
pub type Invalid = (Vec<PathSeg>, String);

/// Checks `[array]`: the members, `self`, and the PAC keys.
pub fn validate(c: &Config) -> Result<(), Invalid> {
    let Some(a) = &c.array else {
        return Ok(());
    };
    let p = &a.pac_path;
    if !p.is_empty() && (!p.starts_with('/') || p.contains('?') || p.contains(char::is_whitespace)) {
        return Err((
            vec![Key("array"), Key("pac_path")],
            format!("{p:?} must be a path starting with '/' (or \"\" to serve no PAC file)"),
        ));
    }
    let m = &c.monitor;
    for (key, q) in [
        ("perf", &m.perf),
        ("stats_xml", &m.stats_xml),
        ("metrics", &m.metrics),
        ("nsc", &m.nsc),
        ("dashboard", &m.dashboard),
        ("json", &m.json),
    ] {
        if !p.is_empty() && p == q {
            return Err((
                vec![Key("array"), Key("pac_path")],
                format!("{p:?} is also monitor.{key}"),
            ));
        }
    }
    for (i, d) in a.pac_direct.iter().enumerate() {
        pac::Direct::parse(d).map_err(|e| (vec![Key("array"), Key("pac_direct"), Index(i)], e))?;
    }
    let Some(members) = &a.members else {
        if !a.self_.is_empty() {
            return Err((
                vec![Key("array"), Key("self")],
                "`self` names this node's member, but the array has no `members`".into(),
            ));
        }
        if !p.is_empty() && !c.listener.iter().any(|l| l.mode == Mode::Forward) {
            return Err((
                vec![Key("array"), Key("pac_path")],
                "without `members` the PAC file names this proxy's forward listener, and there is none: \
                 add a [[listener]] with mode = \"forward\""
                    .into(),
            ));
        }
        return Ok(());
    };
    if members.is_empty() {
        return Err((
            vec![Key("array"), Key("members")],
            "an array needs at least one member (leave `members` out for a PAC file naming this proxy alone)".into(),
        ));
    }
    for (i, member) in members.iter().enumerate() {
        let at = |key| vec![Key("array"), Key("members"), Index(i), Key(key)];
        check_address(&member.address).map_err(|e| (at("address"), e))?;
        if !(member.load_factor.is_finite() && member.load_factor > 0.0) {
            return Err((
                at("load_factor"),
                format!("load factor {}: must be a positive number", member.load_factor),
            ));
        }
        if member.name.as_deref() == Some("") {
            return Err((
                at("name"),
                "a member's name cannot be empty (leave it out to use the address)".into(),
            ));
        }
        if let Some(j) = members[..i].iter().position(|o| o.address == member.address) {
            return Err((
                at("address"),
                format!("member {} is listed twice (also members[{j}])", member.address),
            ));
        }
        if let Some(j) = members[..i].iter().position(|o| o.carp_name() == member.carp_name()) {
            return Err((
                at(if member.name.is_some() { "name" } else { "address" }),
                format!(
                    "two members have the name {:?} (also members[{j}]): CARP tells members apart by name",
                    member.carp_name()
                ),
            ));
        }
    }
    if a.self_.is_empty() {
        return Err((
            vec![Key("array"), Key("members")],
            "set `self` to this node's member (its name or address)".into(),
        ));
    }
    match self_index(a) {
        Some(_) => Ok(()),
        None => Err((
            vec![Key("array"), Key("self")],
            format!("{:?} is not the name or address of any member", a.self_),
        )),
    }
}

/// The member `self` names, by position.
pub fn self_index(a: &ArrayConfig) -> Option<usize> {
    a.members
        .as_ref()?
        .iter()
        .position(|m| m.name.as_deref() == Some(a.self_.as_str()) || m.address == a.self_)
}

/// `host:port`: an IPv4 address, a bracketed IPv6 address or a DNS name,
/// and a port from 1 to 65535. Anything else could not be a PAC file's
/// `PROXY host:port`.
fn check_address(address: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "{address:?}: {why}; write host:port (\"proxy1.example.com:8080\", \"192.0.2.1:8080\", \"[2001:db8::1]:8080\")"
        ))
    };
    let Some((host, port)) = address.rsplit_once(':') else {
        return bad("no port");
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return bad("the port must be a number from 1 to 65535"),
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return match v6.parse::<std::net::Ipv6Addr>() {
            Ok(_) => Ok(()),
            Err(_) => bad("not an IPv6 address between the brackets"),
        };
    }
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if name_ok {
        Ok(())
    } else {
        bad("not a host name or address")
    }
}

/// The members as the PAC file and `portico array owner` name them.
pub fn pac_members(members: &[MemberConfig]) -> Vec<pac::PacMember> {
    members
        .iter()
        .map(|m| pac::PacMember {
            name: m.carp_name().to_string(),
            address: m.address.clone(),
            load_factor: m.load_factor,
        })
        .collect()
}

/// The PAC file for a request that reached the listener at `local` (of
/// mode `mode`), when `[array]` asks for one. Without members it names
/// this proxy: the address the request came to when that is a forward
/// listener, else the first forward listener (its port on the address the
/// request came to, when it listens on every address).
pub fn pac_file(c: &Config, local: SocketAddr, mode: Mode) -> Option<String> {
    let a = c.array.as_ref()?;
    let direct: Vec<pac::Direct> = a.pac_direct.iter().filter_map(|d| pac::Direct::parse(d).ok()).collect();
    if let Some(members) = &a.members {
        return Some(pac::array_pac(&pac_members(members), &direct, a.pac_fallback_direct));
    }
    let proxy = if mode == Mode::Forward {
        local
    } else {
        let forward = c.listener.iter().find(|l| l.mode == Mode::Forward)?.address;
        if forward.ip().is_unspecified() {
            SocketAddr::new(local.ip(), forward.port())
        } else {
            forward
        }
    };
    Some(pac::single_pac(&proxy.to_string(), &direct, a.pac_fallback_direct))
}

/// `portico array owner`: for each URL, its owner and the fall-back order
/// (`pac`: the PAC file's answer for it instead, one line each).
pub fn owner_report(c: &Config, urls: &[String], pac_answer: bool) -> Result<String, String> {
    let Some((a, members)) = c.array.as_ref().and_then(|a| Some((a, a.members.as_ref()?))) else {
        return Err("the config has no [array] members".into());
    };
    let listed = pac_members(members);
    let named: Vec<(&str, f64)> = listed.iter().map(|m| (m.name.as_str(), m.load_factor)).collect();
    let array = carp::Array::new(&named);
    let me = self_index(a);
    let show = |i: usize| {
        let m = &listed[i];
        let mut s = if m.name == m.address {
            m.address.clone()
        } else {
            format!("{:?} ({})", m.name, m.address)
        };
        if Some(i) == me {
            s.push_str(" [self]");
        }
        s
    };
    let mut out = String::new();
    for url in urls {
        let order = array.order(url);
        if pac_answer {
            out.push_str(&pac::answer(&listed, &order, a.pac_fallback_direct));
        } else {
            let rest: Vec<String> = order[1..].iter().map(|&i| show(i)).collect();
            out.push_str(&format!("{url}: owner {}", show(order[0])));
            if !rest.is_empty() {
                out.push_str(&format!("; fall-back {}", rest.join(", ")));
            }
        }
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::config::parse_str;

    fn err(text: &str) -> crate::config::ConfigError {
        parse_str(text, "a.toml").expect_err("an error")
    }

    const THREE: &str = "[array]\nself = \"b\"\nmembers = [\n  { address = \"127.0.0.11:8080\", name = \"a\" },\n  { address = \"127.0.0.12:8080\", name = \"b\", load_factor = 2 },\n  { address = \"127.0.0.13:8080\", load_factor = 0.5 },\n]\n";

    #[test]
    fn an_array_reads_members_load_factors_and_self() {
        let c = parse_str(THREE, "a.toml").expect("valid");
        let a = c.array.as_ref().expect("array");
        let m = a.members.as_ref().expect("members");
        assert_eq!([m[0].load_factor, m[1].load_factor, m[2].load_factor], [1.0, 2.0, 0.5]);
        assert_eq!(m[2].carp_name(), "127.0.0.13:8080");
        assert_eq!(super::self_index(a), Some(1));
        assert_eq!(a.pac_path, "/proxy.pac");
        // The routing defaults docs/CONFIG.md names.
        assert!(a.forward);
        assert_eq!(a.down_time.get(), std::time::Duration::from_secs(30));
        assert_eq!(a.probe_interval.get(), std::time::Duration::from_secs(2));
        let again = parse_str(&c.to_toml(), "printed").expect("printed config parses");
        assert_eq!(again.to_toml(), c.to_toml());
    }

    #[test]
    fn errors_name_the_line_and_key() {
        // `self` may name a member by address; IPv6 addresses are bracketed.
        let c = parse_str(
            &THREE
                .replace("self = \"b\"", "self = \"127.0.0.13:8080\"")
                .replace("127.0.0.11:8080", "[::1]:8080"),
            "a.toml",
        )
        .expect("valid");
        assert_eq!(c.array.as_ref().and_then(super::self_index), Some(2));
        let e = err("[array]\nself = \"x\"\nmembers = []\n");
        assert_eq!((e.line, e.key.as_deref()), (Some(3), Some("array.members")), "{e}");
        let e = err(&THREE.replace("load_factor = 0.5", "load_factor = 0"));
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(6), Some("array.members[2].load_factor")),
            "{e}"
        );
        assert!(e.message.contains("positive"), "{e}");
        let e = err(&THREE.replace("load_factor = 2", "load_factor = -1"));
        assert_eq!(e.key.as_deref(), Some("array.members[1].load_factor"), "{e}");
        let e = err(&THREE.replace("127.0.0.13:8080", "127.0.0.11:8080"));
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(6), Some("array.members[2].address")),
            "{e}"
        );
        assert!(e.message.contains("twice"), "{e}");
        let e = err(&THREE.replace("name = \"b\"", "name = \"a\""));
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(5), Some("array.members[1].name")),
            "{e}"
        );
        let e = err(&THREE.replace("self = \"b\"", "self = \"z\""));
        assert_eq!((e.line, e.key.as_deref()), (Some(2), Some("array.self")), "{e}");
        assert!(e.message.contains("not the name or address of any member"), "{e}");
        let e = err(&THREE.replace("127.0.0.12:8080", "127.0.0.12"));
        assert_eq!(e.key.as_deref(), Some("array.members[1].address"), "{e}");
        let e = err(&THREE.replace("127.0.0.12:8080", "a\\\"b:80"));
        assert_eq!(e.key.as_deref(), Some("array.members[1].address"), "{e}");
        let e = err(&THREE.replace("load_factor = 2", "load_factor = \"two\""));
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(5), Some("array.members[1].load_factor")),
            "{e}"
        );
        let e = err("[array]\npac_direct = [\"10.0.0.0/8\", \"fe80::/10\"]\n");
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(2), Some("array.pac_direct[1]")),
            "{e}"
        );
        let e = err("[array]\npac_path = \"/metrics\"\n");
        assert_eq!(e.key.as_deref(), Some("array.pac_path"), "{e}");
        let e = err("[array]\nself = \"a\"\n");
        assert_eq!(e.key.as_deref(), Some("array.self"), "{e}");
        let e = err(&format!(
            "{}\n[[listener]]\naddress = \"127.0.0.1:1\"\nmode = \"transparent\"\n",
            "[array]"
        ));
        assert_eq!(e.key.as_deref(), Some("array.pac_path"), "{e}");
    }

    #[test]
    fn owner_report_names_the_owner_then_the_fall_back_order() {
        let c = parse_str(THREE, "a.toml").expect("valid");
        let out = super::owner_report(&c, &["http://example.com/".into()], false).expect("report");
        assert!(out.starts_with("http://example.com/: owner "), "{out}");
        assert_eq!(out.matches("127.0.0.1").count(), 3, "{out}");
        assert_eq!(out.matches("[self]").count(), 1, "{out}");
        let pac = super::owner_report(&c, &["http://example.com/".into()], true).expect("report");
        assert_eq!(pac.matches("PROXY ").count(), 3, "{pac}");
        assert!(!pac.contains("DIRECT"), "{pac}");
    }
}
