//! The JSON-lines event log: one object per line for every decision the agent
//! carries out (registration, notification, reclaim report, file-cache advice, kill),
//! with an RFC 3339 UTC timestamp `ts` and a kind `event`.
//!
//! A write failure (a full disk, a removed file) is reported once through `tracing`
//! and never stops the agent; writing resumes when the file accepts data again.

use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

enum Sink {
    Off,
    Stderr,
    File { path: PathBuf, file: File },
}

/// Where events go.
pub struct EventLog {
    sink: Sink,
    failing: bool,
}

impl EventLog {
    /// `"off"`, `"-"` (stderr) or a file path (appended to, created if missing).
    pub fn open(spec: &str) -> std::io::Result<EventLog> {
        let sink = match spec {
            "off" | "" => Sink::Off,
            "-" => Sink::Stderr,
            p => {
                let path = PathBuf::from(p);
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)?;
                }
                let file = OpenOptions::new().create(true).append(true).open(&path)?;
                Sink::File { path, file }
            }
        };
        Ok(EventLog {
            sink,
            failing: false,
        })
    }

    /// A log that drops everything.
    pub fn off() -> EventLog {
        EventLog {
            sink: Sink::Off,
            failing: false,
        }
    }

    /// Records one event: `fields` (a JSON object) gets `ts` and `event` added.
    pub fn record(&mut self, event: &str, fields: Value) {
        tracing::info!(event, %fields, "memcolo event");
        let mut obj = match fields {
            Value::Object(m) => m,
            other => {
                let mut m = serde_json::Map::new();
                m.insert("detail".into(), other);
                m
            }
        };
        obj.insert(
            "ts".into(),
            json!(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        );
        obj.insert("event".into(), json!(event));
        let mut line = Value::Object(obj).to_string();
        line.push('\n');
        let res = match &mut self.sink {
            Sink::Off => Ok(()),
            Sink::Stderr => std::io::stderr().write_all(line.as_bytes()),
            Sink::File { file, .. } => file.write_all(line.as_bytes()),
        };
        match res {
            Ok(()) => self.failing = false,
            Err(e) if !self.failing => {
                self.failing = true;
                let path = match &self.sink {
                    Sink::File { path, .. } => path.display().to_string(),
                    _ => "stderr".into(),
                };
                tracing::warn!(%path, error = %e, "event log write failed; events are dropped until it recovers");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_json_lines_with_ts_and_kind() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/events.jsonl");
        let mut log = EventLog::open(p.to_str().unwrap()).unwrap();
        log.record("kill", json!({"pid": 5, "reason": "above top"}));
        log.record("signal", json!({"pid": 6}));
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["event"], "kill");
        assert_eq!(lines[0]["pid"], 5);
        assert!(lines[1]["ts"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn a_full_disk_does_not_panic() {
        // /dev/full fails every write with ENOSPC.
        if let Ok(mut log) = EventLog::open("/dev/full") {
            log.record("x", json!({}));
            log.record("y", json!({}));
            assert!(log.failing);
        }
    }
}
