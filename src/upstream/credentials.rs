//! Fixed credentials for an authenticating parent proxy (`[[upstream]]`
//! `credentials_file`), Squid's `cache_peer ... login=user:password`: the
//! file holds `user:password` on one line, and every request and CONNECT
//! sent to a server of the group carries `Proxy-Authorization: Basic ...`
//! (RFC 7617) made of it. Kept out of portico.toml so that the config can
//! be world-readable while the secret is not.

use base64::Engine as _;
use http::HeaderValue;
use std::path::Path;

/// The longest credentials file read: a user name and password of a few
/// hundred bytes at most; anything larger is not such a file.
const MAX_FILE: u64 = 4096;

/// Reads `path` and returns the `Proxy-Authorization` value it makes.
/// Blank lines and `#` comment lines are skipped; exactly one
/// `user:password` line must remain (the password may contain `:`; a
/// trailing `\r` is dropped, other blanks are kept as part of it). Errors
/// say what is wrong, never what the password is.
pub fn read(path: &Path) -> Result<HeaderValue, String> {
    use std::io::Read;
    let file = std::fs::File::open(path)
        .map_err(|e| format!("cannot read {}: {}", path.display(), crate::util::io_cause(&e)))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {}: {}", path.display(), crate::util::io_cause(&e)))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {}", path.display(), crate::util::io_cause(&e)))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!(
            "{}: larger than {MAX_FILE} bytes: not a user:password file",
            path.display()
        ));
    }
    parse(&bytes).map_err(|why| format!("{}: {why}", path.display()))
}

/// The header value for the file's contents `bytes`.
pub fn parse(bytes: &[u8]) -> Result<HeaderValue, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())?;
    let mut found = None;
    for (n, line) in text.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if found.is_some() {
            return Err(format!(
                "line {}: a second credentials line (one user:password line only)",
                n + 1
            ));
        }
        found = Some((n + 1, line));
    }
    let (n, line) = found.ok_or_else(|| "no user:password line".to_string())?;
    let (user, password) = line
        .split_once(':')
        .ok_or_else(|| format!("line {n}: write user:password (no ':' found)"))?;
    if user.is_empty() {
        return Err(format!("line {n}: the user name is empty"));
    }
    // RFC 7617 2: the user-id cannot contain ':'; neither part may hold
    // control characters (they would be sent to the parent as typed).
    if line.chars().any(char::is_control) {
        return Err(format!("line {n}: control characters are not allowed"));
    }
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let mut value = HeaderValue::from_str(&format!("Basic {token}")).map_err(|_| format!("line {n}: unusable"))?;
    // Never shown in debug output (HTTP/2 HPACK would also skip indexing it).
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_user_password_line_makes_a_basic_credential() {
        let v = parse(b"# parent\n\nportico:s3cr:et\r\n").unwrap();
        // base64("portico:s3cr:et")
        assert_eq!(v.to_str().unwrap(), "Basic cG9ydGljbzpzM2NyOmV0");
        assert!(v.is_sensitive());
    }

    #[test]
    fn an_empty_file_two_lines_no_colon_or_control_characters_are_refused() {
        assert!(parse(b"").unwrap_err().contains("no user:password"));
        assert!(parse(b"# only a comment\n").is_err());
        assert!(parse(b"a:b\nc:d\n").unwrap_err().contains("line 2: a second"));
        assert!(parse(b"nocolon\n").unwrap_err().contains("no ':'"));
        assert!(parse(b":pw\n").unwrap_err().contains("user name is empty"));
        assert!(parse(b"u:p\x07w\n").unwrap_err().contains("control"));
        assert!(parse(b"u:\xff\n").unwrap_err().contains("UTF-8"));
    }

    #[test]
    fn errors_never_contain_the_password() {
        for bad in [&b"u:hunter2\nv:hunter2\n"[..], b"u:hun\x01ter2\n"] {
            assert!(!parse(bad).unwrap_err().contains("hunter2"));
        }
    }
}
