//! Apache htpasswd and AuthGroupFile files: reading them, and checking a
//! password against the hash formats Apache's `htpasswd` writes.
//!
//! Accepted: bcrypt (`$2y$`, `htpasswd -B`), SHA-256 and SHA-512 crypt
//! (`$5$`, `$6$`, `htpasswd -2` / `-5`), and APR1-MD5 (`$apr1$`, the
//! tool's default `-m`). Refused, with a warning naming the line and user:
//! plain text (`-p`), `{SHA}` (`-s`, one unsalted SHA-1) and crypt(3) DES
//! (`-d`, 8 significant characters): all three fall to an offline attack
//! in seconds, and plain text cannot be told apart from a typo.

use md5::{Digest, Md5};
use std::collections::HashMap;
use std::path::Path;

/// A stored password hash in a format Portico verifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hash {
    /// `$2y$` / `$2a$` / `$2b$`.
    Bcrypt(String),
    /// `$5$` or `$6$`.
    ShaCrypt(String),
    /// `$apr1$salt$hash`.
    Apr1(String),
}

/// The users of an htpasswd file.
#[derive(Debug, Default)]
pub struct Users {
    /// User name to hash.
    pub users: HashMap<String, Hash>,
    /// Lines refused: `file:line: user: why`, for the start-up warnings.
    pub refused: Vec<String>,
}

/// Reads an htpasswd file. `Err` when it cannot be read at all.
pub fn read_users(path: &Path) -> Result<Users, String> {
    let text = std::fs::read(path).map_err(|e| format!("htpasswd file {}: cannot read: {e}", path.display()))?;
    Ok(parse_users(
        &String::from_utf8_lossy(&text),
        &path.display().to_string(),
    ))
}

/// Parses htpasswd text (`user:hash` lines; `#` comments and blank lines
/// skipped); `file` names it in the refusals.
pub fn parse_users(text: &str, file: &str) -> Users {
    let mut out = Users::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let n = i + 1;
        let Some((user, hash)) = line.split_once(':') else {
            out.refused
                .push(format!("{file}:{n}: no ':' between user and hash; line ignored"));
            continue;
        };
        match classify(hash) {
            Ok(h) => {
                if out.users.insert(user.to_string(), h).is_some() {
                    out.refused
                        .push(format!("{file}:{n}: user {user:?} appears twice; the last line wins"));
                }
            }
            Err(why) => out
                .refused
                .push(format!("{file}:{n}: user {user:?}: {why}; this user cannot log in")),
        }
    }
    out
}

fn classify(hash: &str) -> Result<Hash, &'static str> {
    if hash.starts_with("$2y$") || hash.starts_with("$2a$") || hash.starts_with("$2b$") {
        Ok(Hash::Bcrypt(hash.to_string()))
    } else if hash.starts_with("$5$") || hash.starts_with("$6$") {
        Ok(Hash::ShaCrypt(hash.to_string()))
    } else if hash.starts_with("$apr1$") {
        Ok(Hash::Apr1(hash.to_string()))
    } else if hash.starts_with("{SHA}") {
        Err("{SHA} (unsalted SHA-1, htpasswd -s) is refused: recreate it with htpasswd -B")
    } else if hash.len() == 13
        && hash
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'/')
    {
        Err("crypt(3) DES (htpasswd -d) is refused: recreate it with htpasswd -B")
    } else {
        Err("plain-text or unknown password format is refused: recreate it with htpasswd -B")
    }
}

/// True if `password` matches `hash`. CPU-heavy for bcrypt (by design):
/// call it off the async runtime's threads.
pub fn verify(hash: &Hash, password: &str) -> bool {
    match hash {
        Hash::Bcrypt(h) => bcrypt::verify(password, h).unwrap_or(false),
        Hash::ShaCrypt(h) => {
            use sha_crypt::PasswordVerifier;
            sha_crypt::ShaCrypt::default()
                .verify_password(password.as_bytes(), h.as_str())
                .is_ok()
        }
        Hash::Apr1(h) => {
            let Some(rest) = h.strip_prefix("$apr1$") else {
                return false;
            };
            let salt = rest.split('$').next().unwrap_or("");
            constant_time_eq(apr1(password.as_bytes(), salt.as_bytes()).as_bytes(), h.as_bytes())
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Apache's APR1-MD5 (`apr_md5_encode`: the FreeBSD MD5-crypt with the
/// magic `$apr1$`). No maintained crate implements the APR variant, so it
/// is written here on the `md-5` crate, and tested against files the real
/// `htpasswd` wrote (tests/auth.rs) and the known vector below.
fn apr1(pw: &[u8], salt: &[u8]) -> String {
    const MAGIC: &[u8] = b"$apr1$";
    let salt = &salt[..salt.len().min(8)];
    let mut ctx = Md5::new();
    ctx.update(pw);
    ctx.update(MAGIC);
    ctx.update(salt);
    let mut alt = Md5::new();
    alt.update(pw);
    alt.update(salt);
    alt.update(pw);
    let alt: [u8; 16] = alt.finalize().into();
    let mut left = pw.len();
    while left > 0 {
        ctx.update(&alt[..left.min(16)]);
        left = left.saturating_sub(16);
    }
    let mut i = pw.len();
    while i != 0 {
        if i & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&pw[..pw.len().min(1)]);
        }
        i >>= 1;
    }
    let mut fin: [u8; 16] = ctx.finalize().into();
    for round in 0..1000 {
        let mut c = Md5::new();
        if round & 1 == 1 {
            c.update(pw);
        } else {
            c.update(fin);
        }
        if round % 3 != 0 {
            c.update(salt);
        }
        if round % 7 != 0 {
            c.update(pw);
        }
        if round & 1 == 1 {
            c.update(fin);
        } else {
            c.update(pw);
        }
        fin = c.finalize().into();
    }
    const ITOA: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = String::with_capacity(37);
    out.push_str("$apr1$");
    out.push_str(&String::from_utf8_lossy(salt));
    out.push('$');
    let mut to64 = |mut v: u32, n: usize| {
        for _ in 0..n {
            out.push(ITOA[(v & 0x3f) as usize] as char);
            v >>= 6;
        }
    };
    let f = |i: usize| u32::from(fin[i]);
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        to64((f(a) << 16) | (f(b) << 8) | f(c), 4);
    }
    to64(f(11), 2);
    out
}

/// Reads an Apache AuthGroupFile (`group: user1 user2` lines) into each
/// user's groups, in file order.
pub fn read_groups(path: &Path) -> Result<HashMap<String, Vec<String>>, String> {
    let text = std::fs::read(path).map_err(|e| format!("groups file {}: cannot read: {e}", path.display()))?;
    Ok(parse_groups(&String::from_utf8_lossy(&text)))
}

/// Parses AuthGroupFile text.
pub fn parse_groups(text: &str) -> HashMap<String, Vec<String>> {
    let mut by_user: HashMap<String, Vec<String>> = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((group, members)) = line.split_once(':') else {
            continue;
        };
        let group = group.trim();
        for user in members.split_whitespace() {
            let groups = by_user.entry(user.to_string()).or_default();
            if !groups.iter().any(|g| g == group) {
                groups.push(group.to_string());
            }
        }
    }
    by_user
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apr1_matches_apache() {
        // From Apache's documentation / `htpasswd -nbm myName myPassword`
        // with salt "r31....." (a widely published vector).
        let h = Hash::Apr1("$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/".into());
        assert!(verify(&h, "myPassword"));
        assert!(!verify(&h, "myPassword2"));
    }

    #[test]
    fn weak_formats_are_refused_with_line_and_user() {
        let u = parse_users(
            "# c\n\nplain:secret\nsha:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\ndes:rqXexS6ZhobKA\nok:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/\n",
            "f",
        );
        assert_eq!(u.users.len(), 1);
        assert_eq!(u.refused.len(), 3);
        assert!(u.refused[0].starts_with("f:3: user \"plain\""), "{:?}", u.refused);
        assert!(u.refused[1].contains("{SHA}"));
        assert!(u.refused[2].contains("DES"));
    }

    #[test]
    fn groups_are_per_user() {
        let g = parse_groups("admins: alice bob\nstaff:alice\n# x\n");
        assert_eq!(g["alice"], vec!["admins", "staff"]);
        assert_eq!(g["bob"], vec!["admins"]);
    }
}
