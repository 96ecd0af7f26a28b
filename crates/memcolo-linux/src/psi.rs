//! Pressure stall information (PSI): the text of `/proc/pressure/<resource>` and of a
//! cgroup v2 group's `memory.pressure`.
//!
//! Format (Documentation/accounting/psi.rst):
//!
//! ```text
//! some avg10=0.00 avg60=0.00 avg300=0.00 total=0
//! full avg10=0.00 avg60=0.00 avg300=0.00 total=0
//! ```
//!
//! `avg*` are the percentages of wall time in which some (or all non-idle) tasks were
//! stalled on the resource, averaged over 10 s, 60 s and 300 s; `total` is the
//! cumulative stall time in microseconds. The `full` line is absent on kernels older
//! than 5.13 for `cpu`, so it is optional.

use crate::error::{Error, Result};
use serde::Serialize;
use std::path::Path;

/// One line of a PSI file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PsiLine {
    /// Share of wall time stalled over the last 10 s, in percent (0.0..=100.0).
    pub avg10: f64,
    /// Share of wall time stalled over the last 60 s, in percent.
    pub avg60: f64,
    /// Share of wall time stalled over the last 300 s, in percent.
    pub avg300: f64,
    /// Cumulative stall time since boot (or cgroup creation), in microseconds.
    pub total_us: u64,
}

/// A whole PSI file: the `some` line and, when present, the `full` line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Psi {
    /// At least one task stalled.
    pub some: PsiLine,
    /// All non-idle tasks stalled at once (absent for `cpu` on older kernels).
    pub full: Option<PsiLine>,
}

impl Psi {
    /// Parses PSI text; `path` is only used to name the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Psi> {
        let mut some = None;
        let mut full = None;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mut words = line.split_whitespace();
            let kind = words.next().unwrap_or_default();
            let parsed = parse_line(words, path, line)?;
            match kind {
                "some" => some = Some(parsed),
                "full" => full = Some(parsed),
                other => {
                    return Err(Error::parse(
                        path,
                        format!("unknown PSI line kind `{other}` in `{line}`"),
                    ))
                }
            }
        }
        let some = some.ok_or_else(|| Error::parse(path, "no `some` line"))?;
        Ok(Psi { some, full })
    }

    /// Reads and parses a PSI file.
    pub fn read(path: &Path) -> Result<Psi> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Psi::parse(&text, path)
    }
}

fn parse_line<'a>(
    words: impl Iterator<Item = &'a str>,
    path: &Path,
    line: &str,
) -> Result<PsiLine> {
    let (mut avg10, mut avg60, mut avg300, mut total) = (None, None, None, None);
    for word in words {
        let (key, value) = word.split_once('=').ok_or_else(|| {
            Error::parse(
                path,
                format!("expected key=value, got `{word}` in `{line}`"),
            )
        })?;
        let bad = || Error::parse(path, format!("bad value for {key}: `{value}` in `{line}`"));
        match key {
            "avg10" => avg10 = Some(value.parse::<f64>().map_err(|_| bad())?),
            "avg60" => avg60 = Some(value.parse::<f64>().map_err(|_| bad())?),
            "avg300" => avg300 = Some(value.parse::<f64>().map_err(|_| bad())?),
            "total" => total = Some(value.parse::<u64>().map_err(|_| bad())?),
            // Unknown keys are tolerated so that a future kernel field does not break us.
            _ => {}
        }
    }
    let missing = |k: &str| Error::parse(path, format!("missing {k} in `{line}`"));
    Ok(PsiLine {
        avg10: avg10.ok_or_else(|| missing("avg10"))?,
        avg60: avg60.ok_or_else(|| missing("avg60"))?,
        avg300: avg300.ok_or_else(|| missing("avg300"))?,
        total_us: total.ok_or_else(|| missing("total"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_some_and_full() {
        let text = "some avg10=2.85 avg60=2.64 avg300=1.99 total=9566251\n\
                    full avg10=0.50 avg60=0.25 avg300=0.00 total=120\n";
        let psi = Psi::parse(text, Path::new("/proc/pressure/cpu")).unwrap();
        assert_eq!(psi.some.avg10, 2.85);
        assert_eq!(psi.some.avg60, 2.64);
        assert_eq!(psi.some.avg300, 1.99);
        assert_eq!(psi.some.total_us, 9_566_251);
        let full = psi.full.unwrap();
        assert_eq!(full.avg10, 0.5);
        assert_eq!(full.total_us, 120);
    }

    #[test]
    fn full_line_is_optional() {
        let psi = Psi::parse(
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n",
            Path::new("/proc/pressure/cpu"),
        )
        .unwrap();
        assert_eq!(psi.some.total_us, 7);
        assert!(psi.full.is_none());
    }

    #[test]
    fn malformed_text_names_the_path() {
        let p = Path::new("/fake/memory.pressure");
        for text in [
            "",
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
            "some avg10=x avg60=0.00 avg300=0.00 total=0\n",
            "some avg10=0.00 avg60=0.00 avg300=0.00\n",
            "some avg10 avg60=0.00 avg300=0.00 total=0\n",
            "most avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        ] {
            let err = Psi::parse(text, p).unwrap_err();
            assert!(matches!(err, Error::Parse { .. }), "{text:?} -> {err}");
            assert!(err.to_string().contains("/fake/memory.pressure"));
        }
    }
}
