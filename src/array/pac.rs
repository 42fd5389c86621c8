//! The proxy auto-configuration (PAC) file: a JavaScript
//! `FindProxyForURL(url, host)` that browsers run for every request
//! (Netscape's format, which every browser and the Sun Java System Web
//! Proxy Server 4's generated PAC files use). For an array, the script
//! computes the CARP owner of each URL itself, as the Sun proxy's PAC files
//! do, so that a browser goes straight to the member that caches it: the
//! member hashes and the draft's arithmetic run in the browser, the load
//! factor multipliers are computed here and written in as numbers (so
//! the browser's `Math.pow` cannot round them differently), and the answer
//! is `PROXY owner; PROXY next; ...`, then `DIRECT` when configured.
//!
//! Everything from the configuration is written into the script as a
//! JavaScript string literal by [`js_string`], which escapes every
//! character that could end the string, the line or an HTML `<script>`.

use super::carp;
use ipnet::Ipv4Net;

/// The PAC file's media type.
pub const CONTENT_TYPE: &str = "application/x-ns-proxy-autoconfig";

/// One entry of `[array] pac_direct`: hosts the PAC file sends DIRECT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Direct {
    /// `<local>`: host names without a dot (`isPlainHostName`).
    Local,
    /// An IPv4 network: the host's address (a literal, or `dnsResolve`'s
    /// answer) is in it (`isInNet`).
    Net(Ipv4Net),
    /// `example.com`: that host only.
    Host(String),
    /// `.example.com`: that domain and every host in it (`dnsDomainIs`).
    Domain(String),
    /// A shell pattern such as `*.corp` or `10.1.*` (`shExpMatch`).
    Pattern(String),
}

impl Direct {
    /// Reads one `pac_direct` entry.
    pub fn parse(text: &str) -> Result<Direct, String> {
        let t = text.trim();
        if t == "<local>" {
            return Ok(Direct::Local);
        }
        if let Ok(net) = t
            .parse::<ipnet::IpNet>()
            .or_else(|_| t.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        {
            return match net {
                ipnet::IpNet::V4(n) => Ok(Direct::Net(n.trunc())),
                ipnet::IpNet::V6(_) => Err(format!(
                    "{text:?}: a PAC file can test only IPv4 networks (isInNet); name the hosts instead"
                )),
            };
        }
        let lower = t.to_ascii_lowercase();
        let ok = !lower.is_empty()
            && lower
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.*?".contains(&b));
        if !ok {
            return Err(format!(
                "{text:?}: write a network (\"10.0.0.0/8\"), a host (\"intranet.example\"), a domain \
                 (\".example.com\"), a pattern (\"*.corp\") or \"<local>\""
            ));
        }
        if lower.contains(['*', '?']) {
            Ok(Direct::Pattern(lower))
        } else if let Some(domain) = lower.strip_prefix('.') {
            if domain.is_empty() {
                return Err(format!("{text:?}: a domain needs a name after the dot"));
            }
            Ok(Direct::Domain(lower))
        } else {
            Ok(Direct::Host(lower))
        }
    }

    /// The JavaScript condition that holds for a host this entry matches
    /// (`host` lower-cased, `ip` its IPv4 address or "").
    fn condition(&self) -> String {
        match self {
            Direct::Local => "isPlainHostName(host)".to_string(),
            Direct::Net(n) => format!("ip !== \"\" && isInNet(ip, \"{}\", \"{}\")", n.network(), n.netmask()),
            Direct::Host(h) => format!("host === {}", js_string(h)),
            Direct::Domain(d) => format!(
                "host === {} || dnsDomainIs(host, {})",
                js_string(d.trim_start_matches('.')),
                js_string(d)
            ),
            Direct::Pattern(p) => format!("shExpMatch(host, {})", js_string(p)),
        }
    }
}

/// A member of the array as the PAC file names it.
#[derive(Debug, Clone, PartialEq)]
pub struct PacMember {
    /// The name CARP hashes.
    pub name: String,
    /// `host:port` of its forward listener.
    pub address: String,
    /// Its load factor.
    pub load_factor: f64,
}

/// `s` as a JavaScript string literal, in double quotes. Only printable
/// ASCII other than `"`, `\`, `<`, `>`, `&` and `'` is written as itself;
/// everything else as `\uXXXX` (UTF-16), so the literal never ends early,
/// never spans a line (U+2028 and U+2029 included) and never closes a
/// `<script>` element it might be pasted into.
pub fn js_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for unit in s.encode_utf16() {
        match unit {
            0x20..=0x7e if !matches!(unit as u8, b'"' | b'\\' | b'<' | b'>' | b'&' | b'\'') => {
                out.push(unit as u8 as char)
            }
            _ => out.push_str(&format!("\\u{unit:04x}")),
        }
    }
    out.push('"');
    out
}

/// The bytes of `s`'s UTF-8 encoding as a JavaScript string literal whose
/// characters are those bytes (`"é"` becomes `"\u00c3\u00a9"`): the script
/// hashes member names by character, and CARP hashes bytes.
fn js_bytes(s: &str) -> String {
    let latin1: String = s.bytes().map(char::from).collect();
    js_string(&latin1)
}

/// A number as a JavaScript literal that reads back as the same f64.
fn js_number(x: f64) -> String {
    // Rust prints the shortest text that reads back exactly; so does JavaScript's parser.
    format!("{x:?}")
}

/// The functions every Portico PAC file has: the DIRECT test, and CARP's
/// 32-bit arithmetic. JavaScript numbers are doubles: `>>> 0` brings a
/// result back to 32 bits unsigned; the multiplication is done in 16-bit
/// halves so that no product exceeds 2^53 (and without `Math.imul`, which
/// older PAC engines lack).
const CARP_JS: &str = r#"function porticoRotl(x, n) {
  return ((x << n) | (x >>> (32 - n))) >>> 0;
}

function porticoMul(a, b) {
  return (((a & 0xffff) * b) + ((((a >>> 16) * b) & 0xffff) << 16)) >>> 0;
}

// The URL hash of draft-vinod-carp-v1-03 section 3.1, over bytes: s holds
// one byte per character.
function porticoHash(s) {
  var h = 0;
  for (var i = 0; i < s.length; i++) {
    h = (h + porticoRotl(h, 19) + s.charCodeAt(i)) >>> 0;
  }
  return h;
}

// The URL's UTF-8 bytes, one per character (browsers pass URLs in ASCII;
// anything else is encoded as Portico hashes it).
function porticoBytes(s) {
  for (var i = 0; i < s.length; i++) {
    if (s.charCodeAt(i) > 0x7f) {
      return unescape(encodeURIComponent(s));
    }
  }
  return s;
}

// The member proxy hash (section 3.1).
function porticoMemberHash(name) {
  var h = porticoHash(name);
  h = (h + porticoMul(h, 0x62531965)) >>> 0;
  return porticoRotl(h, 21);
}

// The combined hash (section 3.2).
function porticoCombined(url, member) {
  var c = (url ^ member) >>> 0;
  c = (c + porticoMul(c, 0x62531965)) >>> 0;
  return porticoRotl(c, 21);
}
"#;

/// The DIRECT test: `porticoDirect(host)`. Names first; then, only if
/// networks are listed and no name matched, the host's address (a
/// literal, else one `dnsResolve`).
fn direct_js(direct: &[Direct]) -> String {
    let mut out = String::from("function porticoDirect(host) {\n  host = String(host).toLowerCase();\n");
    let test =
        |out: &mut String, d: &Direct| out.push_str(&format!("  if ({}) {{\n    return true;\n  }}\n", d.condition()));
    for d in direct.iter().filter(|d| !matches!(d, Direct::Net(_))) {
        test(&mut out, d);
    }
    if direct.iter().any(|d| matches!(d, Direct::Net(_))) {
        out.push_str(
            "  var ip = /^[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+$/.test(host) ? host : dnsResolve(host);\n  if (!ip) {\n    ip = \"\";\n  }\n",
        );
        for d in direct.iter().filter(|d| matches!(d, Direct::Net(_))) {
            test(&mut out, d);
        }
    }
    out.push_str("  return false;\n}\n");
    out
}

/// The PAC file of an array: the browser computes each URL's CARP owner
/// among `members` and answers `PROXY owner; PROXY next; ...` (then
/// `DIRECT` with `fallback_direct`); hosts `direct` matches go DIRECT.
pub fn array_pac(members: &[PacMember], direct: &[Direct], fallback_direct: bool) -> String {
    let named: Vec<(&str, f64)> = members.iter().map(|m| (m.name.as_str(), m.load_factor)).collect();
    let array = carp::Array::new(&named);
    let mut out = String::from(
        "// Proxy auto-configuration generated by Portico for a proxy array.\n\
         // Each URL goes to the member that owns it by CARP, the Cache Array\n\
         // Routing Protocol (draft-vinod-carp-v1-03), then to the others in\n\
         // descending score order.\n\n",
    );
    out.push_str(CARP_JS);
    out.push_str("\n// name: the name CARP hashes (its UTF-8 bytes); multiplier: its load factor multiplier.\nvar porticoMembers = [\n");
    for (m, c) in members.iter().zip(&array.members) {
        out.push_str(&format!(
            "  {{ name: {}, proxy: {}, multiplier: {} }},\n",
            js_bytes(&m.name),
            js_string(&format!("PROXY {}", m.address)),
            js_number(c.multiplier)
        ));
    }
    out.push_str("];\n");
    out.push_str(&format!("var porticoFallbackDirect = {fallback_direct};\n"));
    out.push_str(
        "for (var porticoI = 0; porticoI < porticoMembers.length; porticoI++) {\n  \
         porticoMembers[porticoI].hash = porticoMemberHash(porticoMembers[porticoI].name);\n}\n\n",
    );
    out.push_str(&direct_js(direct));
    out.push_str(
        r#"
function FindProxyForURL(url, host) {
  if (porticoDirect(host)) {
    return "DIRECT";
  }
  var u = porticoHash(porticoBytes(String(url)));
  var scored = [];
  for (var i = 0; i < porticoMembers.length; i++) {
    var m = porticoMembers[i];
    scored.push({ index: i, score: porticoCombined(u, m.hash) * m.multiplier });
  }
  // Highest score first; equal scores: the member listed first.
  scored.sort(function (a, b) {
    return b.score - a.score || a.index - b.index;
  });
  var out = [];
  for (var k = 0; k < scored.length; k++) {
    out.push(porticoMembers[scored[k].index].proxy);
  }
  if (porticoFallbackDirect) {
    out.push("DIRECT");
  }
  return out.join("; ");
}
"#,
    );
    out
}

/// The PAC file of a single proxy at `address` (`host:port`): hosts
/// `direct` matches go DIRECT, everything else to the proxy (then
/// `DIRECT` with `fallback_direct`).
pub fn single_pac(address: &str, direct: &[Direct], fallback_direct: bool) -> String {
    let mut answer = format!("PROXY {address}");
    if fallback_direct {
        answer.push_str("; DIRECT");
    }
    let mut out = String::from("// Proxy auto-configuration generated by Portico.\n\n");
    out.push_str(&direct_js(direct));
    out.push_str(&format!(
        "\nfunction FindProxyForURL(url, host) {{\n  if (porticoDirect(host)) {{\n    return \"DIRECT\";\n  }}\n  return {};\n}}\n",
        js_string(&answer)
    ));
    out
}

/// What the PAC file answers for a URL its DIRECT list does not match:
/// the members' proxies in `order`, then DIRECT when configured.
pub fn answer(members: &[PacMember], order: &[usize], fallback_direct: bool) -> String {
    let mut parts: Vec<String> = order.iter().map(|&i| format!("PROXY {}", members[i].address)).collect();
    if fallback_direct {
        parts.push("DIRECT".to_string());
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_literal_escapes_everything_that_could_end_it() {
        assert_eq!(js_string("plain 1.2:80"), "\"plain 1.2:80\"");
        let hostile = "a\"b\\c'\n</script>\u{2028}\u{0}é😀";
        let lit = js_string(hostile);
        assert_eq!(
            lit,
            "\"a\\u0022b\\u005cc\\u0027\\u000a\\u003c/script\\u003e\\u2028\\u0000\\u00e9\\ud83d\\ude00\""
        );
        assert!(lit[1..lit.len() - 1].bytes().all(|b| b.is_ascii_graphic() || b == b' '));
    }

    #[test]
    fn member_names_are_written_as_their_utf8_bytes() {
        assert_eq!(js_bytes("é"), "\"\\u00c3\\u00a9\"");
    }

    #[test]
    fn pac_direct_reads_networks_hosts_domains_patterns_and_local() {
        assert_eq!(Direct::parse("<local>"), Ok(Direct::Local));
        assert_eq!(
            Direct::parse("10.1.2.3/8"),
            Ok(Direct::Net("10.0.0.0/8".parse().unwrap()))
        );
        assert_eq!(
            Direct::parse("192.0.2.7"),
            Ok(Direct::Net("192.0.2.7/32".parse().unwrap()))
        );
        assert_eq!(
            Direct::parse("Intranet.Example"),
            Ok(Direct::Host("intranet.example".into()))
        );
        assert_eq!(Direct::parse(".example.com"), Ok(Direct::Domain(".example.com".into())));
        assert_eq!(Direct::parse("*.corp"), Ok(Direct::Pattern("*.corp".into())));
        assert!(Direct::parse("::1").unwrap_err().contains("IPv4"));
        assert!(Direct::parse("a\"b").is_err());
        assert!(Direct::parse(".").is_err());
        assert!(Direct::parse("").is_err());
    }

    #[test]
    fn multipliers_are_written_so_they_read_back_exactly() {
        for x in [1.0, 0.843_432_665_301_9, 1.088_866_040_100_1e-3, 2.0f64.sqrt()] {
            assert_eq!(js_number(x).parse::<f64>(), Ok(x));
        }
    }
}
