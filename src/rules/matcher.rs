//! The compiled matcher: every rule is filed under one index key, and a
//! request looks up each kind of key once to find its candidate rules.
//!
//! Index keys, cheapest first:
//! - exact host: a hash map from the host to its rules;
//! - wildcard host (`*.example.com`): a hash map from the suffix
//!   (`.example.com`), looked up once per dot of the request's host;
//! - path prefix: a byte trie walked along the path; an anchored regex
//!   (`^/api/v[12]/`) is filed there under its literal prefixes too;
//! - regex literal: a literal every match of the regex must contain
//!   (extracted with regex-syntax's prefix/suffix extractor); all literals
//!   go into one Aho-Corasick automaton run once over the path and query;
//! - the `RegexSet` of the regexes that have no usable literal (or whose
//!   literal too many rules share), run once per request;
//! - always: rules with none of the above (only method, port, header...).
//!
//! A rule is filed under the key that the fewest rules share, so candidate
//! lists stay short however many rules there are. Candidates are checked in
//! full (all matchers) in rule order.

use super::Request;
use super::compile::{HeaderCond, Rule};
use aho_corasick::{AhoCorasick, MatchKind};
use regex::RegexSet;
use regex_syntax::hir::literal::{ExtractKind, Extractor};
use std::collections::HashMap;
use std::fmt;

/// A literal shared by more rules than this is no use as a filter: those
/// regexes go to the `RegexSet` (one automaton pass) instead.
const CROWDED: usize = 32;

/// How a rule matches the host.
#[derive(Debug, Clone)]
pub(super) enum HostMatch {
    Any,
    Exact(Box<str>),
    /// `*.example.com`, stored as `.example.com`.
    Suffix(Box<str>),
}

/// The index key a rule is filed under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Primary {
    Always,
    Host,
    Suffix,
    Path,
    /// An anchored regex, filed in the path trie under its literal prefix.
    Prefix,
    Literal,
    Set,
}

impl fmt::Display for Primary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Primary::Always => "always checked (no host, path or regex key)",
            Primary::Host => "exact-host table",
            Primary::Suffix => "wildcard-host table",
            Primary::Path => "path-prefix trie",
            Primary::Prefix => "path-prefix trie (the regex's literal prefix)",
            Primary::Literal => "regex literal (Aho-Corasick)",
            Primary::Set => "RegexSet",
        })
    }
}

/// A byte trie of path prefixes; each node lists the rules whose prefix
/// ends there. Built with vectors per node, then flattened into a few
/// arrays so a walk touches adjacent memory, not two scattered allocations
/// per byte.
#[derive(Debug, Default)]
struct Trie {
    /// Per node: its edges `edges[e0..e1]`, rules `rules[r0..r1]`, and its
    /// dense child table in `dense` (or `NO_TABLE`).
    nodes: Vec<[u32; 5]>,
    /// (byte, child), sorted by byte within each node.
    edges: Vec<(u8, u32)>,
    rules: Vec<u32>,
    /// Child by byte (`NONE` = no child) for nodes with many children, so
    /// a step costs one load however wide the node: a binary search over
    /// ten digits at each level made 10,000 rules 8% dearer than 10.
    dense: Vec<[u32; 256]>,
}

const NO_TABLE: u32 = u32::MAX;
const NONE: u32 = u32::MAX;
/// Nodes with at least this many children get a dense table.
const DENSE_FROM: usize = 4;

/// A node while the trie is built: (byte, child) edges sorted by byte, and rules.
type BuildNode = (Vec<(u8, u32)>, Vec<u32>);

/// The trie while it is being built.
#[derive(Debug, Default)]
struct TrieBuilder {
    nodes: Vec<BuildNode>,
}

impl TrieBuilder {
    fn insert(&mut self, prefix: &[u8], rule: u32) {
        if self.nodes.is_empty() {
            self.nodes.push(Default::default());
        }
        let mut n = 0usize;
        for &b in prefix {
            n = match self.nodes[n].0.binary_search_by_key(&b, |e| e.0) {
                Ok(k) => self.nodes[n].0[k].1 as usize,
                Err(k) => {
                    let id = self.nodes.len();
                    self.nodes.push(Default::default());
                    self.nodes[n].0.insert(k, (b, id as u32));
                    id
                }
            };
        }
        self.nodes[n].1.push(rule);
    }

    fn finish(self) -> Trie {
        let mut t = Trie::default();
        for (edges, rules) in self.nodes {
            let table = if edges.len() >= DENSE_FROM {
                let mut d = [NONE; 256];
                for &(b, child) in &edges {
                    d[b as usize] = child;
                }
                t.dense.push(d);
                t.dense.len() as u32 - 1
            } else {
                NO_TABLE
            };
            let e0 = t.edges.len() as u32;
            t.edges.extend(edges);
            let r0 = t.rules.len() as u32;
            t.rules.extend(rules);
            t.nodes
                .push([e0, t.edges.len() as u32, r0, t.rules.len() as u32, table]);
        }
        t
    }
}

impl Trie {
    /// Adds the rules of every prefix of `path` to `out`.
    fn collect(&self, path: &[u8], out: &mut Vec<u32>) {
        let Some(mut node) = self.nodes.first() else { return };
        out.extend_from_slice(&self.rules[node[2] as usize..node[3] as usize]);
        for &b in path {
            let child = if node[4] != NO_TABLE {
                self.dense[node[4] as usize][b as usize]
            } else {
                let edges = &self.edges[node[0] as usize..node[1] as usize];
                edges.iter().find(|e| e.0 == b).map_or(NONE, |e| e.1)
            };
            if child == NONE {
                return;
            }
            node = &self.nodes[child as usize];
            out.extend_from_slice(&self.rules[node[2] as usize..node[3] as usize]);
        }
    }
}

/// All index keys.
#[derive(Debug, Default)]
pub(super) struct Index {
    always: Vec<u32>,
    exact: HashMap<Box<str>, Vec<u32>>,
    suffix: HashMap<Box<str>, Vec<u32>>,
    paths: Trie,
    /// Literal automaton and, per literal, the rules needing it.
    literals: Option<(AhoCorasick, Vec<Vec<u32>>)>,
    /// The regexes without a usable literal and, per pattern, its rule.
    set: Option<(RegexSet, Vec<u32>)>,
}

/// Literals one of which every match of `pattern` contains, if there is a
/// short, useful list of them (none shorter than 2 bytes). The flag says
/// the regex is anchored at the start (`^...`), so the literals are
/// prefixes of the path and query, not just somewhere in it.
pub(super) fn required_literals(pattern: &str) -> Option<(Vec<Vec<u8>>, bool)> {
    let hir = regex_syntax::Parser::new().parse(pattern).ok()?;
    let anchored = hir
        .properties()
        .look_set_prefix()
        .contains(regex_syntax::hir::Look::Start);
    let mut best: Option<(Vec<Vec<u8>>, bool)> = None;
    for kind in [ExtractKind::Prefix, ExtractKind::Suffix] {
        let prefix = matches!(kind, ExtractKind::Prefix);
        let mut ex = Extractor::new();
        ex.kind(kind);
        let mut seq = ex.extract(&hir);
        seq.dedup();
        let Some(lits) = seq.literals() else { continue };
        if lits.is_empty() || lits.len() > 16 || lits.iter().any(|l| l.len() < 2) {
            continue;
        }
        let lits: Vec<Vec<u8>> = lits.iter().map(|l| l.as_bytes().to_vec()).collect();
        if prefix && anchored {
            // A prefix of the path: the trie finds it exactly, whatever its length.
            return Some((lits, true));
        }
        let shortest = lits.iter().map(Vec::len).min().unwrap_or(0);
        let better = best
            .as_ref()
            .is_none_or(|b| b.0.iter().map(Vec::len).min().unwrap_or(0) < shortest);
        if better {
            best = Some((lits, false));
        }
    }
    best
}

/// The part of an anchored literal the path trie can check: the trie walks
/// the path only, so the literal stops at the query.
fn path_part(lit: &[u8]) -> &[u8] {
    lit.iter().position(|&b| b == b'?').map_or(lit, |q| &lit[..q])
}

impl Index {
    /// Files every rule under its index key (sets `Rule::primary`) and
    /// builds the tables. Fails only if the `RegexSet` is too large.
    pub fn build(rules: &mut [Rule]) -> Result<Index, String> {
        // How many rules share each key, to file each rule under its rarest one.
        let mut host_n: HashMap<&str, usize> = HashMap::new();
        let mut suffix_n: HashMap<&str, usize> = HashMap::new();
        let mut path_n: HashMap<&str, usize> = HashMap::new();
        let mut lit_n: HashMap<&[u8], usize> = HashMap::new();
        let lits: Vec<Option<(Vec<Vec<u8>>, bool)>> = rules
            .iter()
            .map(|r| r.regex.as_ref().and_then(|re| required_literals(re.as_str())))
            .collect();
        for (r, l) in rules.iter().zip(&lits) {
            match &r.host {
                HostMatch::Exact(h) => *host_n.entry(h).or_default() += 1,
                HostMatch::Suffix(s) => *suffix_n.entry(s).or_default() += 1,
                HostMatch::Any => {}
            }
            if let Some(p) = &r.path {
                *path_n.entry(p).or_default() += 1;
            }
            for lit in l.iter().flat_map(|l| &l.0) {
                *lit_n.entry(lit.as_slice()).or_default() += 1;
            }
        }
        let mut choice = Vec::with_capacity(rules.len());
        for (r, l) in rules.iter().zip(&lits) {
            let mut options: Vec<(usize, Primary)> = Vec::new();
            match &r.host {
                HostMatch::Exact(h) => options.push((host_n[&**h], Primary::Host)),
                HostMatch::Suffix(s) => options.push((suffix_n[&**s], Primary::Suffix)),
                HostMatch::Any => {}
            }
            if let Some(p) = &r.path {
                options.push((path_n[&**p], Primary::Path));
            }
            if let Some((l, anchored)) = l {
                let shared = l.iter().map(|x| lit_n[x.as_slice()]).max().unwrap_or(0);
                if shared <= CROWDED {
                    options.push((shared, if *anchored { Primary::Prefix } else { Primary::Literal }));
                }
            }
            let best = options.into_iter().min_by_key(|o| o.0).map(|o| o.1);
            choice.push(match best {
                Some(p) => p,
                None if r.regex.is_some() => Primary::Set,
                None => Primary::Always,
            });
        }
        let mut index = Index::default();
        let mut paths = TrieBuilder::default();
        let mut lit_ids: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut lit_rules: Vec<Vec<u32>> = Vec::new();
        let mut set_patterns = Vec::new();
        let mut set_rules = Vec::new();
        for (id, (rule, primary)) in rules.iter_mut().zip(choice).enumerate() {
            let id = id as u32;
            match (&primary, &rule.host) {
                (Primary::Host, HostMatch::Exact(h)) => index.exact.entry(h.clone()).or_default().push(id),
                (Primary::Suffix, HostMatch::Suffix(s)) => index.suffix.entry(s.clone()).or_default().push(id),
                (Primary::Path, _) => paths.insert(rule.path.as_deref().unwrap_or("/").as_bytes(), id),
                (Primary::Prefix, _) => {
                    for lit in lits[id as usize].iter().flat_map(|l| &l.0) {
                        paths.insert(path_part(lit), id);
                    }
                }
                (Primary::Literal, _) => {
                    for lit in lits[id as usize].iter().flat_map(|l| &l.0) {
                        let n = lit_rules.len();
                        let k = *lit_ids.entry(lit.clone()).or_insert(n);
                        if k == n {
                            lit_rules.push(Vec::new());
                        }
                        if lit_rules[k].last() != Some(&id) {
                            lit_rules[k].push(id);
                        }
                    }
                }
                (Primary::Set, _) => {
                    set_patterns.push(rule.regex.as_ref().map_or("", |r| r.as_str()).to_string());
                    set_rules.push(id);
                }
                _ => index.always.push(id),
            }
            rule.primary = primary;
        }
        index.paths = paths.finish();
        if !lit_rules.is_empty() {
            let mut pats: Vec<(usize, Vec<u8>)> = lit_ids.into_iter().map(|(l, k)| (k, l)).collect();
            pats.sort_unstable_by_key(|p| p.0);
            let ac = AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(pats.iter().map(|p| &p.1))
                .map_err(|e| format!("cannot build the literal matcher: {e}"))?;
            index.literals = Some((ac, lit_rules));
        }
        if !set_patterns.is_empty() {
            let set = regex::RegexSetBuilder::new(&set_patterns)
                .size_limit(1 << 30)
                .dfa_size_limit(64 << 20)
                .build()
                .map_err(|e| {
                    format!(
                        "the {} regular expressions without a literal to index are too large together: {e}",
                        set_patterns.len()
                    )
                })?;
            index.set = Some((set, set_rules));
        }
        Ok(index)
    }

    /// Fills `out` with the rules that may match `req`, in rule order,
    /// without duplicates.
    pub fn candidates(&self, req: &Request<'_>, out: &mut Vec<u32>) {
        out.clear();
        out.extend_from_slice(&self.always);
        if !self.exact.is_empty()
            && let Some(list) = self.exact.get(req.host)
        {
            out.extend_from_slice(list);
        }
        if !self.suffix.is_empty() {
            let host = req.host;
            for (pos, _) in host.match_indices('.') {
                // `*.example.com` needs at least one label before the suffix.
                if pos > 0
                    && let Some(list) = self.suffix.get(&host[pos..])
                {
                    out.extend_from_slice(list);
                }
            }
        }
        self.paths.collect(req.path().as_bytes(), out);
        if let Some((ac, lists)) = &self.literals {
            for m in ac.find_overlapping_iter(req.path_and_query) {
                out.extend_from_slice(&lists[m.pattern().as_usize()]);
            }
        }
        if let Some((set, ids)) = &self.set {
            out.extend(set.matches(req.path_and_query).iter().map(|p| ids[p]));
        }
        out.sort_unstable();
        out.dedup();
    }
}

impl Rule {
    /// Whether every matcher of the rule holds for `req`.
    pub fn matches(&self, req: &Request<'_>) -> bool {
        let host_ok = match &self.host {
            HostMatch::Any => true,
            HostMatch::Exact(h) => **h == *req.host,
            HostMatch::Suffix(s) => req.host.len() > s.len() && req.host.ends_with(&**s),
        };
        host_ok
            && self.path.as_deref().is_none_or(|p| req.path().starts_with(p))
            && (self.methods.is_empty() || self.methods.contains(req.method))
            && (self.schemes.is_empty() || self.schemes.iter().any(|s| **s == *req.scheme))
            && (self.ports.is_empty() || self.ports.contains(&req.port))
            && (self.modes.is_empty() || self.modes.contains(&req.mode))
            && (self.clients.is_empty() || self.clients.iter().any(|n| n.contains(&canonical(req.client))))
            && self.headers.iter().all(|(name, cond)| header_holds(req.headers, name, cond))
            // The RegexSet already ran this rule's regex; others run it here,
            // last, as the costliest check.
            && (self.primary == Primary::Set || self.regex.as_ref().is_none_or(|re| re.is_match(req.path_and_query)))
    }
}

/// Whether header condition `cond` on field `name` holds in `headers`
/// (any one of the field's lines may satisfy it). A value that is not
/// UTF-8 never matches a regex: it is not text the pattern could mean.
/// Shared with the ACL engine.
pub(crate) fn header_holds(headers: &http::HeaderMap, name: &http::HeaderName, cond: &HeaderCond) -> bool {
    let mut values = headers.get_all(name).iter();
    match cond {
        HeaderCond::Present => values.next().is_some(),
        HeaderCond::Equals(v) => values.any(|x| x.as_bytes() == v.as_slice()),
        HeaderCond::Matches(re) => values.any(|x| x.to_str().is_ok_and(|s| re.is_match(s))),
    }
}

/// IPv4-mapped IPv6 addresses are matched as IPv4 (as the allow-list does).
pub(crate) fn canonical(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
        v4 => v4,
    }
}
