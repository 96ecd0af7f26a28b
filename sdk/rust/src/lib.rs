//! memcolo SDK for elastic applications (M3, EuroSys'21 §4): register with the
//! `memcolo agent`, shrink on `low`/`high`/`top` pressure notifications, report what
//! was given back, and throttle growth with the allow-rate gate (M3 §4.2).
//!
//! The protocol is `docs/protocol.md`; messages are encoded by [`memcolo_proto`], the
//! reference implementation. A [`Client`] runs one background thread that connects,
//! registers, answers every `notify` with `reclaimed` (carrying its `seq`), and
//! reconnects with exponential backoff when the agent goes away. No agent at all is
//! not an error: the client keeps retrying quietly and the application runs on.
//!
//! ```no_run
//! use memcolo_sdk::{ClientBuilder, Level};
//! let client = ClientBuilder::new()
//!     .name("my-cache")
//!     .expected_reclaim_bytes(256 << 20)
//!     // Layers run in registration order: the application's cache first ...
//!     .on(Level::High, |n| Ok(n.target_bytes / 2))
//!     // ... then its runtime (glibc's free lists).
//!     .on(Level::High, |_| Ok(memcolo_sdk::runtime::malloc_trim()))
//!     .start();
//! if !client.gate().admit() { /* evict before allocating */ }
//! ```

pub mod gate;
pub mod runtime;

pub use gate::{AllowRateGate, DEFAULT_MIN_EPOCH, DEFAULT_NUM_EPOCHS};
pub use memcolo_proto::{Class, Level, NotifyMode, DEFAULT_SOCKET, PROTOCOL_VERSION};

use memcolo_proto::{decode_reply, encode, DecodeError, Reply, Request, MAX_LINE_BYTES};
use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Environment variable that overrides the socket path.
pub const SOCKET_ENV: &str = "MEMCOLO_SOCKET";

/// Errors a handler may return; reported to the agent as `ok: false`.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// An application handler failed.
    #[error("handler for {level} failed: {message}")]
    Handler { level: Level, message: String },
    /// An application handler ran past the handler timeout.
    #[error("handler for {level} ran past {timeout_ms} ms")]
    HandlerTimeout { level: Level, timeout_ms: u64 },
}

/// One pressure notification (`notify` in the protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The agent's sequence number, echoed in `reclaimed`.
    pub seq: u64,
    pub level: Level,
    /// About how much to give back, in bytes.
    pub target_bytes: u64,
}

/// The result type of a handler: bytes given back.
pub type HandlerResult = Result<u64, Box<dyn std::error::Error + Send + Sync>>;
type Handler = Box<dyn Fn(Notification) -> HandlerResult + Send + Sync>;
type Hook = Box<dyn Fn() + Send + Sync>;

/// Builds a [`Client`].
pub struct ClientBuilder {
    socket_path: PathBuf,
    class: Class,
    name: Option<String>,
    expected_reclaim_bytes: Option<u64>,
    handler_timeout: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
    handlers: Vec<(Level, Handler)>,
    on_reconnect: Option<Hook>,
    gate: Arc<AllowRateGate>,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientBuilder {
    /// Defaults: socket from `$MEMCOLO_SOCKET` or [`DEFAULT_SOCKET`], class `elastic`,
    /// handler timeout 10 s, backoff 100 ms doubling to 5 s, a gate with
    /// [`DEFAULT_NUM_EPOCHS`].
    pub fn new() -> Self {
        let socket_path = std::env::var_os(SOCKET_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        ClientBuilder {
            socket_path,
            class: Class::Elastic,
            name: None,
            expected_reclaim_bytes: None,
            handler_timeout: Duration::from_secs(10),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            handlers: Vec::new(),
            on_reconnect: None,
            gate: Arc::new(AllowRateGate::default()),
        }
    }

    pub fn socket_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.socket_path = path.into();
        self
    }
    pub fn class(mut self, class: Class) -> Self {
        self.class = class;
        self
    }
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// What the application expects to give back on a high signal, in bytes
    /// (M3 §5.1: used by the agent's Algorithm 1 until reclamations are reported).
    pub fn expected_reclaim_bytes(mut self, bytes: u64) -> Self {
        self.expected_reclaim_bytes = Some(bytes);
        self
    }
    /// How long all handlers of one notification may take together before the
    /// notification is reported as failed (`ok: false`).
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = timeout;
        self
    }
    /// Reconnect delays: starts at `min`, doubles per failed attempt up to `max`.
    pub fn backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max.max(min);
        self
    }
    /// Adds a handler (a layer) for `level`. Handlers of a level run in the order they
    /// were added, upper layer first (M3 §3–4: the application evicts, then calls
    /// down to its runtime); the bytes they return are summed.
    pub fn on<F>(mut self, level: Level, handler: F) -> Self
    where
        F: Fn(Notification) -> HandlerResult + Send + Sync + 'static,
    {
        self.handlers.push((level, Box::new(handler)));
        self
    }
    /// Called after every successful re-registration following a lost connection.
    pub fn on_reconnect<F: Fn() + Send + Sync + 'static>(mut self, hook: F) -> Self {
        self.on_reconnect = Some(Box::new(hook));
        self
    }
    /// Uses `gate` as the allow-rate gate fed by high/top notifications.
    pub fn gate(mut self, gate: Arc<AllowRateGate>) -> Self {
        self.gate = gate;
        self
    }

    /// Starts the background connection thread and returns at once.
    pub fn start(self) -> Client {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            connected: AtomicBool::new(false),
            registrations: AtomicU64::new(0),
            notifications: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            stream: Mutex::new(None),
            sleep: (Mutex::new(()), Condvar::new()),
            gate: self.gate.clone(),
        });
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let handlers = Arc::new(self.handlers);
        let worker = std::thread::Builder::new()
            .name("memcolo-handlers".into())
            .spawn(move || run_worker(handlers, job_rx))
            .expect("spawn memcolo handler thread");
        let conn = Connection {
            socket_path: self.socket_path,
            class: self.class,
            name: self.name,
            expected_reclaim_bytes: self.expected_reclaim_bytes,
            handler_timeout: self.handler_timeout,
            backoff_min: self.backoff_min,
            backoff_max: self.backoff_max,
            on_reconnect: self.on_reconnect,
            shared: shared.clone(),
            job_tx,
            busy: Arc::new(AtomicBool::new(false)),
            warned: HashSet::new(),
        };
        let thread = std::thread::Builder::new()
            .name("memcolo-client".into())
            .spawn(move || conn.run())
            .expect("spawn memcolo client thread");
        Client {
            shared,
            thread: Some(thread),
            _worker: worker,
        }
    }
}

struct Shared {
    stop: AtomicBool,
    connected: AtomicBool,
    registrations: AtomicU64,
    notifications: AtomicU64,
    failed: AtomicU64,
    stream: Mutex<Option<UnixStream>>,
    sleep: (Mutex<()>, Condvar),
    gate: Arc<AllowRateGate>,
}

/// A registered elastic application's link to the agent. Dropping it unregisters
/// (closes the connection) and stops the background thread.
pub struct Client {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    _worker: JoinHandle<()>,
}

impl Client {
    /// Whether the agent has acknowledged the registration on the current connection.
    pub fn is_registered(&self) -> bool {
        self.shared.connected.load(Ordering::SeqCst)
    }
    /// How many times the client registered (1 + reconnects).
    pub fn registrations(&self) -> u64 {
        self.shared.registrations.load(Ordering::SeqCst)
    }
    /// Notifications answered so far.
    pub fn notifications(&self) -> u64 {
        self.shared.notifications.load(Ordering::SeqCst)
    }
    /// Notifications answered with `ok: false`.
    pub fn failed_notifications(&self) -> u64 {
        self.shared.failed.load(Ordering::SeqCst)
    }
    /// The allow-rate gate to consult before allocating (M3 §4.2).
    pub fn gate(&self) -> &Arc<AllowRateGate> {
        &self.shared.gate
    }
    /// Stops the client; the agent sees the connection close.
    pub fn close(mut self) {
        self.stop();
    }
    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(s) = self
            .shared
            .stream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.shared.sleep.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Job {
    note: Notification,
    done: mpsc::Sender<(Result<u64, String>, Duration)>,
    busy: Arc<AtomicBool>,
}

fn run_worker(handlers: Arc<Vec<(Level, Handler)>>, jobs: mpsc::Receiver<Job>) {
    for job in jobs {
        let start = Instant::now();
        let mut total = 0u64;
        let mut result = Ok(0);
        for (level, h) in handlers.iter() {
            if *level != job.note.level {
                continue;
            }
            match catch_unwind(AssertUnwindSafe(|| h(job.note))) {
                Ok(Ok(bytes)) => total = total.saturating_add(bytes),
                Ok(Err(e)) => {
                    result = Err(e.to_string());
                    break;
                }
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "panic".into());
                    result = Err(format!("panicked: {msg}"));
                    break;
                }
            }
        }
        let result = result.map(|_| total);
        job.busy.store(false, Ordering::SeqCst);
        let _ = job.done.send((result, start.elapsed()));
    }
}

struct Connection {
    socket_path: PathBuf,
    class: Class,
    name: Option<String>,
    expected_reclaim_bytes: Option<u64>,
    handler_timeout: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
    on_reconnect: Option<Hook>,
    shared: Arc<Shared>,
    job_tx: mpsc::Sender<Job>,
    busy: Arc<AtomicBool>,
    /// Kinds of trouble already logged: each is logged once per client.
    warned: HashSet<&'static str>,
}

enum Session {
    Lost(String),
    Stopped,
}

impl Connection {
    fn warn_once(&mut self, kind: &'static str, msg: impl FnOnce() -> String) {
        if self.warned.insert(kind) {
            tracing::warn!(target: "memcolo_sdk", "{} (logged once)", msg());
        }
    }

    fn stopping(&self) -> bool {
        self.shared.stop.load(Ordering::SeqCst)
    }

    fn sleep(&self, d: Duration) {
        let (lock, cv) = &self.shared.sleep;
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        if !self.stopping() {
            let _ = cv.wait_timeout(guard, d);
        }
    }

    fn run(mut self) {
        let mut backoff = self.backoff_min;
        let mut sessions = 0u64;
        while !self.stopping() {
            match UnixStream::connect(&self.socket_path) {
                Err(e) => {
                    let path = self.socket_path.display().to_string();
                    self.warn_once("connect", || {
                        format!("memcolo agent not reachable at {path}: {e}; retrying in the background")
                    });
                }
                Ok(stream) => {
                    backoff = self.backoff_min;
                    sessions += 1;
                    match self.session(stream, sessions > 1) {
                        Session::Stopped => break,
                        Session::Lost(why) => {
                            self.shared.connected.store(false, Ordering::SeqCst);
                            tracing::info!(target: "memcolo_sdk", "connection to memcolo agent lost: {why}; reconnecting");
                        }
                    }
                }
            }
            self.sleep(backoff);
            backoff = (backoff * 2).min(self.backoff_max);
        }
        self.shared.connected.store(false, Ordering::SeqCst);
    }

    fn session(&mut self, mut stream: UnixStream, reconnect: bool) -> Session {
        if let Ok(clone) = stream.try_clone() {
            *self.shared.stream.lock().unwrap_or_else(|p| p.into_inner()) = Some(clone);
        }
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let register = encode(&Request::Register {
            pid: None,
            class: self.class,
            name: self.name.clone(),
            expected_reclaim_bytes: self.expected_reclaim_bytes,
            notify: NotifyMode::Socket,
        });
        if let Err(e) = stream.write_all(register.as_bytes()) {
            return Session::Lost(e.to_string());
        }
        let mut reconnect_pending = reconnect;
        let mut buf: Vec<u8> = Vec::with_capacity(4096);
        let mut discarding = false;
        let mut chunk = [0u8; 4096];
        loop {
            if self.stopping() {
                return Session::Stopped;
            }
            let n = match stream.read(&mut chunk) {
                Ok(0) => return Session::Lost("agent closed the connection".into()),
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) =>
                {
                    continue
                }
                Err(e) => return Session::Lost(e.to_string()),
            };
            buf.extend_from_slice(&chunk[..n]);
            while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                if discarding {
                    discarding = false;
                    continue;
                }
                let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
                if let Err(e) = self.handle_line(&mut stream, &line, &mut reconnect_pending) {
                    return Session::Lost(e.to_string());
                }
            }
            if buf.len() > MAX_LINE_BYTES + 1 {
                self.warn_once("too_long", || {
                    format!("agent sent a line over {MAX_LINE_BYTES} bytes; discarded")
                });
                buf.clear();
                discarding = true;
            }
        }
    }

    fn handle_line(
        &mut self,
        stream: &mut UnixStream,
        line: &str,
        reconnect_pending: &mut bool,
    ) -> std::io::Result<()> {
        let reply = match decode_reply(line) {
            Ok(r) => r,
            Err(e) => {
                let kind = match e {
                    DecodeError::UnsupportedVersion(_) => "newer_version",
                    DecodeError::TooLong(_) => "too_long",
                    DecodeError::Malformed(_) => "malformed",
                };
                self.warn_once(kind, || format!("ignoring a message from the agent: {e}"));
                return Ok(());
            }
        };
        match reply {
            Reply::Registered { pid, class } => {
                tracing::debug!(target: "memcolo_sdk", "registered pid {pid} as {class}");
                self.shared.connected.store(true, Ordering::SeqCst);
                self.shared.registrations.fetch_add(1, Ordering::SeqCst);
                if std::mem::take(reconnect_pending) {
                    if let Some(h) = &self.on_reconnect {
                        if catch_unwind(AssertUnwindSafe(h)).is_err() {
                            self.warn_once("reconnect_hook", || {
                                "on_reconnect hook panicked".into()
                            });
                        }
                    }
                }
            }
            Reply::Notify {
                seq,
                level,
                target_bytes,
            } => {
                let note = Notification {
                    seq,
                    level,
                    target_bytes,
                };
                let (ok, bytes, duration) = self.dispatch(note);
                self.shared.notifications.fetch_add(1, Ordering::SeqCst);
                if !ok {
                    self.shared.failed.fetch_add(1, Ordering::SeqCst);
                }
                let msg = encode(&Request::Reclaimed {
                    pid: None,
                    seq: Some(seq),
                    bytes,
                    duration_ms: duration.as_millis().min(u128::from(u64::MAX)) as u64,
                    ok,
                });
                stream.write_all(msg.as_bytes())?;
            }
            Reply::Error { code, message } => {
                tracing::warn!(target: "memcolo_sdk", "agent answered with an error ({code:?}): {message}");
            }
            other => tracing::debug!(target: "memcolo_sdk", "agent reply: {other:?}"),
        }
        Ok(())
    }

    /// Runs the handlers of one notification on the handler thread, waiting at most
    /// the handler timeout. Returns (ok, bytes, duration).
    fn dispatch(&mut self, note: Notification) -> (bool, u64, Duration) {
        let received = Instant::now();
        let gated = matches!(note.level, Level::High | Level::Top);
        if gated {
            self.shared.gate.signal_received(received);
        }
        if self.busy.swap(true, Ordering::SeqCst) {
            self.warn_once("busy", || {
                "a notification arrived while an overlong handler still runs; reported as failed"
                    .into()
            });
            return (false, 0, Duration::ZERO);
        }
        let (done_tx, done_rx) = mpsc::channel();
        let job = Job {
            note,
            done: done_tx,
            busy: self.busy.clone(),
        };
        if self.job_tx.send(job).is_err() {
            self.busy.store(false, Ordering::SeqCst);
            return (false, 0, Duration::ZERO);
        }
        let outcome = match done_rx.recv_timeout(self.handler_timeout) {
            Ok((Ok(bytes), d)) => (true, bytes, d),
            Ok((Err(msg), d)) => {
                let e = SdkError::Handler {
                    level: note.level,
                    message: msg,
                };
                tracing::warn!(target: "memcolo_sdk", "{e}");
                (false, 0, d)
            }
            Err(_) => {
                let e = SdkError::HandlerTimeout {
                    level: note.level,
                    timeout_ms: self.handler_timeout.as_millis() as u64,
                };
                tracing::warn!(target: "memcolo_sdk", "{e}");
                (false, 0, received.elapsed())
            }
        };
        if gated {
            self.shared.gate.signal_handled(Instant::now());
        }
        outcome
    }
}
