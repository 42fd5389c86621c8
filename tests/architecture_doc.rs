//! Keeps docs/ARCHITECTURE.md true to the files: every source file its
//! tree and prose name exists where they say, and every file under src/
//! appears in the tree, so that moving, adding or removing a module fails
//! here until the document follows.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn doc() -> String {
    std::fs::read_to_string(Path::new(ROOT).join("docs/ARCHITECTURE.md")).expect("docs/ARCHITECTURE.md is readable")
}

/// The first fenced block of the document: the tree of src/.
fn tree_block(doc: &str) -> Vec<&str> {
    let mut lines = doc.lines().skip_while(|l| !l.starts_with("```")).skip(1);
    let block: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
    assert!(!block.is_empty(), "ARCHITECTURE.md has no tree block");
    block
}

/// The paths the tree names, relative to src/. An entry is a line whose
/// first word ends in `.rs` or `/`; two spaces of indentation per level
/// put it inside the directory above it. Other lines continue the
/// description of the entry above.
fn tree_paths(block: &[&str]) -> Vec<String> {
    let mut dirs: Vec<String> = Vec::new();
    let mut paths = Vec::new();
    for line in block {
        let word = line.split_whitespace().next().unwrap_or("");
        if !(word.ends_with(".rs") || word.ends_with('/')) {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        assert!(indent % 2 == 0, "odd indentation in the tree: {line:?}");
        let depth = indent / 2;
        assert!(
            depth <= dirs.len(),
            "entry deeper than the directory above it: {line:?}"
        );
        dirs.truncate(depth);
        let path = format!("{}{word}", dirs.concat());
        if word.ends_with('/') {
            dirs.push(word.to_string());
        }
        paths.push(path);
    }
    paths
}

/// Every file under `dir`, relative to `base`.
fn files_under(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(base, &p, out);
        } else if let Ok(rel) = p.strip_prefix(base) {
            out.insert(rel.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn every_path_in_the_tree_exists() {
    let doc = doc();
    let src = PathBuf::from(ROOT).join("src");
    let missing: Vec<String> = tree_paths(&tree_block(&doc))
        .into_iter()
        .filter(|p| !src.join(p).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's tree names what src/ does not have: {missing:?}"
    );
}

#[test]
fn every_source_file_is_in_the_tree() {
    let doc = doc();
    let named: BTreeSet<String> = tree_paths(&tree_block(&doc)).into_iter().collect();
    let mut files = BTreeSet::new();
    let src = PathBuf::from(ROOT).join("src");
    files_under(&src, &src, &mut files);
    let unnamed: Vec<&String> = files
        .iter()
        .filter(|f| f.ends_with(".rs") && !named.contains(*f))
        // A directory's mod.rs is named by the directory.
        .filter(|f| !(f.ends_with("/mod.rs") && named.contains(f.trim_end_matches("mod.rs"))))
        .collect();
    assert!(
        unnamed.is_empty(),
        "src/ files missing from ARCHITECTURE.md's tree: {unnamed:?}"
    );
}

/// Every `.rs` file named in backquotes anywhere in the document (`listen.rs`,
/// `proxy/tunnel.rs`, `tests/desync.rs`) is the end of a path in the
/// repository's sources, tests, benchmarks or examples.
#[test]
fn every_file_the_prose_names_exists() {
    let doc = doc();
    let mut files = BTreeSet::new();
    let root = PathBuf::from(ROOT);
    for dir in ["src", "tests", "benches", "examples", "fuzz/fuzz_targets"] {
        files_under(&root, &root.join(dir), &mut files);
    }
    let mut missing = Vec::new();
    for quoted in doc.split('`').skip(1).step_by(2) {
        for word in quoted.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '/' || c == '.')) {
            if !word.ends_with(".rs") {
                continue;
            }
            let found = files.iter().any(|f| f == word || f.ends_with(&format!("/{word}")));
            if !found {
                missing.push(word.to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names files that do not exist: {missing:?}"
    );
}

#[test]
fn the_tree_reader_follows_indentation() {
    let block = [
        "main.rs   the CLI",
        "proxy/    the pipeline",
        "  mod.rs  the handler",
        "            more words",
        "  route.rs",
        "listen.rs",
    ];
    assert_eq!(
        tree_paths(&block),
        ["main.rs", "proxy/", "proxy/mod.rs", "proxy/route.rs", "listen.rs"]
    );
}
