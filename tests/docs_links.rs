//! Keeps the documents' references true: every relative Markdown link in
//! README.md and docs/*.md leads to a file or directory of the repository,
//! every repository path they name (`src/...`, `tests/...`, `.ci/run`, ...)
//! exists, and every Rust source file named relative to src/ (as
//! docs/ARCHITECTURE.md names modules: `admit.rs`, `keepalive/poller.rs`)
//! is a file under src/, tests/, benches/ or fuzz/. A moved or renamed file
//! fails this test until the documents follow.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Top-level directories (and files) whose paths the documents name.
const TOP: &[&str] = &[
    ".ci/",
    "src/",
    "tests/",
    "docs/",
    "bench/",
    "benches/",
    "fuzz/",
    "scripts/",
    "examples/",
];

/// README.md and every docs/*.md, as (path relative to the root, text).
fn documents() -> Vec<(PathBuf, String)> {
    let mut docs = vec![PathBuf::from("README.md")];
    let dir = Path::new(ROOT).join("docs");
    let mut md: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| Path::new("docs").join(p.file_name().expect("a file name")))
        .collect();
    md.sort();
    docs.extend(md);
    docs.into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(Path::new(ROOT).join(&p)).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

/// 1-based line of byte offset `at`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// The targets of inline Markdown links and images, `[text](target)`, with
/// their offsets.
fn link_targets(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("](") {
        let start = from + i + 2;
        let Some(len) = text[start..].find([')', ' ', '\n']) else {
            break;
        };
        out.push((start, &text[start..start + len]));
        from = start;
    }
    out
}

/// True for characters a repository path is made of.
fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '*')
}

/// Words of `text` that look like paths: runs of path characters not
/// preceded by one (so `/etc/portico/x` or `dir/L1` are not taken for
/// `etc/...`), trailing sentence punctuation removed, with their offsets.
fn path_words(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices().chain(std::iter::once((text.len(), ' '))) {
        match (start, path_char(c)) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                let w = text[s..i].trim_end_matches(['.', ',', ':', ';']);
                if !w.is_empty() {
                    out.push((s, w));
                }
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Every file and directory under `dir`, relative to the root, directories
/// with a trailing `/`.
fn walk(dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let rel = p
            .strip_prefix(ROOT)
            .expect("under the root")
            .to_string_lossy()
            .into_owned();
        if p.is_dir() {
            out.push(format!("{rel}/"));
            walk(&p, out);
        } else {
            out.push(rel);
        }
    }
}

/// Problems in one document: links and named paths that lead nowhere.
fn problems(doc: &Path, text: &str, sources: &[String]) -> Vec<String> {
    let mut bad = Vec::new();
    let base = Path::new(ROOT).join(doc.parent().unwrap_or(Path::new("")));
    for (at, target) in link_targets(text) {
        let external = target.contains("://") || target.starts_with("mailto:") || target.starts_with('#');
        let file = target.split('#').next().unwrap_or_default();
        if external || file.is_empty() {
            continue;
        }
        if !base.join(file).exists() {
            bad.push(format!(
                "{}:{}: link to {target}: no such file",
                doc.display(),
                line_of(text, at)
            ));
        }
    }
    for (at, word) in path_words(text) {
        if TOP.iter().any(|t| word.starts_with(t)) {
            // A glob (`tests/common/*.rs`) needs its directory.
            let path = word.split('*').next().unwrap_or_default();
            if !Path::new(ROOT).join(path).exists() {
                bad.push(format!(
                    "{}:{}: names {word}: no such file",
                    doc.display(),
                    line_of(text, at)
                ));
            }
        } else if word.ends_with(".rs") && !word.contains('*') && !word.starts_with(['.', '/']) {
            // A module named relative to src/ (or a test or bench file).
            let suffix = format!("/{word}");
            if !sources.iter().any(|s| s.ends_with(&suffix)) {
                bad.push(format!(
                    "{}:{}: names {word}: no such file under src/, tests/, benches/ or fuzz/",
                    doc.display(),
                    line_of(text, at)
                ));
            }
        }
    }
    bad
}

#[test]
fn every_link_and_file_path_in_the_docs_exists() {
    let mut sources = Vec::new();
    for d in ["src", "tests", "benches", "fuzz"] {
        walk(&Path::new(ROOT).join(d), &mut sources);
    }
    let docs = documents();
    assert!(
        docs.len() >= 4,
        "README.md and docs/*.md: {:?}",
        docs.iter().map(|d| &d.0).collect::<Vec<_>>()
    );
    let bad: Vec<String> = docs.iter().flat_map(|(p, t)| problems(p, t, &sources)).collect();
    assert!(bad.is_empty(), "broken references:\n{}", bad.join("\n"));
}

/// Markdown documents of the repository (everything but `target/` and
/// `.git/`), by file name.
fn markdown_names() -> Vec<String> {
    let mut all = Vec::new();
    for e in std::fs::read_dir(ROOT).expect("the root").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "target" || name == ".git" {
            continue;
        }
        if e.path().is_dir() {
            walk(&e.path(), &mut all);
        } else {
            all.push(name);
        }
    }
    all.iter()
        .filter(|p| p.ends_with(".md"))
        .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
        .collect()
}

/// References in one document to documents a clone of the repository does
/// not have: a Markdown file named by itself (`NOTES.md`) that is nowhere
/// in the repository, and a `../` path that leaves the repository or leads
/// nowhere.
fn outside(doc: &Path, text: &str, markdown: &[String]) -> Vec<String> {
    let mut bad = Vec::new();
    let root = Path::new(ROOT).canonicalize().expect("the root");
    let base = Path::new(ROOT).join(doc.parent().unwrap_or(Path::new("")));
    for (at, word) in path_words(text) {
        let escapes = word.starts_with("../") && !base.join(word).canonicalize().is_ok_and(|p| p.starts_with(&root));
        let unknown = word.ends_with(".md")
            && !word.contains(['/', '*'])
            && !word.starts_with('.')
            && !markdown.iter().any(|m| m == word);
        if escapes || unknown {
            bad.push(format!(
                "{}:{}: cites {word}, which is not in the repository",
                doc.display(),
                line_of(text, at)
            ));
        }
    }
    bad
}

#[test]
fn the_docs_cite_no_document_outside_the_repository() {
    // Documents the project was specified from are named by their titles
    // (docs/BACKGROUND.md), never by a file a clone does not have.
    let markdown = markdown_names();
    let bad: Vec<String> = documents().iter().flat_map(|(p, t)| outside(p, t, &markdown)).collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    let background = std::fs::read_to_string(Path::new(ROOT).join("docs/BACKGROUND.md")).expect("docs/BACKGROUND.md");
    for name in [
        "Sun Java System Web Proxy Server 4",
        "Squid",
        "nginx",
        "Varnish",
        "Apache Traffic Server",
        "RFC 9111",
    ] {
        assert!(background.contains(name), "docs/BACKGROUND.md does not name {name}");
    }
}

#[test]
fn a_document_outside_the_repository_is_reported_with_its_line() {
    let markdown = vec!["README.md".to_string(), "CONFIG.md".to_string()];
    let text = "See README.md and CONFIG.md.\nAs NOTES.md says, and ../../elsewhere/spec.txt;\n\
                [the config](../docs/CONFIG.md) is fine.\n";
    let bad = outside(Path::new("docs/X.md"), text, &markdown);
    assert_eq!(
        bad,
        [
            "docs/X.md:2: cites NOTES.md, which is not in the repository",
            "docs/X.md:2: cites ../../elsewhere/spec.txt, which is not in the repository",
        ]
    );
}

#[test]
fn a_missing_file_is_reported_with_its_line() {
    let sources = vec!["src/admit.rs".to_string(), "src/keepalive/mod.rs".to_string()];
    let text = "Intro.\nSee [the guide](NOWHERE.md) and `src/nowhere.rs`,\n\
                `admit.rs`, `keepalive.rs`, `tests/common/*.rs`, [a site](https://example.com/x)\n\
                and /etc/portico/portico.toml, dir/L1/L2, https://sh.rustup.rs.\n";
    let bad = problems(Path::new("docs/X.md"), text, &sources);
    assert_eq!(
        bad,
        [
            "docs/X.md:2: link to NOWHERE.md: no such file",
            "docs/X.md:2: names src/nowhere.rs: no such file",
            "docs/X.md:3: names keepalive.rs: no such file under src/, tests/, benches/ or fuzz/",
        ]
    );
}
