//! Sizes (`"256MiB"`) and durations (`"15s"`) as they are written in the
//! config file, with serde support in both directions so `--print-config`
//! prints what an operator would write.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// A byte count written with an optional unit: `4096`, `"8KiB"`, `"256MiB"`,
/// `"1GiB"`, `"10MB"`. Decimal units (kB, MB, GB) are powers of 1000, binary
/// units (KiB, MiB, GiB, TiB) powers of 1024.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl Size {
    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }

    /// The size in bytes as `usize`, saturating on 32-bit targets.
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }

    /// Parses `"8KiB"`, `"1 GiB"`, `"512"`, `"10MB"`.
    pub fn parse(text: &str) -> Result<Size, String> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(format!(
                "invalid size {text:?}: expected a number with an optional unit such as \"64KiB\""
            ));
        }
        let n: u64 = num
            .parse()
            .map_err(|_| format!("invalid size {text:?}: number too large"))?;
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "k" | "kB" | "KB" => 1000,
            "M" | "MB" => 1000 * 1000,
            "G" | "GB" => 1000 * 1000 * 1000,
            "T" | "TB" => 1000 * 1000 * 1000 * 1000,
            "K" | "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            other => {
                return Err(format!(
                    "invalid size {text:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)"
                ));
            }
        };
        n.checked_mul(mult)
            .map(Size)
            .ok_or_else(|| format!("invalid size {text:?}: too large"))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        for (mult, name) in UNITS {
            if self.0 >= mult && self.0.is_multiple_of(mult) {
                return write!(f, "{}{}", self.0 / mult, name);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"64KiB\" or a number of bytes")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Size, E> {
                Size::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration written with a unit: `"15s"`, `"500ms"`, `"5m"`, `"1h 30m"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl Dur {
    /// Shorthand for a whole number of seconds.
    pub const fn secs(s: u64) -> Dur {
        Dur(Duration::from_secs(s))
    }

    /// The wrapped duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(text.trim()).map(Dur).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {text:?}: {e} (write e.g. \"15s\", \"500ms\", \"5m\")"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(Size::parse("512").unwrap(), Size(512));
        assert_eq!(Size::parse("8KiB").unwrap(), Size(8192));
        assert_eq!(Size::parse("1 GiB").unwrap(), Size(1 << 30));
        assert_eq!(Size::parse("10MB").unwrap(), Size(10_000_000));
        assert!(Size::parse("10 parsecs").unwrap_err().contains("unknown unit"));
        assert!(Size::parse("MiB").is_err());
        assert!(Size::parse("99999999999TiB").is_err());
    }

    #[test]
    fn sizes_print_in_largest_exact_unit() {
        assert_eq!(Size(256 << 20).to_string(), "256MiB");
        assert_eq!(Size(1500).to_string(), "1500B");
        assert_eq!(Size(3 << 10).to_string(), "3KiB");
    }

    #[test]
    fn durations_round_trip() {
        let d: Dur = toml::from_str::<toml::Value>("d = \"15s\"").unwrap()["d"]
            .clone()
            .try_into()
            .unwrap();
        assert_eq!(d, Dur::secs(15));
        assert_eq!(Dur::secs(300).to_string(), "5m");
    }
}
