//! `/metrics`: Prometheus text exposition (format 0.0.4), written by hand
//! from the snapshot: every declared counter, gauge and latency histogram
//! under the name its declaration gives (`stats::declare`), plus the
//! standard `process_*` ones and a few derived figures (with several
//! worker processes, summed over them: `portico_processes` says how many).
//! Hand-rolled rather than prometheus-client because the values already
//! live in our own atomics and histograms; a registry would only copy them.

use crate::stats::declare::{Figure, Kind, Section, Unit, Value};
use crate::stats::hist::HistSnapshot;
use crate::stats::snapshot::Snapshot;
use std::fmt::Write;

fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One metric family: its header and its samples (`name{labels} value`
/// lines), gathered before writing so samples from several figures or list
/// entries stay under one header.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    lines: String,
}

#[derive(Default)]
struct Out {
    families: Vec<Family>,
}

/// `{a="x",b="y"}`, or nothing without labels.
fn braces(labels: &[(&str, String)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", label_value(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

impl Out {
    fn family(&mut self, name: &'static str, kind: &'static str, help: &'static str) -> &mut String {
        let at = match self.families.iter().position(|f| f.name == name) {
            Some(at) => at,
            None => {
                self.families.push(Family {
                    name,
                    kind,
                    help,
                    lines: String::new(),
                });
                self.families.len() - 1
            }
        };
        &mut self.families[at].lines
    }

    fn one(&mut self, name: &'static str, kind: &'static str, help: &'static str, v: impl std::fmt::Display) {
        let _ = writeln!(self.family(name, kind, help), "{name} {v}");
    }

    /// Buckets at powers of two microseconds, 1 µs .. 2^25 µs (about 33 s).
    fn histogram(&mut self, name: &'static str, help: &'static str, h: &HistSnapshot) {
        let lines = self.family(name, "histogram", help);
        for (edge_us, count) in h.cumulative_pow2(25) {
            let _ = writeln!(lines, "{name}_bucket{{le=\"{}\"}} {count}", edge_us as f64 / 1e6);
        }
        let _ = writeln!(lines, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(lines, "{name}_sum {}", h.sum_us as f64 / 1e6);
        let _ = writeln!(lines, "{name}_count {}", h.count);
    }

    /// One declared figure's samples, with the labels of the list entry it
    /// belongs to (if any).
    fn figure(&mut self, f: &'static Figure, name: &'static str, labels: &[(&str, String)], v: &Value<'_>) {
        let kind = match f.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Info | Kind::Section => return,
        };
        let mut labels = labels.to_vec();
        if let Some((k, v)) = f.label
            && !v.is_empty()
        {
            labels.push((k, v.to_string()));
        }
        // Prometheus's base unit of time is the second.
        let scale = match f.unit {
            Unit::Micros => 1e6,
            Unit::Nanos => 1e9,
            Unit::None | Unit::Bytes | Unit::Seconds => 1.0,
        };
        let text = match *v {
            Value::Int(n) if scale == 1.0 => n.to_string(),
            Value::Int(n) => (n as f64 / scale).to_string(),
            Value::Real(x) => (x / scale).to_string(),
            Value::Flag(b) => u8::from(b).to_string(),
            Value::Hist(h) => return self.histogram(name, f.help, h),
            Value::Labelled(list) => {
                let key = f.label.map_or("label", |(k, _)| k);
                let lines = self.family(name, kind, f.help);
                for (l, n) in list {
                    let mut with = labels.clone();
                    with.push((key, l.clone()));
                    let _ = writeln!(lines, "{name}{} {n}", braces(&with));
                }
                return;
            }
            Value::Absent | Value::Text(_) | Value::Nested(_) | Value::List(_) => return,
        };
        let _ = writeln!(self.family(name, kind, f.help), "{name}{} {text}", braces(&labels));
    }

    /// Every declared figure of `section` (and of the sections and list
    /// entries it holds), under `labels`.
    fn section(&mut self, section: &dyn Section, labels: &[(&str, String)]) {
        section.visit(&mut |f, v| match v {
            Value::Nested(Some(inner)) => self.section(inner, labels),
            Value::List(entries) => {
                for entry in entries {
                    // An entry's `Info` figures with a metric name are its labels.
                    let mut with = labels.to_vec();
                    entry.visit(&mut |f, v| {
                        if let (Kind::Info, Some(key), Value::Text(t)) = (f.kind, f.prom, &v) {
                            with.push((key, t.to_string()));
                        }
                    });
                    self.section(entry, &with);
                }
            }
            v => {
                if let Some(name) = f.prom {
                    self.figure(f, name, labels, &v);
                }
            }
        });
    }

    fn text(self) -> String {
        let mut t = String::new();
        for f in self.families {
            let _ = writeln!(t, "# HELP {} {}\n# TYPE {} {}", f.name, f.help, f.name, f.kind);
            t.push_str(&f.lines);
        }
        t
    }
}

/// The exposition text.
pub fn render(s: &Snapshot) -> String {
    let mut o = Out::default();
    // Figures derived from the declared ones, under the names Prometheus's
    // client libraries use.
    let srv = &s.server;
    o.one(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        format!("{:.3}", srv.time_unix - srv.uptime_secs),
    );
    o.one(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        format!("{:.2}", srv.cpu_user_secs + srv.cpu_system_secs),
    );
    o.one(
        "portico_processes",
        "gauge",
        "Worker processes whose figures are summed here (1: a single process, or ?worker=I).",
        s.processes.iter().filter(|p| p.counted).count().max(1),
    );
    if let Some(c) = &s.cache {
        o.one(
            "portico_cache_hit_ratio",
            "gauge",
            "Hits / lookups since start (0..1).",
            format!("{:.4}", c.hit_ratio() / 100.0),
        );
    }
    o.section(s, &[]);
    o.text()
}

#[cfg(test)]
// Synthetic snapshots read best set field by field.
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use crate::stats::snapshot::CacheInfo;

    #[test]
    fn histograms_are_cumulative_and_counters_end_in_total() {
        let mut s = Snapshot::default();
        s.requests.response_time = HistSnapshot::from_values(&[3, 1500, 2_000_000]);
        s.cache = Some(CacheInfo {
            lookups: 15,
            hits: 10,
            ..Default::default()
        });
        let t = render(&s);
        assert!(
            t.contains("portico_response_seconds_bucket{le=\"0.000004\"} 1\n"),
            "{t}"
        );
        assert!(t.contains("portico_response_seconds_bucket{le=\"0.002048\"} 2\n"));
        assert!(t.contains("portico_response_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(t.contains("portico_response_seconds_count 3\n"));
        assert!(t.contains("portico_cache_hit_ratio 0.6667\n"));
        for line in t.lines().filter(|l| l.starts_with("# TYPE") && l.ends_with(" counter")) {
            assert!(line.contains("_total "), "{line}");
        }
    }
}
