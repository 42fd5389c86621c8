//! The pages Portico answers its own errors with (a refusal, a failed
//! fetch, a malformed request): the built-in page, or an administrator's
//! from `[error_pages] directory`, as Squid's `error_directory`, nginx's
//! `error_page` and the Sun Java System Web Proxy Server's customised error
//! responses let a site put its own words, branding and help-desk contact
//! on them.
//!
//! The directory holds `NNN.html` for a status (400 to 599) and
//! `default.html` for any other; a status with neither gets the built-in
//! page. A page is a template: `{status}` (`403`), `{reason}` (`Forbidden`)
//! and `{message}` (why Portico refused or failed, HTML-escaped: it can
//! carry what a client sent, a host name or a path) are replaced; any other
//! text, other braces included (CSS, scripts), is sent as written. Pages are
//! read whole when the configuration is loaded (start-up and every reload),
//! never per request.

use bytes::Bytes;
use http::StatusCode;
use std::collections::HashMap;
use std::path::Path;

/// The built-in page, itself a template.
const BUILT_IN: &str = "<!DOCTYPE html>\n<html><head><title>{status} {reason}</title></head>\n<body><h1>{status} {reason}</h1>\n<p>{message}</p>\n<hr><address>portico</address></body></html>\n";

/// The largest page read: a page with inline styles and a logo as a data
/// URL fits; a name pointing at something endless fails the load.
const MAX_PAGE: u64 = 1 << 20;

/// One part of a template.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Status,
    Reason,
    Message,
}

/// A page with its placeholders found once, at load.
#[derive(Debug, Clone, PartialEq)]
struct Template(Vec<Piece>);

impl Template {
    fn parse(text: &str) -> Template {
        let mut pieces = Vec::new();
        let mut rest = text;
        let mut literal = String::new();
        while let Some(open) = rest.find('{') {
            literal.push_str(&rest[..open]);
            let after = &rest[open..];
            let found = [
                ("{status}", Piece::Status),
                ("{reason}", Piece::Reason),
                ("{message}", Piece::Message),
            ]
            .into_iter()
            .find(|(name, _)| after.starts_with(name));
            match found {
                Some((name, piece)) => {
                    if !literal.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut literal)));
                    }
                    pieces.push(piece);
                    rest = &after[name.len()..];
                }
                None => {
                    literal.push('{');
                    rest = &after[1..];
                }
            }
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        Template(pieces)
    }

    fn render(&self, status: StatusCode, message: &str) -> Bytes {
        let reason = status.canonical_reason().unwrap_or("Error");
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Status => out.push_str(status.as_str()),
                Piece::Reason => out.push_str(reason),
                Piece::Message => out.push_str(&crate::util::html_escape(message)),
            }
        }
        Bytes::from(out)
    }
}

/// The error pages in force: a reload builds them anew with the rest of
/// the shared state, so a request keeps those it started with.
#[derive(Debug, Clone)]
pub struct ErrorPages {
    by_status: HashMap<u16, Template>,
    default: Template,
}

impl Default for ErrorPages {
    fn default() -> Self {
        ErrorPages {
            by_status: HashMap::new(),
            default: Template::parse(BUILT_IN),
        }
    }
}

impl ErrorPages {
    /// The pages of `directory` (`[error_pages] directory`); the built-in
    /// page alone when it is empty (unset). Fails, saying which file and
    /// why, on a directory that cannot be read, an `.html` file whose name
    /// is not a page's, a page that is not a regular file, is larger than
    /// 1 MiB or is not UTF-8, and a directory with no page at all (a
    /// mistyped path to the wrong directory is said, not served around).
    pub fn load(directory: &Path) -> Result<ErrorPages, String> {
        let mut pages = ErrorPages::default();
        if directory.as_os_str().is_empty() {
            return Ok(pages);
        }
        let entries = std::fs::read_dir(directory)
            .map_err(|e| format!("cannot read {}: {}", directory.display(), crate::util::io_cause(&e)))?;
        let mut default = None;
        for entry in entries {
            let entry =
                entry.map_err(|e| format!("cannot read {}: {}", directory.display(), crate::util::io_cause(&e)))?;
            let path = entry.path();
            let name = entry.file_name();
            if !Self::is_page_name(&path) {
                continue;
            }
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".html")) else {
                continue;
            };
            let status = match stem {
                "default" => None,
                _ => match stem.parse::<u16>() {
                    Ok(s) if stem.len() == 3 && (400..=599).contains(&s) => Some(s),
                    _ => {
                        return Err(format!(
                            "{}: an error page is named after its status, 400.html to 599.html, or default.html",
                            path.display()
                        ));
                    }
                },
            };
            let text = read_page(&path).map_err(|why| format!("{}: {why}", path.display()))?;
            match status {
                Some(s) => {
                    pages.by_status.insert(s, Template::parse(&text));
                }
                None => default = Some(Template::parse(&text)),
            }
        }
        if pages.by_status.is_empty() && default.is_none() {
            return Err(format!(
                "{} holds no error page (400.html to 599.html, or default.html)",
                directory.display()
            ));
        }
        if let Some(d) = default {
            pages.default = d;
        }
        Ok(pages)
    }

    /// Whether the file at `path` is read as a page (or refused as a
    /// mis-named one): a name ending in `.html`, not hidden. A README, a
    /// stylesheet, an editor's backup or lock file (`404.html~`,
    /// `.#404.html`) is not.
    pub fn is_page_name(path: &Path) -> bool {
        path.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| !n.starts_with('.') && n.ends_with(".html"))
    }

    /// The body of the page for `status`, saying `message`.
    pub fn body(&self, status: StatusCode, message: &str) -> Bytes {
        self.by_status
            .get(&status.as_u16())
            .unwrap_or(&self.default)
            .render(status, message)
    }
}

/// A page's text: a regular file of at most [`MAX_PAGE`] bytes of UTF-8
/// (the pages are sent as `text/html; charset=utf-8`).
fn read_page(path: &Path) -> Result<String, String> {
    let bytes = crate::util::read_config_file(path, MAX_PAGE)?;
    String::from_utf8(bytes).map_err(|e| format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("dir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write page");
        }
        dir
    }

    #[test]
    fn the_built_in_page_names_the_status_and_escapes_the_message() {
        let body = ErrorPages::default().body(StatusCode::BAD_GATEWAY, "no answer from <b>x</b>");
        assert_eq!(
            body,
            "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body><h1>502 Bad Gateway</h1>\n<p>no answer from &lt;b&gt;x&lt;/b&gt;</p>\n<hr><address>portico</address></body></html>\n"
        );
    }

    #[test]
    fn a_status_page_comes_before_the_default_and_the_built_in_page() {
        let dir = dir_with(&[
            ("403.html", b"denied: {message}"),
            ("default.html", b"{status} {reason}: {message}"),
            ("README", b"not a page"),
        ]);
        let pages = ErrorPages::load(dir.path()).expect("load");
        assert_eq!(pages.body(StatusCode::FORBIDDEN, "a&b"), "denied: a&amp;b");
        assert_eq!(
            pages.body(StatusCode::GATEWAY_TIMEOUT, "slow"),
            "504 Gateway Timeout: slow"
        );
        let dir = dir_with(&[("404.html", b"gone")]);
        let pages = ErrorPages::load(dir.path()).expect("load");
        assert!(pages.body(StatusCode::BAD_GATEWAY, "x").starts_with(b"<!DOCTYPE html>"));
    }

    #[test]
    fn other_braces_are_sent_as_written() {
        let t = Template::parse("body { color: red } {status}{ {statu} {message");
        assert_eq!(
            t.render(StatusCode::NOT_FOUND, "m"),
            "body { color: red } 404{ {statu} {message"
        );
    }

    #[test]
    fn a_message_cannot_write_markup_or_a_placeholder() {
        let dir = dir_with(&[("default.html", b"<p>{message}</p><p>{status}</p>")]);
        let pages = ErrorPages::load(dir.path()).expect("load");
        assert_eq!(
            pages.body(StatusCode::CONFLICT, "\"><script>x</script>{status}"),
            "<p>&quot;&gt;&lt;script&gt;x&lt;/script&gt;{status}</p><p>409</p>"
        );
    }

    #[test]
    fn a_bad_directory_or_page_is_refused_naming_the_file() {
        let missing = ErrorPages::load(Path::new("/nonexistent/errors")).expect_err("missing");
        assert!(missing.contains("/nonexistent/errors"), "{missing}");
        for (name, text, why) in [
            ("40x.html", &b"x"[..], "400.html to 599.html"),
            ("302.html", b"x", "400.html to 599.html"),
            ("0403.html", b"x", "400.html to 599.html"),
            ("500.html", b"\xff\xfe", "not UTF-8"),
        ] {
            let dir = dir_with(&[(name, text)]);
            let e = ErrorPages::load(dir.path()).expect_err(name);
            assert!(e.contains(name) && e.contains(why), "{name}: {e}");
        }
        let empty = dir_with(&[("notes.txt", b"x")]);
        let e = ErrorPages::load(empty.path()).expect_err("empty");
        assert!(e.contains("holds no error page"), "{e}");
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir(dir.path().join("404.html")).expect("mkdir");
        let e = ErrorPages::load(dir.path()).expect_err("a directory");
        assert!(e.contains("not a regular file"), "{e}");
        let big = dir_with(&[("500.html", &vec![b'x'; (MAX_PAGE + 1) as usize])]);
        let e = ErrorPages::load(big.path()).expect_err("big");
        assert!(e.contains("larger than 1 MiB"), "{e}");
        // A FIFO is refused at once, not waited on until someone writes.
        let fifo = tempfile::tempdir().expect("dir");
        let path =
            std::ffi::CString::new(fifo.path().join("500.html").into_os_string().into_encoded_bytes()).expect("path");
        // SAFETY: mkfifo reads a NUL-terminated path, which `path` is.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        let e = ErrorPages::load(fifo.path()).expect_err("a FIFO");
        assert!(e.contains("not a regular file"), "{e}");
        // Hidden files (an editor's lock file) are not pages.
        let dir = dir_with(&[(".#404.html", b"x"), ("404.html", b"gone")]);
        assert_eq!(
            ErrorPages::load(dir.path())
                .expect("load")
                .body(StatusCode::NOT_FOUND, ""),
            "gone"
        );
    }

    #[test]
    fn no_directory_is_the_built_in_page() {
        let pages = ErrorPages::load(Path::new("")).expect("load");
        assert_eq!(
            pages.body(StatusCode::FORBIDDEN, "x"),
            ErrorPages::default().body(StatusCode::FORBIDDEN, "x")
        );
    }
}
