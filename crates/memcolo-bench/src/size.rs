//! Byte sizes on the command line: `4GiB`, `512MiB`, `1.5G`, `1073741824`.
//!
//! Units are binary (KiB = 1024 bytes); `K`, `M`, `G`, `T` are accepted as their binary
//! forms, as `free`, `stress-ng` and cgroup files do.

use crate::error::{BenchError, Result};

const UNITS: &[(&str, u64)] = &[
    ("tib", 1 << 40),
    ("gib", 1 << 30),
    ("mib", 1 << 20),
    ("kib", 1 << 10),
    ("tb", 1 << 40),
    ("gb", 1 << 30),
    ("mb", 1 << 20),
    ("kb", 1 << 10),
    ("t", 1 << 40),
    ("g", 1 << 30),
    ("m", 1 << 20),
    ("k", 1 << 10),
    ("b", 1),
];

/// Parses a size in bytes. Fractions are allowed with a unit (`1.5GiB`) and rounded
/// down to a whole byte.
pub fn parse_bytes(text: &str) -> Result<u64> {
    let s = text.trim().to_ascii_lowercase();
    let (num, mult) = UNITS
        .iter()
        .find_map(|(u, m)| s.strip_suffix(u).map(|n| (n.trim(), *m)))
        .unwrap_or((s.as_str(), 1));
    if num.is_empty() {
        return Err(BenchError::BadSize(text.to_string()));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| BenchError::BadSize(text.to_string()));
    }
    match num.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 && f * (mult as f64) < u64::MAX as f64 => {
            Ok((f * mult as f64) as u64)
        }
        _ => Err(BenchError::BadSize(text.to_string())),
    }
}

/// `clap` value parser for byte sizes.
pub fn parse_bytes_arg(text: &str) -> std::result::Result<u64, String> {
    parse_bytes(text).map_err(|e| e.to_string())
}

/// Formats bytes with the largest binary unit that keeps at least 1 (`4.00 GiB`).
pub fn format_bytes(bytes: u64) -> String {
    const STEPS: &[(&str, u64)] = &[("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, m) in STEPS {
        if bytes >= *m {
            return format!("{:.2} {name}", bytes as f64 / *m as f64);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("4G").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes(" 1.5 GiB ").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("1073741824").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("8k").unwrap(), 8192);
        assert_eq!(parse_bytes("100b").unwrap(), 100);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "GiB",
            "-1GiB",
            "four",
            "1.2.3M",
            "99999999999999999999T",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(4 << 30), "4.00 GiB");
        assert_eq!(format_bytes(1536 << 10), "1.50 MiB");
        assert_eq!(format_bytes(12), "12 B");
    }
}
