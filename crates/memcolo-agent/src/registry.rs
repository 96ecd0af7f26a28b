//! The registry of managed processes, and its persistence across agent restarts.
//!
//! A registration is keyed by pid and pinned to the process's start time
//! (`/proc/PID/stat` field 22, clock ticks since boot), so a reused pid is never
//! mistaken for the registered process. The registry is written atomically
//! (temporary file + rename) to `<state_dir>/registry.json` on every change; at start
//! the agent reloads it and keeps only the entries whose process still runs with the
//! same start time.

use memcolo_policy::{Class, Pid};
use memcolo_proto::NotifyMode;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One registered process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub pid: Pid,
    pub class: Class,
    pub name: String,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub starttime_ticks: u64,
    /// Expected reclamation given at registration, in bytes (M3 §5.1).
    pub expected_reclaim_bytes: Option<u64>,
    pub notify: NotifyMode,
    /// Wall-clock registration time, seconds since the Unix epoch.
    pub registered_unix_s: u64,
    /// Notifications sent to this process.
    #[serde(default)]
    pub signals_sent: u64,
    /// Bytes this process reported reclaimed.
    #[serde(default)]
    pub reclaimed_bytes: u64,
    /// Reclaim answers that reported a failed handler.
    #[serde(default)]
    pub failed_reclaims: u64,
    /// The registered process's credentials when it registered; an action finds the
    /// process again only with these (a change of credentials ends the registration).
    /// Absent in registries saved before it was recorded: the process's credentials
    /// at restore are adopted then.
    #[serde(default)]
    pub creds: Option<memcolo_linux::identity::Credentials>,
    /// The connection notifications go to (notify = socket); not persisted: a process
    /// re-registers when it reconnects.
    #[serde(skip)]
    pub conn: Option<u64>,
}

/// Errors of loading or saving the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot write registry {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read registry {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("registry {path} is malformed: {source}")]
    Malformed {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

#[derive(Serialize, Deserialize)]
struct OnDisk {
    version: u32,
    entries: Vec<Entry>,
    #[serde(default)]
    monitor: Option<memcolo_policy::m3::MonitorState>,
}

/// The registered processes.
#[derive(Debug, Default)]
pub struct Registry {
    entries: BTreeMap<Pid, Entry>,
}

impl Registry {
    pub fn get(&self, pid: Pid) -> Option<&Entry> {
        self.entries.get(&pid)
    }
    pub fn get_mut(&mut self, pid: Pid) -> Option<&mut Entry> {
        self.entries.get_mut(&pid)
    }
    /// Adds or replaces a registration; returns the previous one.
    pub fn insert(&mut self, e: Entry) -> Option<Entry> {
        self.entries.insert(e.pid, e)
    }
    pub fn remove(&mut self, pid: Pid) -> Option<Entry> {
        self.entries.remove(&pid)
    }
    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Entry> {
        self.entries.values_mut()
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Detaches every registration bound to connection `conn` (it closed).
    pub fn detach_conn(&mut self, conn: u64) {
        for e in self.entries.values_mut() {
            if e.conn == Some(conn) {
                e.conn = None;
            }
        }
    }
}

/// Where the registry lives under a state directory.
pub fn registry_path(state_dir: &Path) -> PathBuf {
    state_dir.join("registry.json")
}

/// Saves the registry and the monitor state atomically.
pub fn save(
    path: &Path,
    reg: &Registry,
    monitor: Option<memcolo_policy::m3::MonitorState>,
) -> Result<(), RegistryError> {
    let werr = |source| RegistryError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(werr)?;
    let body = OnDisk {
        version: 1,
        entries: reg.iter().cloned().collect(),
        monitor,
    };
    let json = serde_json::to_vec_pretty(&body).expect("registry serializes");
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp).map_err(werr)?;
    f.write_all(&json).map_err(werr)?;
    f.sync_all().map_err(werr)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(werr)
}

/// Loads a saved registry. A missing file is an empty registry.
pub fn load(
    path: &Path,
) -> Result<(Registry, Option<memcolo_policy::m3::MonitorState>), RegistryError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((Registry::default(), None))
        }
        Err(source) => {
            return Err(RegistryError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let d: OnDisk = serde_json::from_slice(&bytes).map_err(|source| RegistryError::Malformed {
        path: path.to_path_buf(),
        source,
    })?;
    let mut reg = Registry::default();
    for e in d.entries {
        reg.insert(e);
    }
    Ok((reg, d.monitor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: Pid) -> Entry {
        Entry {
            pid,
            class: Class::Be,
            name: format!("p{pid}"),
            starttime_ticks: 42,
            expected_reclaim_bytes: Some(7),
            notify: NotifyMode::Signal,
            registered_unix_s: 1,
            signals_sent: 3,
            reclaimed_bytes: 9,
            failed_reclaims: 0,
            creds: None,
            conn: Some(5),
        }
    }

    #[test]
    fn save_load_round_trip_drops_connections() {
        let dir = tempfile::tempdir().unwrap();
        let p = registry_path(dir.path());
        let mut r = Registry::default();
        r.insert(entry(10));
        r.insert(entry(11));
        save(&p, &r, None).unwrap();
        let (back, mon) = load(&p).unwrap();
        assert!(mon.is_none());
        assert_eq!(back.len(), 2);
        let e = back.get(10).unwrap();
        assert_eq!(e.conn, None);
        assert_eq!(e.signals_sent, 3);
        assert_eq!(e.class, Class::Be);
    }

    #[test]
    fn missing_file_is_empty_and_garbage_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let p = registry_path(dir.path());
        assert!(load(&p).unwrap().0.is_empty());
        std::fs::write(&p, b"{not json").unwrap();
        let err = load(&p).unwrap_err().to_string();
        assert!(err.contains("registry.json"), "{err}");
    }

    #[test]
    fn detach_conn_only_touches_that_connection() {
        let mut r = Registry::default();
        r.insert(entry(1));
        let mut e = entry(2);
        e.conn = Some(6);
        r.insert(e);
        r.detach_conn(5);
        assert_eq!(r.get(1).unwrap().conn, None);
        assert_eq!(r.get(2).unwrap().conn, Some(6));
    }
}
