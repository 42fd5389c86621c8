//! The path `[[acl]]` entries and filter lists match: the request's path
//! normalised the way origin servers resolve it, so that a spelling the
//! origin reads as `/admin/x` (`/%61dmin/x`, `//admin/x`, `/./admin/x`,
//! `/x/../admin/x`) cannot pass an entry written for `/admin/`. Servers
//! disagree on `;` and `\`: Tomcat and Jetty drop `;` parameters from each
//! segment (`/x/..;/admin/x` is `/admin/x` to them), IIS reads `\` as `/`,
//! while nginx, Apache and most application routers keep both as plain
//! characters (`/admin/..;/x` stays under `/admin/`). A path holding
//! either has a second reading ([`servlet_reading`]), and the entries
//! decide it under both (`acl::Acl::decide`). Only what the entries see is
//! normalised: the request goes to the origin as the client sent it.

use std::borrow::Cow;

/// `path_and_query` with its path normalised ([`normalize_path`]) and its
/// query as received (a query is data for the application, not a place).
pub fn normalize_path_and_query(path_and_query: &str) -> Cow<'_, str> {
    let (path, query) = match path_and_query.find('?') {
        Some(i) => path_and_query.split_at(i),
        None => (path_and_query, ""),
    };
    match normalize_path(path) {
        Cow::Borrowed(_) => Cow::Borrowed(path_and_query),
        Cow::Owned(mut p) => {
            p.push_str(query);
            Cow::Owned(p)
        }
    }
}

/// An absolute path (`/...`) normalised in three steps:
///
/// 1. percent-encoded unreserved characters (letters, digits, `-`, `.`,
///    `_`, `~`) decoded, the other percent-encodings kept with their hex
///    digits in upper case (RFC 3986 6.2.2.1 and 6.2.2.2): `%2F` stays
///    encoded, as a `/` inside a segment is not a separator;
/// 2. runs of `/` merged into one, as nginx (`merge_slashes`), Apache and
///    most application servers do;
/// 3. dot-segments removed (RFC 3986 5.2.4), the decoded `%2e` ones too.
///
/// Case is kept: paths are case-sensitive (RFC 3986 6.2.2.1). Anything that
/// is not an absolute path is returned as it is. Borrowed when there is
/// nothing to do (the common case costs one scan).
pub fn normalize_path(path: &str) -> Cow<'_, str> {
    if !path.starts_with('/') || !needs_work(path) {
        return Cow::Borrowed(path);
    }
    let decoded = decode_unreserved(path);
    let merged = merge_slashes(&decoded);
    Cow::Owned(remove_dot_segments(&merged))
}

/// Whether `path` has a percent-encoding, a run of slashes or a dot-segment.
fn needs_work(path: &str) -> bool {
    path.contains('%') || path.contains("//") || path.split('/').any(|s| s == "." || s == "..")
}

/// The other reading of `path_and_query`, when its path holds a `;` or a
/// `\`: each `\` read as `/`, as IIS and ASP.NET read it, and each
/// segment's parameters (`;` to the end of the segment) removed, as Java
/// servlet containers (Tomcat, Jetty) remove them before mapping a path,
/// then normalised as [`normalize_path`] does. So `/admin;jsessionid=1/x`
/// and `/x/..;/admin/x` are `/admin/x`; an encoded `%3B` stays data, as
/// Tomcat has it. None for a path with neither (nearly all).
pub fn servlet_reading(path_and_query: &str) -> Option<String> {
    let (path, query) = match path_and_query.find('?') {
        Some(i) => path_and_query.split_at(i),
        None => (path_and_query, ""),
    };
    if !path.starts_with('/') || !path.bytes().any(|b| b == b';' || b == b'\\') {
        return None;
    }
    let mut out = normalize_path(&strip_parameters(path)).into_owned();
    out.push_str(query);
    Some(out)
}

/// `\` as `/`, segment parameters removed.
fn strip_parameters(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_parameters = false;
    for c in path.chars() {
        match c {
            '/' | '\\' => {
                in_parameters = false;
                out.push('/');
            }
            ';' => in_parameters = true,
            _ if in_parameters => {}
            c => out.push(c),
        }
    }
    out
}

/// RFC 3986 2.3's unreserved characters.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Step 1 of [`normalize_path`]. A `%` not followed by two hex digits is
/// left as it is (the origin decides what it means).
fn decode_unreserved(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        // Copied in slices up to the next `%`: the text between is kept
        // byte for byte (non-ASCII included).
        let next = path[i..].find('%').map_or(bytes.len(), |n| i + n);
        out.push_str(&path[i..next]);
        i = next;
        if i >= bytes.len() {
            break;
        }
        let hi = bytes.get(i + 1).copied().and_then(hex_value);
        let lo = bytes.get(i + 2).copied().and_then(hex_value);
        match (hi, lo) {
            (Some(hi), Some(lo)) => {
                let b = hi << 4 | lo;
                if is_unreserved(b) {
                    out.push(char::from(b));
                } else {
                    out.push('%');
                    out.push_str(&path[i + 1..i + 3].to_ascii_uppercase());
                }
                i += 3;
            }
            _ => {
                out.push('%');
                i += 1;
            }
        }
    }
    out
}

/// Step 2 of [`normalize_path`].
fn merge_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut after_slash = false;
    for c in path.chars() {
        if c == '/' && after_slash {
            continue;
        }
        after_slash = c == '/';
        out.push(c);
    }
    out
}

/// Step 3 of [`normalize_path`], for an absolute path: `.` segments are
/// dropped, `..` drops the segment before it (never past the root), and
/// a path ending in either ends in `/` (`/a/b/..` is `/a/`).
fn remove_dot_segments(path: &str) -> String {
    let rest = path.strip_prefix('/').unwrap_or(path);
    let segments: Vec<&str> = rest.split('/').collect();
    let mut kept: Vec<&str> = Vec::with_capacity(segments.len());
    let last = segments.len().saturating_sub(1);
    for (i, segment) in segments.iter().enumerate() {
        match *segment {
            "." => {}
            ".." => {
                kept.pop();
            }
            s => {
                kept.push(s);
                continue;
            }
        }
        if i == last {
            kept.push("");
        }
    }
    let mut out = String::with_capacity(path.len());
    for s in &kept {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{normalize_path, normalize_path_and_query, servlet_reading};

    fn n(path: &str) -> String {
        normalize_path(path).into_owned()
    }

    #[test]
    fn percent_encoded_unreserved_characters_are_decoded() {
        assert_eq!(n("/%61dmin/x"), "/admin/x");
        assert_eq!(n("/%41%5a%30%39%2D%2e%5F%7e"), "/AZ09-._~");
        assert_eq!(n("/%7Euser/"), "/~user/");
    }

    #[test]
    fn reserved_and_other_percent_encodings_stay_encoded_in_upper_case() {
        assert_eq!(n("/a%2fb"), "/a%2Fb");
        assert_eq!(n("/a%2Fb/%3f%23%25%20"), "/a%2Fb/%3F%23%25%20");
        assert_eq!(n("/%c3%a9t%C3%A9"), "/%C3%A9t%C3%A9");
        // Not an encoding: left for the origin to judge.
        assert_eq!(n("/100%/%zz/%4"), "/100%/%zz/%4");
    }

    #[test]
    fn dot_segments_are_removed() {
        assert_eq!(n("/./admin/x"), "/admin/x");
        assert_eq!(n("/x/../admin/x"), "/admin/x");
        assert_eq!(n("/a/b/c/./../../g"), "/a/g");
        assert_eq!(n("/a/b/.."), "/a/");
        assert_eq!(n("/a/b/."), "/a/b/");
        assert_eq!(n("/../../admin"), "/admin");
        assert_eq!(n("/.."), "/");
        assert_eq!(n("/%2e%2E/admin/%2e/x"), "/admin/x");
        // Not dot-segments: names that start with dots.
        assert_eq!(n("/.well-known/..x/...").as_str(), "/.well-known/..x/...");
    }

    #[test]
    fn runs_of_slashes_are_merged() {
        assert_eq!(n("//admin/x"), "/admin/x");
        assert_eq!(n("/a///b//"), "/a/b/");
        // Merged before the dot-segments, as a merging origin resolves it.
        assert_eq!(n("/x//../admin"), "/admin");
    }

    fn s(path: &str) -> Option<String> {
        servlet_reading(path)
    }

    #[test]
    fn the_servlet_reading_removes_segment_parameters_as_tomcat_does() {
        assert_eq!(s("/admin;jsessionid=1/x").as_deref(), Some("/admin/x"));
        assert_eq!(s("/x/..;/admin/x").as_deref(), Some("/admin/x"));
        assert_eq!(s("/x/.;a=b/admin").as_deref(), Some("/x/admin"));
        assert_eq!(s("/admin;?q=;").as_deref(), Some("/admin?q=;"));
        // Encoded, it is data in the segment, as Tomcat reads it.
        assert_eq!(s("/admin%3bx/"), None);
        assert_eq!(s("/plain/path?q=;"), None, "a ; in the query is the query's");
    }

    #[test]
    fn the_servlet_reading_takes_backslashes_as_separators_as_iis_does() {
        assert_eq!(s("/x\\..\\admin\\x").as_deref(), Some("/admin/x"));
        assert_eq!(s("/\\admin/x").as_deref(), Some("/admin/x"));
        assert_eq!(s("\\admin\\x"), None, "not an absolute path");
    }

    #[test]
    fn the_plain_reading_keeps_semicolons_and_backslashes_as_characters() {
        // As nginx and most application routers read them: still under /admin/.
        assert_eq!(n("/admin/..;/public"), "/admin/..;/public");
        assert_eq!(n("/admin/x\\..\\..\\public"), "/admin/x\\..\\..\\public");
        assert_eq!(n("/admin;x/y"), "/admin;x/y");
    }

    #[test]
    fn case_stays_significant() {
        assert_eq!(n("/Admin/x"), "/Admin/x");
        assert_eq!(n("/%41dmin"), "/Admin");
    }

    #[test]
    fn a_normal_path_is_borrowed_and_unchanged() {
        for p in ["/", "/admin/x", "/a.b/c-d_e~f", "/.well-known/x", "*", ""] {
            assert!(matches!(normalize_path(p), std::borrow::Cow::Borrowed(_)), "{p}");
            assert_eq!(n(p), p);
        }
    }

    #[test]
    fn the_query_is_left_as_received() {
        assert_eq!(
            normalize_path_and_query("/%61/../b?x=/../%61&y=//"),
            "/b?x=/../%61&y=//"
        );
        assert_eq!(normalize_path_and_query("/ok?q=%61"), "/ok?q=%61");
    }
}
