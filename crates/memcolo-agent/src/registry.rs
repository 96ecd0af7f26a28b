//! The registry of managed processes, and its persistence across agent restarts.
//!
//! A registration is keyed by pid and pinned to the process's start time
//! (`/proc/PID/stat` field 22, clock ticks since boot), so a reused pid is never
//! mistaken for the registered process.
//!
//! **The state directory** (`state_dir`) belongs to one agent: [`lock_state_dir`]
//! creates it mode 0700 if missing, refuses one that is a symlink, not a directory,
//! not owned by the agent's uid or group/world-writable (another user could plant a
//! registry there), and holds an exclusive `flock(2)` on `<state_dir>/lock` (which
//! names the holder's pid) for the agent's life.
//!
//! **Writing.** [`save`] writes `<state_dir>/registry.json` atomically: a fresh
//! temporary file, `fsync`, `rename(2)`, `fsync` of the directory. The agent marks
//! the state dirty on each change and writes it at most once per
//! [`FLUSH_INTERVAL`] and at shutdown, so a burst of registrations costs a few
//! writes, not one each.
//!
//! **Loading** ([`load`]) trusts nothing in the file. It opens it without following
//! a symlink and without blocking, refuses anything but a regular file of at most
//! [`MAX_REGISTRY_BYTES`], and refuses an unknown `version` (the file is left
//! untouched: a newer agent wrote it). A file that does not parse is moved aside to
//! `registry.json.bad-<unix time>`; entries are checked one by one, and a bad one is
//! dropped while the others are kept; a pid listed twice keeps its most protective
//! class (LC > elastic > BE), so a duplicate never makes an LC process killable.
//! Whenever anything read is dropped, the original bytes are kept aside as well.
//! Every such finding is returned as a [`Problem`] for the agent to log, count and
//! record.

use memcolo_policy::ledger::LevelCounts;
use memcolo_policy::m3::MonitorState;
use memcolo_policy::{Class, Pid};
use memcolo_proto::NotifyMode;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The registry file format this agent reads and writes.
pub const FORMAT_VERSION: u64 = 1;

/// The largest `registry.json` the agent reads (64 MiB; a registry of 100,000
/// processes is about 30 MiB). A larger file is treated as malformed.
pub const MAX_REGISTRY_BYTES: u64 = 64 << 20;

/// How often, at most, the main loop writes a changed state (1 s).
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

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
    /// Notifications sent to this process, every level and channel (socket message
    /// or real-time signal). Registries saved before it was renamed call it
    /// `signals_sent`.
    #[serde(default, alias = "signals_sent")]
    pub notifications_sent: u64,
    /// Notifications sent to this process, by level (absent in older registries:
    /// zero then).
    #[serde(default)]
    pub notified: LevelCounts,
    /// Bytes this process reported reclaimed.
    #[serde(default)]
    pub reclaimed_bytes: u64,
    /// `reclaimed` reports this process sent.
    #[serde(default)]
    pub reclaim_reports: u64,
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
    /// The pod whose process this is, for a registration Kubernetes mode made from
    /// the pod ([`crate::core::Core::sync_pod_registrations`]); absent for one a client
    /// asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

/// The longest process name a registration may carry, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

impl Entry {
    /// Checks what the type does not: a positive pid (a kill of pid 0 or -1 would
    /// reach a whole process group or every process) and a name of at most
    /// [`MAX_NAME_BYTES`] printable characters. Applied to every saved entry.
    pub fn validate(&self) -> Result<(), String> {
        if self.pid <= 0 {
            return Err(format!("invalid pid {}", self.pid));
        }
        if self.name.len() > MAX_NAME_BYTES || self.name.chars().any(char::is_control) {
            return Err(format!(
                "name must be at most {MAX_NAME_BYTES} printable characters"
            ));
        }
        Ok(())
    }
}

/// Errors of loading or saving the registry; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot write registry {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read registry {path}: {source}; it is left as it is")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("registry {path} is not a regular file ({kind}); remove it or move it away")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(
        "registry {path} has format version {version}; this agent reads version {FORMAT_VERSION} \
         (the file is left untouched: start the agent that wrote it, or move the file away)"
    )]
    Version { path: PathBuf, version: u64 },
    #[error("cannot keep malformed registry {path} aside as {to}: {source}")]
    SetAside {
        path: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What [`load`] found wrong and did about it.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// The file did not parse as a registry: it was moved to `to`, and nothing in
    /// it is used.
    Malformed { to: PathBuf, reason: String },
    /// Something was dropped (see the other problems): the original bytes were
    /// copied to `to`.
    Copied { to: PathBuf },
    /// Entry number `index` (from 0) was dropped.
    BadEntry {
        index: usize,
        pid: Option<i64>,
        reason: String,
    },
    /// `pid` was listed more than once; `kept` is its most protective class.
    Duplicate {
        pid: Pid,
        kept: Class,
        dropped: Class,
    },
    /// The saved monitor state was dropped (the configured thresholds apply).
    BadMonitor { reason: String },
}

impl Problem {
    /// The `kind` label of `memcolo_state_load_problems_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::Malformed { .. } => "malformed",
            Problem::Copied { .. } => "copied",
            Problem::BadEntry { .. } => "bad_entry",
            Problem::Duplicate { .. } => "duplicate_pid",
            Problem::BadMonitor { .. } => "bad_monitor",
        }
    }

    /// The event-log record: its kind and fields.
    pub fn event(&self) -> (&'static str, Value) {
        match self {
            Problem::Malformed { to, reason } => (
                "registry_set_aside",
                json!({"moved_to": to, "reason": reason}),
            ),
            Problem::Copied { to } => ("registry_set_aside", json!({"copied_to": to})),
            Problem::BadEntry { index, pid, reason } => (
                "registry_entry_dropped",
                json!({"index": index, "pid": pid, "reason": reason}),
            ),
            Problem::Duplicate { pid, kept, dropped } => (
                "registry_duplicate_pid",
                json!({"pid": pid, "kept": kept, "dropped": dropped}),
            ),
            Problem::BadMonitor { reason } => {
                ("registry_monitor_dropped", json!({"reason": reason}))
            }
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Malformed { to, reason } => write!(
                f,
                "malformed registry ({reason}) moved to {}; starting without it",
                to.display()
            ),
            Problem::Copied { to } => {
                write!(f, "the registry as read is kept in {}", to.display())
            }
            Problem::BadEntry { index, pid, reason } => match pid {
                Some(p) => write!(f, "registry entry {index} (pid {p}) dropped: {reason}"),
                None => write!(f, "registry entry {index} dropped: {reason}"),
            },
            Problem::Duplicate { pid, kept, dropped } => write!(
                f,
                "pid {pid} is listed more than once; kept class {kept}, dropped {dropped}"
            ),
            Problem::BadMonitor { reason } => {
                write!(f, "saved monitor state dropped: {reason}")
            }
        }
    }
}

/// What [`load`] recovered.
#[derive(Debug, Default)]
pub struct Loaded {
    pub registry: Registry,
    pub monitor: Option<MonitorState>,
    /// What was wrong, in the order found; empty for a sound file.
    pub problems: Vec<Problem>,
}

#[derive(Serialize)]
struct OnDisk<'a> {
    version: u64,
    entries: Vec<&'a Entry>,
    monitor: Option<MonitorState>,
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

/// Saves the registry and the monitor state atomically: a fresh `<path>.tmp`
/// (mode 0600, never through a symlink), `fsync`, `rename(2)` over `path`, `fsync`
/// of the directory. Creates the directory (mode 0700) if it is missing.
pub fn save(
    path: &Path,
    reg: &Registry,
    monitor: Option<MonitorState>,
) -> Result<(), RegistryError> {
    let werr = |source| RegistryError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = parent(path);
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(werr)?;
    }
    let body = OnDisk {
        version: FORMAT_VERSION,
        entries: reg.iter().collect(),
        monitor,
    };
    let json = serde_json::to_vec_pretty(&body).expect("registry serializes");
    let tmp = path.with_extension("json.tmp");
    // A leftover temporary file (a crash mid-write) is replaced, never written through.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(werr(e)),
        _ => {}
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(werr)?;
    f.write_all(&json).map_err(werr)?;
    f.sync_all().map_err(werr)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(werr)?;
    sync_dir(dir).map_err(werr)
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// What a non-regular file is, for messages.
fn file_kind(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symlink"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

/// Loads a saved registry; a missing file is an empty registry. See the module
/// documentation for what is refused (an error: the agent does not start, the file
/// is untouched) and what is dropped (a [`Problem`]: the rest is used, the original
/// kept aside).
pub fn load(path: &Path) -> Result<Loaded, RegistryError> {
    let rerr = |source| RegistryError::Read {
        path: path.to_path_buf(),
        source,
    };
    // O_NONBLOCK: opening a FIFO must not wait for a writer.
    let mut f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::default()),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(RegistryError::NotRegular {
                path: path.to_path_buf(),
                kind: "a symlink",
            })
        }
        Err(e) => return Err(rerr(e)),
    };
    let meta = f.metadata().map_err(rerr)?;
    if !meta.file_type().is_file() {
        return Err(RegistryError::NotRegular {
            path: path.to_path_buf(),
            kind: file_kind(meta.file_type()),
        });
    }
    if meta.len() > MAX_REGISTRY_BYTES {
        return set_aside(path, format!("larger than {MAX_REGISTRY_BYTES} bytes"));
    }
    let mut bytes = Vec::new();
    // Bounded again: the file may grow between fstat and read.
    (&mut f)
        .take(MAX_REGISTRY_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(rerr)?;
    let doc = if bytes.len() as u64 > MAX_REGISTRY_BYTES {
        Err(format!("larger than {MAX_REGISTRY_BYTES} bytes"))
    } else {
        serde_json::from_slice::<Value>(&bytes).map_err(|e| e.to_string())
    };
    let mut doc = match doc.and_then(|d| match d {
        Value::Object(m) => Ok(m),
        _ => Err("not a JSON object".to_string()),
    }) {
        Ok(d) => d,
        Err(reason) => return set_aside(path, reason),
    };
    match doc.get("version") {
        Some(v) if v.as_u64() == Some(FORMAT_VERSION) => {}
        Some(v) if v.as_u64().is_some() => {
            return Err(RegistryError::Version {
                path: path.to_path_buf(),
                version: v.as_u64().unwrap_or_default(),
            })
        }
        Some(v) => return set_aside(path, format!("version {v} is not a number")),
        None => return set_aside(path, "no version".into()),
    }
    let entries = match doc.remove("entries") {
        Some(Value::Array(a)) => a,
        Some(_) => return set_aside(path, "entries is not an array".into()),
        None => return set_aside(path, "no entries".into()),
    };
    let mut out = Loaded::default();
    for (index, v) in entries.into_iter().enumerate() {
        let pid = v.get("pid").and_then(Value::as_i64);
        let e = match Entry::deserialize(v)
            .map_err(|e| e.to_string())
            .and_then(|e| e.validate().map(|()| e))
        {
            Ok(e) => e,
            Err(reason) => {
                out.problems.push(Problem::BadEntry { index, pid, reason });
                continue;
            }
        };
        match out.registry.entries.get(&e.pid) {
            None => {
                out.registry.insert(e);
            }
            Some(old) => {
                let (kept, dropped) = if protection(e.class) > protection(old.class) {
                    let dropped = old.class;
                    let kept = e.class;
                    out.registry.insert(e.clone());
                    (kept, dropped)
                } else {
                    (old.class, e.class)
                };
                out.problems.push(Problem::Duplicate {
                    pid: e.pid,
                    kept,
                    dropped,
                });
            }
        }
    }
    match doc.remove("monitor") {
        None | Some(Value::Null) => {}
        Some(m) => match MonitorState::deserialize(m) {
            Ok(m) => out.monitor = Some(m),
            Err(e) => out.problems.push(Problem::BadMonitor {
                reason: e.to_string(),
            }),
        },
    }
    if !out.problems.is_empty() {
        let to = keep_copy(path, &bytes).map_err(|(to, source)| RegistryError::SetAside {
            path: path.to_path_buf(),
            to,
            source,
        })?;
        out.problems.push(Problem::Copied { to });
    }
    Ok(out)
}

/// How strongly a class is protected: a duplicate keeps the highest.
fn protection(c: Class) -> u8 {
    match c {
        Class::Be => 0,
        Class::Elastic => 1,
        Class::Lc => 2,
    }
}

/// A free `registry.json.bad-<unix time>[-n]` beside `path`.
fn aside_path(path: &Path, n: u32) -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".bad-{secs}"));
    if n > 0 {
        name.push(format!("-{n}"));
    }
    path.with_file_name(name)
}

/// The copies of the registry at `path` that were set aside as unparsable or
/// partly bad (`<name>.bad-<unix time>[-n]` beside it), sorted by name (oldest
/// first within a second). An operator keeps or deletes them; the agent never does.
///
/// Errors: the directory of `path` cannot be read.
pub fn set_aside_copies(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut prefix = path.file_name().unwrap_or_default().to_os_string();
    prefix.push(".bad-");
    let prefix = prefix.to_string_lossy().into_owned();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            v.push(e.path());
        }
    }
    v.sort();
    Ok(v)
}

/// Moves an unparsable registry aside (never over an existing file).
fn set_aside(path: &Path, reason: String) -> Result<Loaded, RegistryError> {
    let mut n = 0;
    let to = loop {
        let to = aside_path(path, n);
        // link + unlink: unlike rename, link never replaces an existing file.
        match std::fs::hard_link(path, &to) {
            Ok(()) => break to,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(source) => {
                return Err(RegistryError::SetAside {
                    path: path.to_path_buf(),
                    to,
                    source,
                })
            }
        }
    };
    let serr = |source| RegistryError::SetAside {
        path: path.to_path_buf(),
        to: to.clone(),
        source,
    };
    std::fs::remove_file(path).map_err(serr)?;
    sync_dir(parent(path)).map_err(serr)?;
    Ok(Loaded {
        problems: vec![Problem::Malformed { to, reason }],
        ..Loaded::default()
    })
}

/// Writes `bytes` (the registry as read) to a new file aside.
fn keep_copy(path: &Path, bytes: &[u8]) -> Result<PathBuf, (PathBuf, std::io::Error)> {
    let mut n = 0;
    loop {
        let to = aside_path(path, n);
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&to);
        match f {
            Ok(mut f) => {
                let r = f
                    .write_all(bytes)
                    .and_then(|()| f.sync_all())
                    .and_then(|()| sync_dir(parent(path)));
                return r.map(|()| to.clone()).map_err(|e| (to, e));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => return Err((to, e)),
        }
    }
}

/// Why a state directory is refused.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    #[error("state directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state directory {path} is a symlink; give the real directory")]
    Symlink { path: PathBuf },
    #[error("state directory {path} is not a directory")]
    NotDir { path: PathBuf },
    #[error(
        "state directory {path} is owned by uid {uid}, not by the agent's uid {agent_uid}; \
         another user could plant a registry there"
    )]
    Owner {
        path: PathBuf,
        uid: u32,
        agent_uid: u32,
    },
    #[error(
        "state directory {path} is group- or world-writable (mode {mode:o}); \
         another user could plant a registry there: make it mode 0700"
    )]
    Writable { path: PathBuf, mode: u32 },
    #[error("state directory {path} is in use by another agent{}; one agent per state directory",
        holder.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Locked { path: PathBuf, holder: Option<i32> },
}

/// The exclusive lock on a state directory; released when dropped (or when the
/// agent dies: the kernel drops a `flock(2)` with its last descriptor).
#[derive(Debug)]
pub struct StateDirLock {
    _file: File,
}

/// Prepares and locks `dir` for this agent (see the module documentation): creates
/// it mode 0700 if missing, refuses a symlink, a non-directory, a directory of
/// another uid or a group/world-writable one, and takes `flock(LOCK_EX|LOCK_NB)`
/// on `<dir>/lock` (opened `O_NOFOLLOW|O_CLOEXEC`), writing this process's pid
/// into it. A lock held by another agent is [`StateDirError::Locked`], naming its
/// pid.
pub fn lock_state_dir(dir: &Path) -> Result<StateDirLock, StateDirError> {
    let io = |source| StateDirError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io)?;
            std::fs::symlink_metadata(dir).map_err(io)?
        }
        Err(e) => return Err(io(e)),
    };
    if meta.file_type().is_symlink() {
        return Err(StateDirError::Symlink {
            path: dir.to_path_buf(),
        });
    }
    if !meta.is_dir() {
        return Err(StateDirError::NotDir {
            path: dir.to_path_buf(),
        });
    }
    // SAFETY: geteuid has no preconditions.
    let agent_uid = unsafe { libc::geteuid() };
    if meta.uid() != agent_uid {
        return Err(StateDirError::Owner {
            path: dir.to_path_buf(),
            uid: meta.uid(),
            agent_uid,
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(StateDirError::Writable {
            path: dir.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    let lock_path = dir.join("lock");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&lock_path)
        .map_err(|source| StateDirError::Io {
            path: lock_path.clone(),
            source,
        })?;
    let lerr = |source| StateDirError::Io {
        path: lock_path.clone(),
        source,
    };
    if !file.metadata().map_err(lerr)?.is_file() {
        return Err(lerr(std::io::Error::other(
            "the lock is not a regular file",
        )));
    }
    use std::os::fd::AsRawFd;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut text = String::new();
            let _ = (&mut file).take(64).read_to_string(&mut text);
            return Err(StateDirError::Locked {
                path: dir.to_path_buf(),
                holder: text.trim().parse().ok(),
            });
        }
        return Err(lerr(e));
    }
    file.set_len(0).map_err(lerr)?;
    file.rewind().map_err(lerr)?;
    writeln!(file, "{}", std::process::id()).map_err(lerr)?;
    Ok(StateDirLock { _file: file })
}

/// Whether a process runs as the same user as a registered job: the same real and
/// effective uid and gid, and no capability the job did not have.
pub(crate) fn same_user(
    c: &memcolo_linux::identity::Credentials,
    job: &memcolo_linux::identity::Credentials,
) -> bool {
    c.ruid() == job.ruid()
        && c.euid() == job.euid()
        && c.gids[0] == job.gids[0]
        && c.egid() == job.egid()
        && c.cap_eff & !job.cap_eff == 0
        && c.cap_prm & !job.cap_prm == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn entry(pid: Pid) -> Entry {
        Entry {
            pid,
            class: Class::Be,
            name: format!("p{pid}"),
            starttime_ticks: 42,
            expected_reclaim_bytes: Some(7),
            notify: NotifyMode::Signal,
            registered_unix_s: 1,
            notifications_sent: 3,
            notified: LevelCounts {
                low: 2,
                high: 1,
                top: 0,
            },
            reclaimed_bytes: 9,
            reclaim_reports: 2,
            failed_reclaims: 0,
            creds: None,
            conn: Some(5),
            pod_uid: None,
        }
    }

    fn entry_json(pid: i64, class: &str) -> Value {
        json!({"pid": pid, "class": class, "name": format!("p{pid}"), "starttime_ticks": 42,
               "expected_reclaim_bytes": null, "notify": "none", "registered_unix_s": 1})
    }

    /// The files beside the registry whose names start with `registry.json.bad-`.
    fn aside(dir: &Path) -> Vec<PathBuf> {
        set_aside_copies(&registry_path(dir)).unwrap()
    }

    #[test]
    fn save_load_round_trip_drops_connections() {
        let dir = tempfile::tempdir().unwrap();
        let p = registry_path(dir.path());
        let mut r = Registry::default();
        r.insert(entry(10));
        r.insert(entry(11));
        save(&p, &r, None).unwrap();
        let back = load(&p).unwrap();
        assert!(back.monitor.is_none());
        assert!(back.problems.is_empty(), "{:?}", back.problems);
        assert_eq!(back.registry.len(), 2);
        let e = back.registry.get(10).unwrap();
        assert_eq!(e.conn, None);
        assert_eq!(e.notifications_sent, 3);
        assert_eq!(e.notified.total(), 3);
        assert_eq!(e.reclaim_reports, 2);
        assert_eq!(e.class, Class::Be);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_missing_file_is_an_empty_registry() {
        let dir = tempfile::tempdir().unwrap();
        let l = load(&registry_path(dir.path())).unwrap();
        assert!(l.registry.is_empty() && l.problems.is_empty());
    }

    #[test]
    fn an_unparsable_file_is_moved_aside_and_nothing_is_used() {
        for bad in [
            &b"{not json"[..],
            b"[1, 2]",
            b"{\"version\": \"1\", \"entries\": []}",
            b"{\"version\": 1, \"entries\": {}}",
            b"{\"entries\": []}",
        ] {
            let dir = tempfile::tempdir().unwrap();
            let p = registry_path(dir.path());
            std::fs::write(&p, bad).unwrap();
            let l = load(&p).unwrap();
            assert!(l.registry.is_empty());
            let moved = aside(dir.path());
            assert_eq!(moved.len(), 1);
            assert_eq!(std::fs::read(&moved[0]).unwrap(), bad);
            assert!(!p.exists(), "moved, not copied");
            match &l.problems[..] {
                [Problem::Malformed { to, .. }] => assert_eq!(to, &moved[0]),
                other => panic!("{other:?}"),
            }
            // A second bad file the same second does not replace the first.
            std::fs::write(&p, b"again").unwrap();
            load(&p).unwrap();
            assert_eq!(aside(dir.path()).len(), 2);
        }
    }

    #[test]
    fn a_bad_entry_is_dropped_the_rest_kept_and_the_original_copied_aside() {
        let dir = tempfile::tempdir().unwrap();
        let p = registry_path(dir.path());
        let mut mistyped = entry_json(11, "be");
        mistyped["starttime_ticks"] = json!("soon");
        let mut long_name = entry_json(13, "be");
        long_name["name"] = json!("x".repeat(MAX_NAME_BYTES + 1));
        let doc = json!({"version": 1, "entries": [
            entry_json(10, "lc"), mistyped, entry_json(0, "be"), entry_json(-1, "be"),
            long_name, json!("not an entry"), entry_json(12, "elastic"),
        ], "future_field": true});
        let bytes = serde_json::to_vec(&doc).unwrap();
        std::fs::write(&p, &bytes).unwrap();
        let l = load(&p).unwrap();
        let pids: Vec<Pid> = l.registry.iter().map(|e| e.pid).collect();
        assert_eq!(pids, vec![10, 12]);
        let dropped: Vec<(usize, Option<i64>)> = l
            .problems
            .iter()
            .filter_map(|p| match p {
                Problem::BadEntry { index, pid, .. } => Some((*index, *pid)),
                _ => None,
            })
            .collect();
        assert_eq!(
            dropped,
            vec![
                (1, Some(11)),
                (2, Some(0)),
                (3, Some(-1)),
                (4, Some(13)),
                (5, None)
            ]
        );
        // The file itself stays (the agent rewrites it); the original is copied aside.
        assert_eq!(std::fs::read(&p).unwrap(), bytes);
        let copies = aside(dir.path());
        assert_eq!(copies.len(), 1);
        assert_eq!(std::fs::read(&copies[0]).unwrap(), bytes);
        assert_eq!(
            l.problems.last(),
            Some(&Problem::Copied {
                to: copies[0].clone()
            })
        );
    }

    #[test]
    fn entries_with_fields_this_agent_does_not_know_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = registry_path(dir.path());
        let mut e = entry_json(10, "lc");
        e["uid"] = json!(1000);
        std::fs::write(
            &p,
            serde_json::to_vec(&json!({"version": 1, "entries": [e]})).unwrap(),
        )
        .unwrap();
        let l = load(&p).unwrap();
        assert_eq!(l.registry.len(), 1);
        assert!(l.problems.is_empty());
    }

    #[test]
    fn a_registry_saved_with_signals_sent_keeps_its_count() {
        let dir = tempfile::tempdir().unwrap();
        let p = registry_path(dir.path());
        let mut e = entry_json(10, "elastic");
        e["signals_sent"] = json!(41);
        std::fs::write(
            &p,
            serde_json::to_vec(&json!({"version": 1, "entries": [e]})).unwrap(),
        )
        .unwrap();
        let l = load(&p).unwrap();
        assert!(l.problems.is_empty(), "{:?}", l.problems);
        let e = l.registry.get(10).unwrap();
        assert_eq!(e.notifications_sent, 41);
        assert_eq!(e.notified, LevelCounts::default());
    }

    #[test]
    fn a_duplicate_pid_keeps_the_most_protective_class_whatever_the_order() {
        for order in [
            ["be", "lc", "elastic"],
            ["lc", "be", "elastic"],
            ["elastic", "be", "lc"],
        ] {
            let dir = tempfile::tempdir().unwrap();
            let p = registry_path(dir.path());
            let entries: Vec<Value> = order.iter().map(|c| entry_json(10, c)).collect();
            std::fs::write(
                &p,
                serde_json::to_vec(&json!({"version": 1, "entries": entries})).unwrap(),
            )
            .unwrap();
            let l = load(&p).unwrap();
            assert_eq!(l.registry.get(10).unwrap().class, Class::Lc, "{order:?}");
            let dups = l
                .problems
                .iter()
                .filter(|p| matches!(p, Problem::Duplicate { pid: 10, .. }))
                .count();
            assert_eq!(dups, 2, "{:?}", l.problems);
            assert_eq!(aside(dir.path()).len(), 1);
        }
    }

    #[test]
    fn a_bad_monitor_state_is_dropped_and_the_entries_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = registry_path(dir.path());
        let doc =
            json!({"version": 1, "entries": [entry_json(10, "lc")], "monitor": {"thresholds": 5}});
        std::fs::write(&p, serde_json::to_vec(&doc).unwrap()).unwrap();
        let l = load(&p).unwrap();
        assert_eq!(l.registry.len(), 1);
        assert!(l.monitor.is_none());
        assert!(matches!(l.problems[0], Problem::BadMonitor { .. }));
    }

    #[test]
    fn an_unknown_version_is_refused_and_the_file_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let p = registry_path(dir.path());
        let bytes = br#"{"version": 99, "entries": [], "new": "layout"}"#;
        std::fs::write(&p, bytes).unwrap();
        let err = load(&p).unwrap_err();
        assert!(matches!(err, RegistryError::Version { version: 99, .. }));
        let msg = err.to_string();
        assert!(
            msg.contains("version 99") && msg.contains("registry.json"),
            "{msg}"
        );
        assert_eq!(std::fs::read(&p).unwrap(), bytes);
        assert!(aside(dir.path()).is_empty());
    }

    #[test]
    fn non_regular_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = registry_path(dir.path());
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = load(&p).unwrap_err();
        assert!(err.to_string().contains("a FIFO"), "{err}");
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        assert!(load(&p).unwrap_err().to_string().contains("a directory"));
        std::fs::remove_dir(&p).unwrap();
        let target = dir.path().join("elsewhere.json");
        std::fs::write(&target, br#"{"version": 1, "entries": []}"#).unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        assert!(load(&p).unwrap_err().to_string().contains("a symlink"));
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
        assert!(matches!(
            load(&p).unwrap_err(),
            RegistryError::NotRegular { .. }
        ));
    }

    #[test]
    fn a_file_over_the_size_bound_is_set_aside_unread() {
        let dir = tempfile::tempdir().unwrap();
        let p = registry_path(dir.path());
        let f = File::create(&p).unwrap();
        // Sparse: the size is there, the disk blocks are not.
        f.set_len(MAX_REGISTRY_BYTES + 1).unwrap();
        let l = load(&p).unwrap();
        assert!(
            matches!(&l.problems[..], [Problem::Malformed { reason, .. }] if reason.contains("larger"))
        );
    }

    #[test]
    fn save_replaces_a_leftover_temporary_file_and_never_follows_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let p = registry_path(dir.path());
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, p.with_extension("json.tmp")).unwrap();
        let mut r = Registry::default();
        r.insert(entry(10));
        save(&p, &r, None).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(load(&p).unwrap().registry.len(), 1);
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

    #[test]
    fn the_state_dir_is_created_private_and_refused_when_others_could_plant_in_it() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("new/state");
        let lock = lock_state_dir(&d).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        drop(lock);

        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(matches!(
            lock_state_dir(&d).unwrap_err(),
            StateDirError::Writable { .. }
        ));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o707)).unwrap();
        assert!(matches!(
            lock_state_dir(&d).unwrap_err(),
            StateDirError::Writable { .. }
        ));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(matches!(
            lock_state_dir(&link).unwrap_err(),
            StateDirError::Symlink { .. }
        ));
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            lock_state_dir(&file).unwrap_err(),
            StateDirError::NotDir { .. }
        ));
    }

    #[test]
    fn a_state_dir_owned_by_another_uid_is_refused() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "needs root to chown");
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("state");
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(61301), Some(61301)).unwrap();
        let err = lock_state_dir(&d).unwrap_err();
        assert!(
            matches!(
                err,
                StateDirError::Owner {
                    uid: 61301,
                    agent_uid: 0,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_locked_state_dir_is_refused_naming_the_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let first = lock_state_dir(tmp.path()).unwrap();
        let err = lock_state_dir(tmp.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains(tmp.path().to_str().unwrap()), "{msg}");
        drop(first);
        lock_state_dir(tmp.path()).unwrap();
        // A symlink planted at the lock is not followed.
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, tmp.path().join("lock")).unwrap();
        assert!(lock_state_dir(tmp.path()).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }
}
