//! Sizes (`"256MiB"`) and durations (`"15s"`) as they are written in the
//! config file, with serde support in both directions so `--print-config`
//! prints what an operator would write.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// A byte count written with an optional unit: `4096`, `"16m"`, `"8KiB"`,
/// `"256MiB"`, `"1g"`. Every unit is a power of 1024: the single letters
/// `k`, `m`, `g`, `t` in either case as nginx (`client_max_body_size 16m`)
/// and Squid (`16 M`) read them, and the IEC names `KiB`, `MiB`, `GiB`, `TiB`.
/// The two-letter forms `kB`, `MB`, `GB`, `TB` are refused: Squid reads
/// `MB` as 1024×1024 bytes and SI as 1000×1000, and a cache sized 5% off
/// from what its admin meant is worse than an error naming the alternatives.
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

    /// Parses `"512"`, `"16m"`, `"16M"`, `"8KiB"`, `"1 GiB"`; refuses the
    /// ambiguous `"10MB"` with a message that shows both readings.
    pub fn parse(text: &str) -> Result<Size, String> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(format!(
                "invalid size {text:?}: expected a number with an optional unit such as \"16m\" or \"64KiB\""
            ));
        }
        let n: u64 = num
            .parse()
            .map_err(|_| format!("invalid size {text:?}: number too large"))?;
        let unit = unit.trim();
        let shift = match unit {
            "" | "B" | "b" => 0,
            "k" | "K" | "KiB" => 10,
            "m" | "M" | "MiB" => 20,
            "g" | "G" | "GiB" => 30,
            "t" | "T" | "TiB" => 40,
            other => return Err(unit_error(text, n, other)),
        };
        n.checked_mul(1u64 << shift)
            .map(Size)
            .ok_or_else(|| format!("invalid size {text:?}: too large"))
    }
}

/// The message for a unit `parse` does not take. A decimal-looking unit
/// (`MB`, `kb`, `Gb`, ...) gets both of its readings spelled out in bytes, so
/// the admin picks one without looking anything up.
fn unit_error(text: &str, n: u64, unit: &str) -> String {
    let lower = unit.to_ascii_lowercase();
    let power = match lower.as_str() {
        "kb" => Some(1),
        "mb" => Some(2),
        "gb" => Some(3),
        "tb" => Some(4),
        _ => None,
    };
    let Some(power) = power else {
        return format!(
            "invalid size {text:?}: unknown unit {unit:?} (use k, m, g or t, or KiB, MiB, GiB or TiB, all powers of 1024, or no unit for bytes)"
        );
    };
    let letter = &lower[..1];
    let iec = ["KiB", "MiB", "GiB", "TiB"][power - 1];
    let binary = n.checked_mul(1u64 << (10 * power as u32));
    let decimal = n.checked_mul(1000u64.pow(power as u32));
    match (binary, decimal) {
        (Some(b), Some(d)) => format!(
            "invalid size {text:?}: {unit:?} is ambiguous (Squid reads it as a power of 1024, SI as a power of 1000): write \"{n}{letter}\" or \"{n}{iec}\" for {b} bytes (the nginx and Squid reading), or {d} for {d} bytes (the SI reading)"
        ),
        _ => format!(
            "invalid size {text:?}: {unit:?} is ambiguous (Squid reads it as a power of 1024, SI as a power of 1000), and the number is too large either way"
        ),
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
        assert_eq!(Size::parse("512B").unwrap(), Size(512));
        assert_eq!(Size::parse("8KiB").unwrap(), Size(8192));
        assert_eq!(Size::parse("1 GiB").unwrap(), Size(1 << 30));
        assert!(Size::parse("10 parsecs").unwrap_err().contains("unknown unit"));
        assert!(Size::parse("MiB").is_err());
        assert!(Size::parse("99999999999TiB").is_err());
        assert!(Size::parse("1.5GiB").is_err());
    }

    #[test]
    fn single_letter_units_are_powers_of_1024_in_either_case_as_nginx_and_squid_read_them() {
        for (text, bytes) in [
            ("16k", 16u64 << 10),
            ("16K", 16 << 10),
            ("16m", 16 << 20),
            ("16M", 16 << 20),
            ("16 M", 16 << 20),
            ("2g", 2 << 30),
            ("2G", 2 << 30),
            ("1t", 1 << 40),
            ("1T", 1 << 40),
        ] {
            assert_eq!(Size::parse(text), Ok(Size(bytes)), "{text}");
        }
        assert_eq!(Size::parse("16m"), Size::parse("16MiB"));
    }

    #[test]
    fn two_letter_decimal_looking_units_are_refused_with_both_readings() {
        let e = Size::parse("16MB").unwrap_err();
        assert!(e.contains("ambiguous"), "{e}");
        assert!(e.contains("\"16m\"") && e.contains("\"16MiB\""), "{e}");
        assert!(
            e.contains("16777216 bytes") && e.contains("16000000 for 16000000 bytes (the SI"),
            "{e}"
        );
        for text in ["1kB", "1KB", "1kb", "1Mb", "1mb", "1GB", "1gb", "1TB"] {
            assert!(Size::parse(text).unwrap_err().contains("ambiguous"), "{text}");
        }
        let huge = Size::parse("99999999999TB").unwrap_err();
        assert!(huge.contains("too large"), "{huge}");
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
