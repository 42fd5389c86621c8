//! How a statistic is declared: once, in `snapshot.rs`, with everything the
//! views and the sum across worker processes need (in the way Varnish's
//! `.vsc` files declare its counters).
//!
//! Each section of the [`Snapshot`](super::Snapshot) is written with the
//! [`section!`](crate::section) macro. One line per figure gives its field
//! (name and type: the JSON key and the `snap.section.field` path), its
//! [`Kind`], how it sums across worker processes ([`Rule`]), its [`Unit`],
//! its help text, and optionally its Prometheus name (with a label when
//! several figures make one metric family) and its stats-xml element and
//! attribute. From that the macro derives the struct (and so the JSON and
//! the files workers exchange), [`Section::combine`] (the sum across
//! processes), and [`Section::visit`], through which the Prometheus and
//! stats-xml views render every figure without naming it. The perfdump
//! keeps its hand-laid-out report but reads the same fields.
//!
//! # Adding a figure
//!
//! Add one line to its section in `snapshot.rs`, fill the field where the
//! snapshot is built (`proxy/monitor.rs`), and it is summed, exported to
//! `/metrics` and `/stats-xml` and in the JSON; `stats::declare`'s tests
//! check that every declared figure reaches every view and sums by its rule.
//! A new section: declare it with [`section!`](crate::section) and add it
//! as one more line of [`Snapshot`](super::Snapshot) (itself declared the
//! same way, its sections being figures of kind [`Kind::Section`]); an
//! optional one is an `Option`, a list of entries a `Vec` of a section
//! that is [`Keyed`] (entries meet by name across processes).

use super::hist::HistSnapshot;

/// What a figure is (Prometheus's metric types, plus facts shown as text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (until a restart).
    Counter,
    /// A level now, a peak, a limit or a setting.
    Gauge,
    /// A latency distribution.
    Histogram,
    /// A fact shown as it is (a name, a pid, a time): not a metric. In a
    /// list's entries, an `Info` with a Prometheus name is the label that
    /// names the entry (`listener="ls1"`).
    Info,
    /// A group of figures: a nested section or a list of entries.
    Section,
}

/// How a figure combines across worker processes (`server.processes > 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Summed: counters, histograms (bucket by bucket), gauges and the
    /// limits each process applies on its own.
    Add,
    /// The largest: what the processes share or what the oldest shows.
    Max,
    /// The first snapshot's (the answering process's): a setting that is
    /// the same in every worker, or a per-worker fact such as its pid.
    First,
    /// True only if true in every process.
    All,
    /// True if true in any process.
    Any,
}

/// A figure's unit. Prometheus shows durations in seconds (its base unit),
/// so figures kept in micro- or nanoseconds are scaled there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A count, a flag, or a text.
    None,
    /// Bytes.
    Bytes,
    /// Seconds.
    Seconds,
    /// Microseconds (shown in seconds by Prometheus).
    Micros,
    /// Nanoseconds (shown in seconds by Prometheus).
    Nanos,
}

/// One declared figure.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    /// The section's field in [`Snapshot`](super::Snapshot) (`cache.disk` for a nested one).
    pub section: &'static str,
    /// The field's name (its JSON key).
    pub field: &'static str,
    /// What it is.
    pub kind: Kind,
    /// How it sums across processes.
    pub rule: Rule,
    /// Its unit.
    pub unit: Unit,
    /// One sentence saying what it counts (Prometheus `# HELP`).
    pub help: &'static str,
    /// Its Prometheus metric name, if exported.
    pub prom: Option<&'static str>,
    /// Its label in that metric family, when several figures share the name.
    pub label: Option<(&'static str, &'static str)>,
    /// Its stats-xml element and attribute, if shown there.
    pub xml: Option<(&'static str, &'static str)>,
}

/// A figure's value, for a view to render.
pub enum Value<'a> {
    /// An integer.
    Int(u64),
    /// A real number.
    Real(f64),
    /// A flag.
    Flag(bool),
    /// A figure the process cannot count (yet): not shown.
    Absent,
    /// A distribution.
    Hist(&'a HistSnapshot),
    /// Text.
    Text(&'a str),
    /// Counts by label value (method, status class, cache outcome).
    Labelled(&'a [(String, u64)]),
    /// A nested section; `None` when absent.
    Nested(Option<&'a dyn Section>),
    /// A list of entries (listeners, buckets, stages), each a section.
    List(Vec<&'a dyn Section>),
}

/// A section of the snapshot, as [`section!`](crate::section) derives it.
pub trait Section {
    /// Adds another process's figures to these, each by its [`Rule`].
    fn combine(&mut self, other: &Self)
    where
        Self: Sized;
    /// Calls `f` with every figure and its value, in declaration order.
    fn visit(&self, f: &mut dyn FnMut(&'static Figure, Value<'_>));
}

/// A field type's view as a [`Value`].
pub trait AsValue {
    /// The value.
    fn value(&self) -> Value<'_>;
}

impl AsValue for u64 {
    fn value(&self) -> Value<'_> {
        Value::Int(*self)
    }
}

impl AsValue for usize {
    fn value(&self) -> Value<'_> {
        Value::Int(*self as u64)
    }
}

impl AsValue for u32 {
    fn value(&self) -> Value<'_> {
        Value::Int(u64::from(*self))
    }
}

impl AsValue for f64 {
    fn value(&self) -> Value<'_> {
        Value::Real(*self)
    }
}

impl AsValue for bool {
    fn value(&self) -> Value<'_> {
        Value::Flag(*self)
    }
}

impl AsValue for String {
    fn value(&self) -> Value<'_> {
        Value::Text(self)
    }
}

impl AsValue for HistSnapshot {
    fn value(&self) -> Value<'_> {
        Value::Hist(self)
    }
}

impl AsValue for Vec<(String, u64)> {
    fn value(&self) -> Value<'_> {
        Value::Labelled(self)
    }
}

impl AsValue for Option<u64> {
    fn value(&self) -> Value<'_> {
        self.map_or(Value::Absent, Value::Int)
    }
}

impl AsValue for Option<usize> {
    fn value(&self) -> Value<'_> {
        self.map_or(Value::Absent, |v| Value::Int(v as u64))
    }
}

impl<T: Section> AsValue for Vec<T> {
    fn value(&self) -> Value<'_> {
        Value::List(self.iter().map(|s| s as &dyn Section).collect())
    }
}

impl<T: Section> AsValue for Option<T> {
    fn value(&self) -> Value<'_> {
        Value::Nested(self.as_ref().map(|s| s as &dyn Section))
    }
}

/// The [`Rule::Add`] of a field type.
pub trait Add {
    /// Adds `other` to `self`.
    fn add(&mut self, other: &Self);
}

macro_rules! add_numbers {
    ($($t:ty),*) => {$(
        impl Add for $t {
            fn add(&mut self, other: &Self) {
                *self += *other;
            }
        }
    )*};
}
add_numbers!(u64, usize, u32, f64);

impl Add for HistSnapshot {
    fn add(&mut self, other: &Self) {
        self.merge(other);
    }
}

/// An entry of a list that sums entry by entry: entries with the same key
/// (a label, a listener's, bucket's or stage's name) are added, new ones
/// appended.
pub trait Keyed {
    /// What identifies the entry across processes.
    fn key(&self) -> &str;
}

/// A count by label (method, status class, cache outcome).
impl Keyed for (String, u64) {
    fn key(&self) -> &str {
        &self.0
    }
}

impl Add for (String, u64) {
    fn add(&mut self, other: &Self) {
        self.1 += other.1;
    }
}

impl<T: Keyed + Add + Clone> Add for Vec<T> {
    fn add(&mut self, other: &Self) {
        for entry in other {
            match self.iter_mut().find(|e| e.key() == entry.key()) {
                Some(e) => e.add(entry),
                None => self.push(entry.clone()),
            }
        }
    }
}

/// Both present: added; else whichever is present (a section or a figure
/// only some processes have).
impl<T: Add + Clone> Add for Option<T> {
    fn add(&mut self, other: &Self) {
        match (self.as_mut(), other) {
            (Some(a), Some(b)) => a.add(b),
            (None, Some(b)) => *self = Some(b.clone()),
            (_, None) => {}
        }
    }
}

/// The [`Rule::Max`] of a field type.
pub trait Max {
    /// Keeps the larger of `self` and `other`.
    fn max_with(&mut self, other: &Self);
}

macro_rules! max_numbers {
    ($($t:ty),*) => {$(
        impl Max for $t {
            fn max_with(&mut self, other: &Self) {
                if *other > *self {
                    *self = *other;
                }
            }
        }
    )*};
}
max_numbers!(u64, usize, f64);

/// Declares one section of the snapshot: the struct and its figures (see
/// the module doc of `stats::declare`). Each field reads
///
/// ```text
/// /// Doc comment (rustdoc and the JSON's meaning).
/// name: Type => Kind, Rule, Unit, "Help text."
///     [, prom "metric_name" [{ "label" = "value" }]]
///     [, xml "element" "attribute"];
/// ```
///
/// `Kind` is a [`Kind`], `Rule` a [`Rule`], `Unit` a [`Unit`] variant.
/// Field attributes (`#[serde(default)]` for a figure older files lack)
/// go with the doc comment. Prometheus names follow its conventions (base
/// units, a counter ends in `_total`: the tests check). A label with an
/// empty value takes its values from the data (counts by method); on an
/// `Info` figure of a list entry, the Prometheus name is the label the
/// entry's samples carry (`listener="ls1"`). A figure whose section has
/// no stats-xml element yet gets one (the tests ask for an attribute).
#[macro_export]
macro_rules! section {
    (
        $(#[$sm:meta])*
        pub struct $name:ident at $path:literal {
            $(
                $(#[$fm:meta])*
                $field:ident : $ty:ty => $kind:ident, $rule:ident, $unit:ident, $help:expr
                    $(, prom $prom:literal $({ $lk:literal = $lv:literal })?)?
                    $(, xml $el:literal $attr:literal)?
                ;
            )*
        }
    ) => {
        $(#[$sm])*
        #[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
        pub struct $name {
            $( $(#[$fm])* pub $field: $ty, )*
        }

        impl $name {
            /// Every figure of this section, in declaration order.
            pub const FIGURES: &'static [$crate::stats::declare::Figure] = &[
                $( $crate::stats::declare::Figure {
                    section: $path,
                    field: stringify!($field),
                    kind: $crate::stats::declare::Kind::$kind,
                    rule: $crate::stats::declare::Rule::$rule,
                    unit: $crate::stats::declare::Unit::$unit,
                    help: $help,
                    prom: $crate::section!(@opt $($prom)?),
                    label: $crate::section!(@label $($( $lk, $lv )?)?),
                    xml: $crate::section!(@xml $($el, $attr)?),
                }, )*
            ];
        }

        impl $crate::stats::declare::AsValue for $name {
            fn value(&self) -> $crate::stats::declare::Value<'_> {
                $crate::stats::declare::Value::Nested(Some(self))
            }
        }

        impl $crate::stats::declare::Add for $name {
            fn add(&mut self, other: &Self) {
                $crate::stats::declare::Section::combine(self, other);
            }
        }

        impl $crate::stats::declare::Section for $name {
            fn combine(&mut self, other: &Self) {
                $( $crate::section!(@rule $rule, self.$field, other.$field); )*
            }

            fn visit(&self, f: &mut dyn FnMut(&'static $crate::stats::declare::Figure, $crate::stats::declare::Value<'_>)) {
                let mut figures = Self::FIGURES.iter();
                $(
                    if let Some(figure) = figures.next() {
                        f(figure, $crate::stats::declare::AsValue::value(&self.$field));
                    }
                )*
            }
        }
    };
    (@opt) => { None };
    (@opt $v:literal) => { Some($v) };
    (@label) => { None };
    (@label $k:literal, $v:literal) => { Some(($k, $v)) };
    (@xml) => { None };
    (@xml $e:literal, $a:literal) => { Some(($e, $a)) };
    (@rule Add, $a:expr, $b:expr) => { $crate::stats::declare::Add::add(&mut $a, &$b) };
    (@rule Max, $a:expr, $b:expr) => { $crate::stats::declare::Max::max_with(&mut $a, &$b) };
    (@rule First, $a:expr, $b:expr) => {{ let _ = &$b; }};
    (@rule All, $a:expr, $b:expr) => { $a &= $b };
    (@rule Any, $a:expr, $b:expr) => { $a |= $b };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::snapshot::*;
    use crate::stats::views::{prom, xml};

    /// A snapshot with every section present, one listener, bucket, stage
    /// and label each, and every number `n`, every flag `flag` (names kept,
    /// so entries meet across processes).
    fn filled(n: u64, flag: bool) -> Snapshot {
        let mut s = Snapshot {
            connection_queue: Some(Default::default()),
            native_pool: Some(Default::default()),
            cache: Some(CacheInfo {
                disk: Some(Default::default()),
                ..Default::default()
            }),
            auth: Some(Default::default()),
            socks: Some(Default::default()),
            array: Some(ArrayInfo {
                members: vec![ArrayMemberInfo {
                    name: "m1".into(),
                    address: "127.0.0.11:8080".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            listeners: vec![ListenerInfo {
                name: "ls1".into(),
                address: "http://127.0.0.1:8080".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        s.upstream.servers = vec![ServerQueueInfo {
            server: "o.test:80".into(),
            ..Default::default()
        }];
        s.buckets.buckets = vec![BucketInfo {
            name: "default-bucket".into(),
            stages: vec![StageInfo {
                name: "route".into(),
                ..Default::default()
            }],
            ..Default::default()
        }];
        for list in [
            &mut s.requests.by_method,
            &mut s.requests.by_status,
            &mut s.requests.by_cache,
        ] {
            list.push(("X".into(), 0));
        }
        let hist = HistSnapshot::from_values(&[1]);
        s.requests.response_time = hist.clone();
        s.upstream.connect_time = hist.clone();
        s.upstream.first_byte_time = hist.clone();
        if let Some(a) = s.auth.as_mut() {
            a.verify_time = hist;
        }
        // Every number (and every figure a process may lack: null) becomes
        // n; histograms are set apart so their bucket layout stays valid.
        fn set(v: &mut serde_json::Value, n: u64, flag: bool) {
            match v {
                serde_json::Value::Number(_) | serde_json::Value::Null => *v = n.into(),
                serde_json::Value::Bool(b) => *b = flag,
                serde_json::Value::Array(a) => a.iter_mut().for_each(|v| set(v, n, flag)),
                serde_json::Value::Object(o) => {
                    for (k, v) in o.iter_mut() {
                        if k == "counts" {
                            *v = serde_json::json!([[1, n]]);
                        } else {
                            set(v, n, flag);
                        }
                    }
                }
                serde_json::Value::String(_) => {}
            }
        }
        let mut json = serde_json::to_value(&s).unwrap();
        set(&mut json, n, flag);
        serde_json::from_value(json).unwrap()
    }

    /// A figure's value, comparable.
    #[derive(Debug, Clone, PartialEq)]
    enum Seen {
        Num(f64),
        Flag(bool),
        Text(String),
        Absent,
    }

    /// Every leaf figure of `s` with its path, in order.
    fn leaves(s: &dyn Section, path: &str, out: &mut Vec<(String, &'static Figure, Seen)>) {
        s.visit(&mut |f, v| {
            let here = format!("{path}{}", f.field);
            let seen = match v {
                Value::Int(n) => Seen::Num(n as f64),
                Value::Real(x) => Seen::Num(x),
                Value::Flag(b) => Seen::Flag(b),
                Value::Text(t) => Seen::Text(t.to_string()),
                Value::Absent => Seen::Absent,
                Value::Hist(h) => Seen::Num(h.count as f64),
                Value::Labelled(l) => Seen::Num(l.iter().map(|(_, n)| *n as f64).sum()),
                Value::Nested(None) => Seen::Absent,
                Value::Nested(Some(inner)) => return leaves(inner, &format!("{here}."), out),
                Value::List(entries) => {
                    for (i, e) in entries.iter().enumerate() {
                        leaves(*e, &format!("{here}[{i}]."), out);
                    }
                    return;
                }
            };
            out.push((here, f, seen));
        });
    }

    fn all(s: &Snapshot) -> Vec<(String, &'static Figure, Seen)> {
        let mut out = Vec::new();
        leaves(s, "", &mut out);
        out
    }

    #[test]
    fn every_figure_sums_by_its_declared_rule() {
        let (ones, zeros) = (filled(1, true), filled(0, false));
        let twice = all(&Snapshot::sum(&[ones.clone(), ones.clone()]));
        let one_then_zero = all(&Snapshot::sum(&[ones.clone(), zeros.clone()]));
        let zero_then_one = all(&Snapshot::sum(&[zeros, ones.clone()]));
        let base = all(&ones);
        assert!(base.len() > 100, "{} figures", base.len());
        assert_eq!(twice.len(), base.len(), "a sum has the same figures");
        for (i, (path, f, one)) in base.iter().enumerate() {
            if path == "processes" {
                continue; // per worker, set by the caller
            }
            assert_ne!(*one, Seen::Absent, "{path}: not filled by the test");
            let (two, hi, lo) = (&twice[i].2, &one_then_zero[i].2, &zero_then_one[i].2);
            assert_eq!(twice[i].0, *path);
            match (f.rule, one) {
                (_, Seen::Text(_)) => assert_eq!((two, hi), (one, one), "{path}: text is kept"),
                (Rule::Add, _) => assert_eq!(*two, Seen::Num(2.0), "{path}: added"),
                (Rule::Max, _) => assert_eq!((two, lo), (&Seen::Num(1.0), &Seen::Num(1.0)), "{path}: largest"),
                (Rule::First, Seen::Flag(_)) => assert_eq!(*lo, Seen::Flag(false), "{path}: first"),
                (Rule::First, _) => assert_eq!((two, lo), (&Seen::Num(1.0), &Seen::Num(0.0)), "{path}: first"),
                (Rule::All, _) => assert_eq!((hi, lo), (&Seen::Flag(false), &Seen::Flag(false)), "{path}: all"),
                (Rule::Any, _) => assert_eq!((hi, lo), (&Seen::Flag(true), &Seen::Flag(true)), "{path}: any"),
            }
        }
    }

    #[test]
    fn every_figure_reaches_metrics_stats_xml_and_json() {
        let s = filled(1, true);
        let metrics = prom::render(&s);
        let doc = xml::render(&s, &[], &std::collections::HashSet::new());
        let json = serde_json::to_value(&s).unwrap();
        for (path, f, _) in all(&s) {
            if path == "processes" {
                continue; // per worker: in the JSON document's top level
            }
            // JSON: under its field path (list entries: the first).
            let pointer = format!("/{}", path.replace(['.', '['], "/").replace(']', ""));
            assert!(json.pointer(&pointer).is_some(), "{path} not in the JSON");
            match (f.kind, f.prom) {
                (Kind::Info, Some(label)) => {
                    assert!(
                        metrics.contains(&format!("{label}=\"")),
                        "{path}: label {label} not in /metrics"
                    );
                }
                (Kind::Info | Kind::Section, _) => {}
                (_, None) => panic!("{path}: a metric without a Prometheus name"),
                (_, Some(name)) => {
                    let sample = metrics.lines().any(|l| {
                        let family = l.split(['{', ' ']).next().unwrap_or_default();
                        family == name || (f.kind == Kind::Histogram && family == format!("{name}_count"))
                    });
                    assert!(sample, "{path}: {name} not in /metrics\n{metrics}");
                    assert!(metrics.contains(&format!("# HELP {name} {}\n", f.help)), "{path}: help");
                    if f.kind == Kind::Counter {
                        assert!(name.ends_with("_total"), "{name}: a counter ends in _total");
                    }
                }
            }
            match f.xml {
                Some((element, attribute)) => {
                    let shown = doc.lines().any(|l| {
                        l.trim_start().starts_with(&format!("<{element} ")) && l.contains(&format!(" {attribute}=\""))
                    });
                    assert!(shown, "{path}: {element} {attribute} not in stats-xml\n{doc}");
                }
                // Text without a place in the Sun proxy's layout, and the
                // labelled counts (count2xx, countGet, ... by hand).
                None => assert!(
                    matches!(f.kind, Kind::Info | Kind::Section) || f.label.is_some(),
                    "{path}: no stats-xml attribute"
                ),
            }
        }
        promtool(&metrics);
    }

    /// `promtool check metrics` finds nothing to say (its lint included).
    fn promtool(metrics: &str) {
        use std::io::Write;
        let mut child = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool not found: install Debian package `prometheus` (.ci/run does)");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(metrics.as_bytes())
            .expect("write to promtool");
        let out = child.wait_with_output().expect("promtool");
        assert!(
            out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
            "promtool check metrics: {}{}\n{metrics}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn names_are_unique_per_view() {
        let s = filled(1, true);
        let mut prom_names = std::collections::HashMap::new();
        let mut xml_names = std::collections::HashSet::new();
        for (path, f, _) in all(&s) {
            if let (Some(name), false) = (f.prom, f.kind == Kind::Info) {
                // One family may hold several figures, told apart by a label.
                let label = f.label.map(|(k, v)| format!("{k}={v}"));
                let earlier = prom_names.insert((name, label.clone()), path.clone());
                assert!(
                    earlier.is_none() || path.contains('['),
                    "{name} {label:?}: {path} and {earlier:?}"
                );
            }
            if let Some(x) = f.xml
                && !path.contains('[')
            {
                assert!(xml_names.insert(x), "{x:?} declared twice ({path})");
            }
        }
    }
}
