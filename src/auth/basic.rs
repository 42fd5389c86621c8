//! RFC 7617 Basic credentials, read strictly: whatever a client sends in
//! `Proxy-Authorization` or `Authorization` is hostile input until it
//! parses as `Basic <base64(user:password)>` with UTF-8, control-free parts.

use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use http::HeaderValue;

/// Longest credentials field read. Browsers send well under 1 KiB; a
/// longer value is an attack or a mistake, and decoding it is waste.
pub const MAX_CREDENTIALS: usize = 4096;

/// Standard alphabet, padding optional: RFC 7617 says token68, whose
/// padding some clients leave out.
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Credentials presented by a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Basic {
    /// The user-id (no `:`, no control characters).
    pub user: String,
    /// The password (no control characters).
    pub password: String,
}

/// What a credentials field holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presented {
    /// Well-formed Basic credentials.
    Basic(Basic),
    /// Another scheme (Digest, Bearer, NTLM...): Portico does not speak it,
    /// so the client is challenged as if it had sent nothing.
    OtherScheme,
}

/// Parses one credentials field. `Err` names what is malformed (the
/// request is answered 400: no browser sends such a field).
pub fn parse(value: &HeaderValue) -> Result<Presented, &'static str> {
    let bytes = value.as_bytes();
    if bytes.len() > MAX_CREDENTIALS {
        return Err("credentials field too long");
    }
    // auth-scheme SP token68 (RFC 9110 11.4); the scheme is case-insensitive.
    let (scheme, rest) = match bytes.iter().position(|&b| b == b' ') {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (bytes, &b""[..]),
    };
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return Ok(Presented::OtherScheme);
    }
    let token = trim_spaces(rest);
    if token.is_empty() {
        return Err("Basic credentials are empty");
    }
    let decoded = B64
        .decode(token)
        .map_err(|_| "Basic credentials are not valid base64")?;
    let text = String::from_utf8(decoded).map_err(|_| "Basic credentials are not UTF-8 (RFC 7617 2.1)")?;
    let Some((user, password)) = text.split_once(':') else {
        return Err("Basic credentials have no ':' between user and password");
    };
    if user.is_empty() {
        return Err("Basic credentials have an empty user name");
    }
    // RFC 7617 2: neither part may contain control characters; a user-id
    // with one could also forge access-log lines.
    if user.chars().chain(password.chars()).any(char::is_control) {
        return Err("Basic credentials contain control characters");
    }
    Ok(Presented::Basic(Basic {
        user: user.to_string(),
        password: password.to_string(),
    }))
}

fn trim_spaces(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = b {
        b = rest;
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Presented, &'static str> {
        parse(&HeaderValue::from_str(s).expect("test header"))
    }

    fn basic(user: &str, password: &str) -> Presented {
        Presented::Basic(Basic {
            user: user.into(),
            password: password.into(),
        })
    }

    #[test]
    fn reads_rfc7617_example_and_variants() {
        // RFC 7617 2: "Aladdin" / "open sesame".
        assert_eq!(
            p("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
            Ok(basic("Aladdin", "open sesame"))
        );
        assert_eq!(
            p("basic   QWxhZGRpbjpvcGVuIHNlc2FtZQ"),
            Ok(basic("Aladdin", "open sesame"))
        );
        // The password may hold colons; the user may not.
        let v = format!("Basic {}", B64.encode("u:a:b"));
        assert_eq!(p(&v), Ok(basic("u", "a:b")));
        let v = format!("Basic {}", B64.encode("u:"));
        assert_eq!(p(&v), Ok(basic("u", "")));
    }

    #[test]
    fn refuses_hostile_values() {
        assert_eq!(p("Bearer abc"), Ok(Presented::OtherScheme));
        assert_eq!(p("Basicx abc"), Ok(Presented::OtherScheme));
        assert!(p("Basic").is_err());
        assert!(p("Basic !!!").is_err());
        assert!(p(&format!("Basic {}", B64.encode("nocolon"))).is_err());
        assert!(p(&format!("Basic {}", B64.encode(":pw"))).is_err());
        assert!(p(&format!("Basic {}", B64.encode("u\n:pw"))).is_err());
        let non_utf8 = format!("Basic {}", B64.encode([0xff, b':', 0xfe]));
        assert!(p(&non_utf8).is_err());
        let huge = format!("Basic {}", "A".repeat(MAX_CREDENTIALS));
        assert!(p(&huge).is_err());
    }
}
