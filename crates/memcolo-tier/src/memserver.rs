//! The memory server (`memcolo memserver`): keeps pages for far-memory tiers on other
//! machines (or on this one) and serves them over TCP with the protocol of
//! [`crate::wire`].
//!
//! Pages are held by a [`SlowTier`] backend (a [`crate::compressed::CompressedStore`]
//! in `memcolo memserver`). The server checks the CRC-32 of every page it receives
//! before storing it, and answers a store only once the backend holds the page, so a
//! client that got `ok` may drop its copy. A load answers the page with its CRC-32,
//! which the client checks again: corruption at rest is caught by the backend,
//! corruption in transit by the client.
//!
//! **Who may connect.** Every connection must first pass the handshake of
//! [`crate::channel`]: the client and the server prove to each other that they hold
//! the shared secret ([`ServerConfig::auth`]), and every frame afterwards is sealed
//! (ChaCha20-Poly1305), so a peer without the secret can neither read nor write a
//! page, and a frame altered, replayed or reordered in transit closes the connection.
//!
//! **Bounded resources; no client stops the server.** At most
//! [`ServerConfig::max_connections`] connections are served at once, one thread
//! each; the accept thread turns the next one away with a refusal naming the cap
//! (and a connection whose thread cannot be started likewise), and goes on. A peer
//! gets [`ServerConfig::handshake_timeout`] for the whole handshake, and a connection
//! idle for [`ServerConfig::idle_timeout`] (or not reading its answers for
//! [`ServerConfig::io_timeout`]) is closed, freeing its slot. Payloads in flight
//! count against [`ServerConfig::capacity_bytes`] together with the backend's stored
//! bytes: a store's payload is reserved before it is read, and refused with `full`
//! (its bytes read through a fixed buffer and dropped) when it does not fit; no
//! buffer is sized by a number a client sent before that number was checked. Beyond
//! that, the server's memory is its threads' stacks and a page and 64 KiB of
//! buffers per connection.
//!
//! A connection serves pipelined requests in order and flushes its answers whenever
//! no request is waiting in its buffer.
//!
//! **Pages belong to regions, not to connections.** Nothing is dropped when a
//! connection closes, cleanly or not: the pages a client stored stay in the backend
//! until some client removes them (remove, remove region), so an agent that crashed
//! can be restarted, connect again, list its regions' pages (op 7, list region, paged
//! by [`wire::LIST_MAX_PAGES`] indices) and load them. A client that will not come
//! back leaves its pages behind until they are removed.
//!
//! The server keeps its pages in memory only: if it is killed, its pages are gone,
//! and clients get [`TierError::Unreachable`] (while it is down) or
//! [`TierError::NotFound`] (from a restarted, empty server), never zeros.

use crate::channel::{self, Auth, Dir, ST_BUSY};
use crate::wire::{self, Op, Request, Response, Status};
use crate::{checksum, SlowTier, TierError};
use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a memory server authenticates its clients and bounds what they may take.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The shared secret clients must prove, or [`Auth::InsecureNoAuth`].
    pub auth: Auth,
    /// Memory the stored pages and the payloads in flight may occupy together,
    /// bytes (the backend's stored bytes, as [`SlowTier::stats`] counts them, plus
    /// every payload being received or answered).
    pub capacity_bytes: u64,
    /// Connections served at once (64); the next ones are refused.
    pub max_connections: usize,
    /// Longest a peer may take for the whole handshake (5 s).
    pub handshake_timeout: Duration,
    /// A connection with no request for this long is closed (120 s).
    pub idle_timeout: Duration,
    /// Longest wait for one read inside a frame or one write of an answer (10 s).
    pub io_timeout: Duration,
}

impl ServerConfig {
    /// The defaults above with `auth` and `capacity_bytes`.
    pub fn new(auth: Auth, capacity_bytes: u64) -> Self {
        ServerConfig {
            auth,
            capacity_bytes,
            max_connections: 64,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            io_timeout: Duration::from_secs(10),
        }
    }
}

/// Payload bytes in flight, reserved against the capacity.
struct Budget {
    capacity: u64,
    in_flight: AtomicU64,
    /// The most stored plus in-flight bytes any reservation saw.
    peak: AtomicU64,
}

/// Bytes reserved in the budget, released when dropped.
struct Reserved<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.budget
            .in_flight
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl Budget {
    /// Reserves `bytes` if the backend's `stored` bytes, those in flight and these fit.
    fn reserve(&self, stored: u64, bytes: u64) -> Result<Reserved<'_>, u64> {
        let mut cur = self.in_flight.load(Ordering::Acquire);
        loop {
            let total = stored.saturating_add(cur).saturating_add(bytes);
            if total > self.capacity {
                return Err(stored.saturating_add(cur));
            }
            match self.in_flight.compare_exchange_weak(
                cur,
                cur + bytes,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(total, Ordering::AcqRel);
                    return Ok(Reserved {
                        budget: self,
                        bytes,
                    });
                }
                Err(now) => cur = now,
            }
        }
    }
}

struct Shared {
    /// This server's instance: random, answered in every hello, so that a client
    /// can tell a restarted (empty) server from the one that holds its pages.
    instance: u64,
    cfg: ServerConfig,
    budget: Budget,
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
    refused: AtomicU64,
}

/// A bound memory server; [`MemServer::run`] serves until stopped.
pub struct MemServer {
    listener: TcpListener,
    backend: Arc<dyn SlowTier>,
    shared: Arc<Shared>,
}

/// A memory server running on its own thread; dropping the handle stops it.
pub struct MemServerHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    backend: Arc<dyn SlowTier>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl MemServer {
    /// Binds `addr` (e.g. `0.0.0.0:7070`, or port 0 for any free port) with `backend`
    /// holding the pages, authenticating and bounding clients as `cfg` says.
    ///
    /// # Errors
    /// The bind's I/O error; `InvalidInput` for a zero `max_connections`.
    pub fn bind(
        addr: impl ToSocketAddrs,
        backend: Arc<dyn SlowTier>,
        cfg: ServerConfig,
    ) -> io::Result<Self> {
        if cfg.max_connections == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "max_connections must be at least 1",
            ));
        }
        Ok(MemServer {
            listener: TcpListener::bind(addr)?,
            backend,
            shared: Arc::new(Shared {
                instance: new_instance(),
                budget: Budget {
                    capacity: cfg.capacity_bytes,
                    in_flight: AtomicU64::new(0),
                    peak: AtomicU64::new(0),
                },
                cfg,
                stop: AtomicBool::new(false),
                conns: Mutex::new(HashMap::new()),
                next_conn: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        })
    }

    /// The address the server listens on.
    ///
    /// # Errors
    /// The socket's I/O error.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts and serves connections until the server is stopped (through its
    /// [`MemServerHandle`]); each connection gets a thread, up to
    /// [`ServerConfig::max_connections`]. Nothing a client does ends this loop.
    ///
    /// # Errors
    /// None so far: failed accepts and spawns are logged and the loop goes on.
    pub fn run(self) -> io::Result<()> {
        for stream in self.listener.incoming() {
            if self.shared.stop.load(Ordering::Acquire) {
                break;
            }
            let stream = match stream {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "memserver: accept failed");
                    // Out of descriptors and the like: do not spin.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            self.admit(stream);
        }
        Ok(())
    }

    /// Serves `stream` on a thread of its own, or turns it away.
    fn admit(&self, stream: TcpStream) {
        let shared = &self.shared;
        let max = shared.cfg.max_connections;
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let Ok(clone) = stream.try_clone() else {
            refuse(&stream, "cannot serve the connection: out of descriptors");
            shared.refused.fetch_add(1, Ordering::Relaxed);
            return;
        };
        {
            let mut conns = lock(&shared.conns);
            if conns.len() >= max {
                drop(conns);
                shared.refused.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = ?stream.peer_addr().ok(), max, "memserver: connection refused at the cap");
                refuse(
                    &stream,
                    &format!("too many connections (the server's cap is {max})"),
                );
                return;
            }
            conns.insert(id, clone);
        }
        let backend = self.backend.clone();
        let sh = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("memserver-conn-{id}"))
            .spawn(move || {
                let peer = stream.peer_addr().ok();
                if let Err(e) = serve_conn(stream, &*backend, &sh) {
                    if !sh.stop.load(Ordering::Acquire) {
                        tracing::debug!(?peer, error = %e, "memserver: connection closed");
                    }
                }
                lock(&sh.conns).remove(&id);
            });
        if let Err(e) = spawned {
            // The closure (and the stream it held) is gone; answer on the clone.
            let clone = lock(&shared.conns).remove(&id);
            shared.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "memserver: cannot start a connection thread; connection refused");
            if let Some(c) = clone {
                refuse(&c, "cannot serve the connection now (no thread)");
            }
        }
    }

    /// Runs the server on a new thread.
    ///
    /// # Errors
    /// The socket's or the thread spawn's I/O error.
    pub fn spawn(self) -> io::Result<MemServerHandle> {
        let addr = self.local_addr()?;
        let shared = self.shared.clone();
        let backend = self.backend.clone();
        let thread = std::thread::Builder::new()
            .name("memserver".into())
            .spawn(move || self.run())?;
        Ok(MemServerHandle {
            addr,
            shared,
            backend,
            thread: Some(thread),
        })
    }
}

/// Turns a connection away with a refusal greeting ([`ST_BUSY`]), without blocking
/// the accept thread.
fn refuse(stream: &TcpStream, reason: &str) {
    let _ = stream.set_nonblocking(true);
    let mut s = stream;
    let _ = s.write_all(&channel::greeting_refusal(ST_BUSY, reason));
    let _ = stream.shutdown(Shutdown::Write);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemServerHandle {
    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections open now (accepted and not yet closed by either side).
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.conns).len()
    }

    /// Connections turned away so far (at the cap, or with no thread to serve them).
    pub fn refused_connections(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// Payload bytes reserved in flight now.
    pub fn in_flight_bytes(&self) -> u64 {
        self.shared.budget.in_flight.load(Ordering::Acquire)
    }

    /// The most bytes (stored plus in flight) any reservation has taken the server
    /// to; never above [`ServerConfig::capacity_bytes`].
    pub fn peak_accounted_bytes(&self) -> u64 {
        self.shared.budget.peak.load(Ordering::Acquire)
    }

    /// The backend's stored bytes plus the payload bytes in flight, now.
    pub fn accounted_bytes(&self) -> u64 {
        self.backend.stats().stored_bytes + self.in_flight_bytes()
    }

    /// Stops the server as if it had been killed: stops accepting, and shuts every
    /// open connection down, so clients see resets and refused connections.
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for (_, c) in lock(&self.shared.conns).drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
        // Wake the accept loop so it sees the flag and drops the listener.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MemServerHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_now();
        }
    }
}

/// A random, nonzero instance id.
fn new_instance() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        use std::hash::BuildHasher;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        return std::collections::hash_map::RandomState::new()
            .hash_one((now, std::process::id()))
            .max(1);
    }
    u64::from_le_bytes(b).max(1)
}

/// A reader whose every read must end by a deadline (the handshake's).
struct ByDeadline<'a> {
    s: &'a TcpStream,
    deadline: Instant,
}

impl Read for ByDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "handshake deadline passed",
            ));
        }
        self.s.set_read_timeout(Some(left))?;
        let mut s = self.s;
        s.read(buf)
    }
}

impl Write for ByDeadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut s = self.s;
        s.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads with the idle timeout while no frame has begun, with the I/O timeout inside
/// one.
struct Timed {
    s: TcpStream,
    idle: Duration,
    io: Duration,
    idle_now: bool,
}

impl Timed {
    fn waiting(&mut self, idle: bool) -> io::Result<()> {
        if self.idle_now != idle {
            self.s
                .set_read_timeout(Some(if idle { self.idle } else { self.io }))?;
            self.idle_now = idle;
        }
        Ok(())
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.s.read(buf)
    }
}

fn serve_conn(stream: TcpStream, backend: &dyn SlowTier, shared: &Shared) -> io::Result<()> {
    let cfg = &shared.cfg;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(cfg.io_timeout))?;
    let channel::Keys {
        send: mut tx,
        recv: mut rx,
    } = {
        let mut hs = ByDeadline {
            s: &stream,
            deadline: Instant::now() + cfg.handshake_timeout,
        };
        channel::server_handshake(&mut hs, &cfg.auth)?
    };
    let timed = Timed {
        s: stream.try_clone()?,
        idle: cfg.idle_timeout,
        io: cfg.io_timeout,
        idle_now: false,
    };
    let mut r = BufReader::with_capacity(32 << 10, timed);
    let mut w = BufWriter::with_capacity(32 << 10, stream);
    let mut page = vec![0u8; backend.page_bytes()];
    loop {
        if r.buffer().is_empty() {
            r.get_mut().waiting(true)?;
        }
        // A record that fails (forged, replayed, cut) ends the connection, but only
        // after the answers owed to the frames before it have gone out.
        let h = match wire::read_request_header(&mut r, &mut rx) {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e) => {
                let _ = w.flush();
                return Err(e);
            }
        };
        r.get_mut().waiting(false)?;
        let (resp, reserved) = match serve_request(h, &mut r, &mut rx, backend, &mut page, shared) {
            Ok(x) => x,
            Err(e) => {
                let _ = w.flush();
                return Err(e);
            }
        };
        wire::write_response(&mut w, &mut tx, &resp)?;
        drop(reserved);
        if r.buffer().is_empty() {
            w.flush()?;
        }
    }
    w.flush()
}

/// Reads the payload of the request `h` heads (reserving it against the capacity
/// first) and answers it.
fn serve_request<'a>(
    h: wire::RequestHeader,
    r: &mut impl Read,
    rx: &mut Dir,
    backend: &dyn SlowTier,
    page: &mut [u8],
    shared: &'a Shared,
) -> io::Result<(Response, Option<Reserved<'a>>)> {
    let small = h.op != Op::Store && h.len > wire::MAX_SMALL_PAYLOAD;
    let reserved = if h.len == 0 || small {
        None
    } else {
        match shared
            .budget
            .reserve(backend.stats().stored_bytes, u64::from(h.len))
        {
            Ok(res) => Some(res),
            Err(used) => {
                rx.skip(r, h.len as usize)?;
                return Ok((full_reply(h.id, shared.budget.capacity, used), None));
            }
        }
    };
    if small {
        rx.skip(r, h.len as usize)?;
        let why = format!(
            "{:?}: payload of {} bytes, at most {}",
            h.op,
            h.len,
            wire::MAX_SMALL_PAYLOAD
        );
        return Ok((reply(h.id, Status::BadRequest, why.into_bytes()), None));
    }
    let req = Request {
        op: h.op,
        id: h.id,
        key: h.key,
        crc: h.crc,
        payload: wire::read_payload(r, rx, h.len)?,
    };
    let (resp, answer) = handle(&req, backend, page, shared);
    drop(reserved);
    Ok((resp, answer))
}

fn full_reply(id: u64, capacity_bytes: u64, used_bytes: u64) -> Response {
    let mut p = capacity_bytes.to_le_bytes().to_vec();
    p.extend_from_slice(&used_bytes.to_le_bytes());
    reply(id, Status::Full, p)
}

fn reply(id: u64, status: Status, payload: Vec<u8>) -> Response {
    Response {
        status,
        id,
        crc: checksum(&payload),
        payload,
    }
}

fn error_reply(id: u64, e: &TierError) -> Response {
    match e {
        TierError::NotFound { .. } => reply(id, Status::NotFound, e.to_string().into_bytes()),
        TierError::Corrupt {
            expected, actual, ..
        } => {
            let mut p = expected.to_le_bytes().to_vec();
            p.extend_from_slice(&actual.to_le_bytes());
            reply(id, Status::Corrupt, p)
        }
        TierError::Full {
            capacity_bytes,
            used_bytes,
        } => {
            let mut p = capacity_bytes.to_le_bytes().to_vec();
            p.extend_from_slice(&used_bytes.to_le_bytes());
            reply(id, Status::Full, p)
        }
        TierError::WrongSize { .. } => reply(id, Status::BadRequest, e.to_string().into_bytes()),
        _ => reply(id, Status::Internal, e.to_string().into_bytes()),
    }
}

/// Answers `req`; a list-region answer comes with its bytes reserved against the
/// capacity, to be released once it is written.
fn handle<'a>(
    req: &Request,
    backend: &dyn SlowTier,
    page: &mut [u8],
    shared: &'a Shared,
) -> (Response, Option<Reserved<'a>>) {
    let id = req.id;
    let resp = match req.op {
        Op::Hello => {
            let ours = backend.page_bytes() as u32;
            let theirs = req
                .payload
                .get(..4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
            if theirs == Some(ours) {
                let idle_ms =
                    u32::try_from(shared.cfg.idle_timeout.as_millis()).unwrap_or(u32::MAX);
                let mut p = ours.to_le_bytes().to_vec();
                p.extend_from_slice(&shared.instance.to_le_bytes());
                p.extend_from_slice(&idle_ms.to_le_bytes());
                reply(id, Status::Ok, p)
            } else {
                reply(
                    id,
                    Status::BadRequest,
                    format!("page size mismatch: server stores pages of {ours} bytes, client sent {theirs:?}")
                        .into_bytes(),
                )
            }
        }
        Op::Store => {
            let actual = checksum(&req.payload);
            if actual != req.crc {
                // Damaged in transit: refuse, so the client keeps its copy and retries.
                let mut p = req.crc.to_le_bytes().to_vec();
                p.extend_from_slice(&actual.to_le_bytes());
                return (reply(id, Status::Corrupt, p), None);
            }
            match backend.store(req.key, &req.payload) {
                Ok(()) => reply(id, Status::Ok, Vec::new()),
                Err(e) => error_reply(id, &e),
            }
        }
        Op::Load => match backend.load(req.key, page) {
            Ok(()) => Response {
                status: Status::Ok,
                id,
                crc: checksum(page),
                payload: page.to_vec(),
            },
            Err(e) => error_reply(id, &e),
        },
        Op::Remove => match backend.remove(req.key) {
            Ok(had) => reply(id, Status::Ok, vec![had as u8]),
            Err(e) => error_reply(id, &e),
        },
        Op::RemoveRegion => match backend.remove_region(req.key.region) {
            Ok(n) => reply(id, Status::Ok, n.to_le_bytes().to_vec()),
            Err(e) => error_reply(id, &e),
        },
        Op::ListRegion => {
            let asked = match req.payload.len() {
                0 => wire::LIST_MAX_PAGES,
                4 => u32::from_le_bytes(req.payload[..4].try_into().expect("4 bytes")),
                n => {
                    let why = format!("list region: payload of {n} bytes, expected 0 or 4");
                    return (reply(id, Status::BadRequest, why.into_bytes()), None);
                }
            };
            if asked == 0 {
                let why = b"list region: asked for 0 indices".to_vec();
                return (reply(id, Status::BadRequest, why), None);
            }
            let n = asked.min(wire::LIST_MAX_PAGES) as usize;
            match backend.list_region(req.key.region) {
                Ok(pages) => {
                    let from = pages.partition_point(|&p| p < req.key.page);
                    let count = (pages.len() - from).min(n);
                    let reserved = match shared
                        .budget
                        .reserve(backend.stats().stored_bytes, count as u64 * 8)
                    {
                        Ok(r) => r,
                        Err(used) => return (full_reply(id, shared.budget.capacity, used), None),
                    };
                    let p: Vec<u8> = pages[from..from + count]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect();
                    return (reply(id, Status::Ok, p), Some(reserved));
                }
                Err(e) => error_reply(id, &e),
            }
        }
        Op::Stats => {
            let s = backend.stats();
            let p: Vec<u8> = [
                s.pages,
                s.stored_bytes,
                s.stores,
                s.loads,
                s.corrupt,
                s.retries,
            ]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
            reply(id, Status::Ok, p)
        }
    };
    (resp, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compressed::CompressedStore;
    use crate::PageKey;

    const PAGE: usize = 64;

    /// A connection past the handshake, spoken to frame by frame.
    struct Raw {
        s: TcpStream,
        keys: channel::Keys,
    }

    fn raw(h: &MemServerHandle) -> Raw {
        let mut s = TcpStream::connect(h.addr()).unwrap();
        let keys = channel::client_handshake(&mut s, &Auth::InsecureNoAuth).unwrap();
        Raw { s, keys }
    }

    /// Sends `req` on a raw connection and reads the answer.
    fn ask(c: &mut Raw, req: &Request) -> Response {
        wire::write_request(&mut &c.s, &mut c.keys.send, req).unwrap();
        wire::read_response(&mut &c.s, &mut c.keys.recv).unwrap()
    }

    fn list(region: u64, from: u64, payload: Vec<u8>) -> Request {
        Request {
            op: Op::ListRegion,
            id: from + 1,
            key: PageKey::new(region, from),
            crc: checksum(&payload),
            payload,
        }
    }

    fn indices(resp: &Response) -> Vec<u64> {
        assert_eq!(resp.status, Status::Ok, "{resp:?}");
        assert_eq!(resp.crc, checksum(&resp.payload));
        resp.payload
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn list_region_answers_pages_from_the_first_index_asked() {
        let store = Arc::new(CompressedStore::new(PAGE, 1 << 20));
        for p in [9u64, 2, 5, 7, 1 << 40] {
            store.store(PageKey::new(3, p), &[p as u8; PAGE]).unwrap();
        }
        store.store(PageKey::new(4, 6), &[1u8; PAGE]).unwrap();
        let h = MemServer::bind(
            "127.0.0.1:0",
            store,
            ServerConfig::new(Auth::InsecureNoAuth, 1 << 20),
        )
        .unwrap()
        .spawn()
        .unwrap();
        let c = &mut raw(&h);
        // No payload: up to LIST_MAX_PAGES indices.
        assert_eq!(
            indices(&ask(c, &list(3, 0, Vec::new()))),
            [2, 5, 7, 9, 1 << 40]
        );
        // A first index and a count: a page of the listing.
        assert_eq!(
            indices(&ask(c, &list(3, 3, 2u32.to_le_bytes().to_vec()))),
            [5, 7]
        );
        assert_eq!(
            indices(&ask(c, &list(3, 8, 9u32.to_le_bytes().to_vec()))),
            [9, 1 << 40]
        );
        assert_eq!(
            indices(&ask(c, &list(3, (1 << 40) + 1, Vec::new()))),
            Vec::<u64>::new()
        );
        // A region the server holds nothing of: no indices, not "not found".
        assert_eq!(
            indices(&ask(c, &list(77, 0, Vec::new()))),
            Vec::<u64>::new()
        );
        // Bad requests are refused and the connection stays usable.
        let zero = ask(c, &list(3, 0, 0u32.to_le_bytes().to_vec()));
        assert_eq!(zero.status, Status::BadRequest);
        let odd = ask(c, &list(3, 0, vec![1, 2, 3]));
        assert_eq!(odd.status, Status::BadRequest);
        assert_eq!(indices(&ask(c, &list(4, 0, Vec::new()))), [6]);
    }
}
