//! A slow tier kept by a memory server ([`crate::memserver`]) over TCP: real
//! disaggregated memory when the server runs on another machine.
//!
//! Every page is sent with its CRC-32; the server checks it before storing and
//! answers a store only once it holds the page, so [`SlowTier::store`] returning `Ok`
//! means the page is safe elsewhere. Loads come back with the page's CRC-32 and are
//! checked again here.
//!
//! **Failures and the retry bound.** A request that fails on the network (refused or
//! reset connection, timeout, a page damaged in transit) is retried on a fresh
//! connection, up to [`RemoteConfig::attempts`] attempts with a doubling back-off from
//! [`RemoteConfig::backoff`] to [`RemoteConfig::max_backoff`]; each attempt waits at
//! most [`RemoteConfig::connect_timeout`] to connect and [`RemoteConfig::io_timeout`]
//! per read or write. [`RemoteConfig::retry_bound`] is the worst case; past it the
//! request fails with [`TierError::Unreachable`] (or [`TierError::Corrupt`] if every
//! attempt brought back damaged bytes). Answers that retrying cannot change
//! (not found, corrupt at rest, full, refused) are returned at once. Requests are
//! idempotent (a store overwrites the same page with the same bytes), so a retry
//! after an answer was lost is safe.
//!
//! Connections are pooled ([`RemoteConfig::max_idle_conns`] kept idle), so a fault
//! thread and eviction workers can talk to the server at the same time. A pooled
//! connection idle for half the server's idle timeout (which the server's hello
//! answers) is dropped rather than reused, so a request does not meet a connection
//! the server has closed.
//!
//! **Authentication.** Every connection opens with the handshake of
//! [`crate::channel`] under [`RemoteConfig::auth`]: the server must prove it holds
//! the shared secret before a page is sent, and every frame is sealed. A server with
//! another secret or mode fails with [`TierError::Auth`] at once (not retried); a
//! frame altered in transit fails to open, and the request is retried on a new
//! connection like any network failure.
//!
//! **Durability.** The pages belong to their region on the server, not to this
//! client or its connections: they stay when the client is dropped or its process
//! dies ([`SlowTier::durable`] is `true`), and a new `RemoteTier` finds them with
//! [`SlowTier::list_region`] (paged by [`RemoteConfig::list_batch`] indices per
//! request) and loads them.

use crate::channel::{self, Auth, Dir, HandshakeError};
use crate::wire::{self, Op, Request, Response, Status};
use crate::{checksum, PageKey, SlowTier, TierError, TierStats};
use std::io::{self, BufReader, BufWriter, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How to reach a memory server and how hard to try.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// `host:port` of the server.
    pub addr: String,
    /// The shared secret to prove and to demand of the server, or
    /// [`Auth::InsecureNoAuth`] (tests on the loopback interface only).
    pub auth: Auth,
    /// Page size, bytes; must equal the server's (checked when connecting).
    pub page_bytes: usize,
    /// Longest wait for a connection, per attempt (1 s).
    pub connect_timeout: Duration,
    /// Longest wait for one read or write, per attempt (2 s).
    pub io_timeout: Duration,
    /// Attempts per request before giving up (5).
    pub attempts: u32,
    /// Back-off after the first failed attempt, doubled after each (50 ms).
    pub backoff: Duration,
    /// Longest back-off (800 ms).
    pub max_backoff: Duration,
    /// Idle connections kept for reuse (8).
    pub max_idle_conns: usize,
    /// Page indices asked for per list-region request ([`wire::LIST_MAX_PAGES`],
    /// 524 288); larger values are asked as that, 0 as 1. A region of more pages is
    /// listed in several requests.
    pub list_batch: u32,
}

impl RemoteConfig {
    /// The defaults above for a server at `addr` with pages of `page_bytes` bytes,
    /// authenticated by `auth`.
    pub fn new(addr: impl Into<String>, page_bytes: usize, auth: Auth) -> Self {
        RemoteConfig {
            addr: addr.into(),
            auth,
            page_bytes,
            connect_timeout: Duration::from_secs(1),
            io_timeout: Duration::from_secs(2),
            attempts: 5,
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(800),
            max_idle_conns: 8,
            list_batch: wire::LIST_MAX_PAGES,
        }
    }

    /// The longest a single-page request can take before it fails: every attempt
    /// timing out on connect and on one write and one read, plus every back-off.
    /// (A batch of `n` pages may spend one `io_timeout` per page written or read.)
    /// About 25.8 s with the defaults.
    pub fn retry_bound(&self) -> Duration {
        let per_attempt = self.connect_timeout + self.io_timeout * 2;
        let mut backoffs = Duration::ZERO;
        let mut b = self.backoff;
        for _ in 1..self.attempts {
            backoffs += b;
            b = (b * 2).min(self.max_backoff);
        }
        per_attempt * self.attempts + backoffs
    }
}

struct Conn {
    r: BufReader<TcpStream>,
    w: BufWriter<TcpStream>,
    tx: Dir,
    rx: Dir,
    /// When the connection last finished a request.
    used: Instant,
}

/// How one attempt ended, when it did not succeed.
enum Failed {
    /// Retry on a new connection (network failure).
    Retry(io::Error),
    /// Retry on a new connection: the page came back damaged in transit.
    RetryCorrupt {
        key: PageKey,
        expected: u32,
        actual: u32,
    },
    /// Give up now with this error; the connection is still in sync.
    Answer(TierError),
    /// Give up now with this error and drop the connection (protocol broken).
    Broken(TierError),
}

impl From<io::Error> for Failed {
    fn from(e: io::Error) -> Self {
        Failed::Retry(e)
    }
}

/// Pages kept by a memory server; see the module documentation.
pub struct RemoteTier {
    cfg: RemoteConfig,
    pool: Mutex<Vec<Conn>>,
    next_id: AtomicU64,
    stores: AtomicU64,
    loads: AtomicU64,
    corrupt: AtomicU64,
    retries: AtomicU64,
    /// The server instance the last hello answered (0 before the first).
    instance: AtomicU64,
    /// Half the server's idle timeout, ms: pooled connections idle longer are dropped.
    reuse_ms: AtomicU64,
}

impl RemoteTier {
    /// Connects to the server (within the retry bound) and checks that it stores
    /// pages of `cfg.page_bytes` bytes.
    ///
    /// # Errors
    /// [`TierError::Unreachable`]; [`TierError::Server`] if the page sizes differ.
    pub fn connect(cfg: RemoteConfig) -> Result<Self, TierError> {
        let tier = RemoteTier {
            cfg,
            pool: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            stores: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            instance: AtomicU64::new(0),
            reuse_ms: AtomicU64::new(u64::MAX),
        };
        tier.call(|_| Ok(()))?;
        Ok(tier)
    }

    /// The configuration in use.
    pub fn config(&self) -> &RemoteConfig {
        &self.cfg
    }

    /// The server's own counters (pages held, bytes, stores, loads, corrupt pages).
    ///
    /// # Errors
    /// As [`SlowTier::load`]'s network errors.
    pub fn server_stats(&self) -> Result<TierStats, TierError> {
        let resp = self.call(|c| self.round_trip(c, Op::Stats, PageKey::new(0, 0), Vec::new()))?;
        let v: Vec<u64> = resp
            .payload
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        if v.len() != 6 {
            return Err(self.protocol(format!("stats of {} bytes", resp.payload.len())));
        }
        Ok(TierStats {
            pages: v[0],
            stored_bytes: v[1],
            stores: v[2],
            loads: v[3],
            corrupt: v[4],
            retries: v[5],
        })
    }

    fn protocol(&self, reason: String) -> TierError {
        TierError::Protocol {
            addr: self.cfg.addr.clone(),
            reason,
        }
    }

    fn open(&self) -> Result<Conn, Failed> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolved to nothing");
        for sa in self.cfg.addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&sa, self.cfg.connect_timeout) {
                Ok(mut s) => {
                    s.set_nodelay(true)?;
                    s.set_read_timeout(Some(self.cfg.io_timeout))?;
                    s.set_write_timeout(Some(self.cfg.io_timeout))?;
                    let keys = match channel::client_handshake(&mut s, &self.cfg.auth) {
                        Ok(k) => k,
                        Err(HandshakeError::Io(e)) => return Err(Failed::Retry(e)),
                        Err(HandshakeError::Denied(reason)) => {
                            return Err(Failed::Broken(TierError::Auth {
                                addr: self.cfg.addr.clone(),
                                reason,
                            }))
                        }
                    };
                    let mut c = Conn {
                        r: BufReader::with_capacity(32 << 10, s.try_clone()?),
                        w: BufWriter::with_capacity(32 << 10, s),
                        tx: keys.send,
                        rx: keys.recv,
                        used: Instant::now(),
                    };
                    let hello = (self.cfg.page_bytes as u32).to_le_bytes().to_vec();
                    let resp = self.round_trip(&mut c, Op::Hello, PageKey::new(0, 0), hello)?;
                    let ours = (self.cfg.page_bytes as u32).to_le_bytes();
                    if resp.payload.len() != 16 || resp.payload[..4] != ours {
                        return Err(Failed::Broken(
                            self.protocol(format!("hello answered {:?}", resp.payload)),
                        ));
                    }
                    let instance =
                        u64::from_le_bytes(resp.payload[4..12].try_into().expect("8 bytes"));
                    let idle_ms =
                        u32::from_le_bytes(resp.payload[12..16].try_into().expect("4 bytes"));
                    self.reuse_ms
                        .store(u64::from(idle_ms / 2), Ordering::Relaxed);
                    let was = self.instance.swap(instance, Ordering::AcqRel);
                    if was != 0 && was != instance {
                        tracing::error!(
                            addr = %self.cfg.addr,
                            "memory server restarted: the pages it held are gone"
                        );
                    }
                    return Ok(c);
                }
                Err(e) => last = e,
            }
        }
        Err(Failed::Retry(last))
    }

    /// Runs `f` on a pooled or new connection, retrying network failures within
    /// the bound (module docs).
    fn call<T>(&self, mut f: impl FnMut(&mut Conn) -> Result<T, Failed>) -> Result<T, TierError> {
        let start = Instant::now();
        let mut backoff = self.cfg.backoff;
        let mut last_io: Option<io::Error> = None;
        let mut last_corrupt: Option<(PageKey, u32, u32)> = None;
        let attempts = self.cfg.attempts.max(1);
        for attempt in 1..=attempts {
            if attempt > 1 {
                self.retries.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(self.cfg.max_backoff);
            }
            let pooled = self.pooled();
            let failed = match pooled.map_or_else(|| self.open(), Ok) {
                Err(e) => e,
                Ok(mut conn) => match f(&mut conn) {
                    Ok(v) => {
                        self.put_back(conn);
                        return Ok(v);
                    }
                    Err(Failed::Answer(e)) => {
                        self.put_back(conn);
                        return Err(e);
                    }
                    Err(e) => e,
                },
            };
            match failed {
                Failed::Answer(e) | Failed::Broken(e) => return Err(e),
                Failed::Retry(e) => {
                    tracing::debug!(addr = %self.cfg.addr, attempt, error = %e, "memserver request failed");
                    last_io = Some(e);
                    last_corrupt = None;
                }
                Failed::RetryCorrupt {
                    key,
                    expected,
                    actual,
                } => {
                    self.corrupt.fetch_add(1, Ordering::Relaxed);
                    last_corrupt = Some((key, expected, actual));
                }
            }
        }
        if let Some((key, expected, actual)) = last_corrupt {
            return Err(TierError::Corrupt {
                key,
                expected,
                actual,
            });
        }
        Err(TierError::Unreachable {
            addr: self.cfg.addr.clone(),
            attempts,
            elapsed_ms: start.elapsed().as_millis() as u64,
            source: last_io.unwrap_or_else(|| io::Error::other("no attempt made")),
        })
    }

    /// The most recently used pooled connection that the server has not closed for
    /// idleness (older ones are dropped).
    fn pooled(&self) -> Option<Conn> {
        let reuse = Duration::from_millis(self.reuse_ms.load(Ordering::Relaxed));
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(c) = pool.pop() {
            if c.used.elapsed() < reuse {
                return Some(c);
            }
        }
        None
    }

    fn put_back(&self, mut c: Conn) {
        c.used = Instant::now();
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < self.cfg.max_idle_conns {
            pool.push(c);
        }
    }

    fn request(&self, op: Op, key: PageKey, payload: Vec<u8>) -> Request {
        Request {
            op,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            key,
            crc: checksum(&payload),
            payload,
        }
    }

    fn read_answer(&self, c: &mut Conn, id: u64) -> Result<Response, Failed> {
        let resp = wire::read_response(&mut c.r, &mut c.rx).map_err(|e| {
            if e.kind() == io::ErrorKind::InvalidData && !channel::Unopened::is(&e) {
                Failed::Broken(self.protocol(e.to_string()))
            } else {
                Failed::Retry(e)
            }
        })?;
        if resp.id != id {
            return Err(Failed::Broken(self.protocol(format!(
                "answer to request {} where {id} was expected",
                resp.id
            ))));
        }
        Ok(resp)
    }

    /// Sends one request and reads its answer; maps error statuses.
    fn round_trip(
        &self,
        c: &mut Conn,
        op: Op,
        key: PageKey,
        payload: Vec<u8>,
    ) -> Result<Response, Failed> {
        let req = self.request(op, key, payload);
        wire::write_request(&mut c.w, &mut c.tx, &req)?;
        c.w.flush()?;
        let resp = self.read_answer(c, req.id)?;
        self.check_status(op, key, resp)
    }

    fn check_status(&self, op: Op, key: PageKey, resp: Response) -> Result<Response, Failed> {
        let two_u32 = |p: &[u8]| -> (u32, u32) {
            if p.len() == 8 {
                (
                    u32::from_le_bytes(p[0..4].try_into().expect("4 bytes")),
                    u32::from_le_bytes(p[4..8].try_into().expect("4 bytes")),
                )
            } else {
                (0, 0)
            }
        };
        match resp.status {
            Status::Ok => Ok(resp),
            Status::NotFound => Err(Failed::Answer(TierError::NotFound { key })),
            Status::Corrupt if op == Op::Store => {
                // The server saw the page damaged in transit: send it again.
                let (expected, actual) = two_u32(&resp.payload);
                Err(Failed::RetryCorrupt {
                    key,
                    expected,
                    actual,
                })
            }
            Status::Corrupt => {
                let (expected, actual) = two_u32(&resp.payload);
                self.corrupt.fetch_add(1, Ordering::Relaxed);
                Err(Failed::Answer(TierError::Corrupt {
                    key,
                    expected,
                    actual,
                }))
            }
            Status::Full => {
                let p = &resp.payload;
                let (capacity_bytes, used_bytes) = if p.len() == 16 {
                    (
                        u64::from_le_bytes(p[0..8].try_into().expect("8 bytes")),
                        u64::from_le_bytes(p[8..16].try_into().expect("8 bytes")),
                    )
                } else {
                    (0, 0)
                };
                Err(Failed::Answer(TierError::Full {
                    capacity_bytes,
                    used_bytes,
                }))
            }
            Status::BadRequest | Status::Internal => Err(Failed::Answer(TierError::Server {
                addr: self.cfg.addr.clone(),
                message: String::from_utf8_lossy(&resp.payload).into_owned(),
            })),
        }
    }

    fn check_size(&self, key: PageKey, len: usize) -> Result<(), TierError> {
        if len == self.cfg.page_bytes {
            Ok(())
        } else {
            Err(TierError::WrongSize {
                key,
                expected: self.cfg.page_bytes,
                got: len,
            })
        }
    }
}

impl SlowTier for RemoteTier {
    fn name(&self) -> &'static str {
        "remote"
    }

    fn page_bytes(&self) -> usize {
        self.cfg.page_bytes
    }

    fn store(&self, key: PageKey, data: &[u8]) -> Result<(), TierError> {
        self.store_batch(&[(key, data)])
    }

    /// Pipelines the batch: every store is written, then every answer read, in one
    /// round trip. A network failure retries the whole batch (stores are idempotent).
    fn store_batch(&self, pages: &[(PageKey, &[u8])]) -> Result<(), TierError> {
        for (key, data) in pages {
            self.check_size(*key, data.len())?;
        }
        if pages.is_empty() {
            return Ok(());
        }
        self.call(|c| {
            let reqs: Vec<Request> = pages
                .iter()
                .map(|(key, data)| self.request(Op::Store, *key, data.to_vec()))
                .collect();
            for r in &reqs {
                wire::write_request(&mut c.w, &mut c.tx, r)?;
            }
            c.w.flush()?;
            // Read every answer (keeping the connection in sync), report the first
            // failure.
            let mut first_err: Option<Failed> = None;
            for r in &reqs {
                let resp = self.read_answer(c, r.id)?;
                if let Err(e) = self.check_status(Op::Store, r.key, resp) {
                    first_err.get_or_insert(e);
                }
            }
            match first_err {
                None => Ok(()),
                Some(e) => Err(e),
            }
        })?;
        self.stores.fetch_add(pages.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn load(&self, key: PageKey, out: &mut [u8]) -> Result<(), TierError> {
        self.check_size(key, out.len())?;
        self.call(|c| {
            let resp = self.round_trip(c, Op::Load, key, Vec::new())?;
            if resp.payload.len() != out.len() {
                return Err(Failed::Broken(
                    self.protocol(format!("{key}: page of {} bytes", resp.payload.len())),
                ));
            }
            let actual = checksum(&resp.payload);
            if actual != resp.crc {
                return Err(Failed::RetryCorrupt {
                    key,
                    expected: resp.crc,
                    actual,
                });
            }
            out.copy_from_slice(&resp.payload);
            Ok(())
        })?;
        self.loads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn remove(&self, key: PageKey) -> Result<bool, TierError> {
        let resp = self.call(|c| self.round_trip(c, Op::Remove, key, Vec::new()))?;
        Ok(resp.payload.first() == Some(&1))
    }

    fn remove_region(&self, region: u64) -> Result<u64, TierError> {
        let resp = self
            .call(|c| self.round_trip(c, Op::RemoveRegion, PageKey::new(region, 0), Vec::new()))?;
        let b: [u8; 8] = resp
            .payload
            .as_slice()
            .try_into()
            .map_err(|_| self.protocol("remove region answered no count".into()))?;
        Ok(u64::from_le_bytes(b))
    }

    /// Asks [`RemoteConfig::list_batch`] indices at a time, from index 0, until an
    /// answer is shorter than asked; each request is retried within the bound.
    fn list_region(&self, region: u64) -> Result<Vec<u64>, TierError> {
        let batch = self.cfg.list_batch.clamp(1, wire::LIST_MAX_PAGES);
        let mut pages: Vec<u64> = Vec::new();
        let mut from = 0u64;
        loop {
            let key = PageKey::new(region, from);
            let resp = self.call(|c| {
                let resp = self.round_trip(c, Op::ListRegion, key, batch.to_le_bytes().to_vec())?;
                let actual = checksum(&resp.payload);
                if actual != resp.crc {
                    // Damaged in transit: ask again on a fresh connection.
                    return Err(Failed::Retry(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "listing of region {region} from page {from} damaged in transit (CRC-32 {:#010x}, read {actual:#010x})",
                            resp.crc
                        ),
                    )));
                }
                Ok(resp)
            })?;
            let p = &resp.payload;
            if p.len() % 8 != 0 || p.len() / 8 > batch as usize {
                return Err(self.protocol(format!(
                    "listing of region {region} of {} bytes, asked for at most {batch} indices",
                    p.len()
                )));
            }
            let got = p.len() / 8;
            for b in p.chunks_exact(8) {
                let page = u64::from_le_bytes(b.try_into().expect("8 bytes"));
                let ascending = match pages.last() {
                    Some(&last) => page > last,
                    None => true,
                };
                if page < from || !ascending {
                    return Err(self.protocol(format!(
                        "listing of region {region} from page {from} holds page {page} out of order"
                    )));
                }
                pages.push(page);
            }
            if got < batch as usize {
                return Ok(pages);
            }
            match pages.last().and_then(|l| l.checked_add(1)) {
                Some(next) => from = next,
                None => return Ok(pages), // Listed up to page u64::MAX.
            }
        }
    }

    /// `true`: the pages live in the memory server's process (module docs); unless
    /// the server is too old to tell its instance (a restart would go unnoticed).
    fn durable(&self) -> bool {
        self.instance.load(Ordering::Acquire) != 0
    }

    /// The instance id the server answered at the last connection (random per
    /// server start).
    fn instance(&self) -> u64 {
        self.instance.load(Ordering::Acquire)
    }

    /// Client-side counters; `pages` and `stored_bytes` are the server's business
    /// and read 0 here: see [`RemoteTier::server_stats`].
    fn stats(&self) -> TierStats {
        TierStats {
            pages: 0,
            stored_bytes: 0,
            stores: self.stores.load(Ordering::Relaxed),
            loads: self.loads.load(Ordering::Relaxed),
            corrupt: self.corrupt.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::Secret;
    use crate::compressed::CompressedStore;
    use crate::memserver::{MemServer, MemServerHandle, ServerConfig};
    use std::net::TcpListener;
    use std::sync::Arc;

    const PAGE: usize = 4096;

    fn page(seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..PAGE)
            .map(|i| {
                if i % 64 < 32 {
                    (i as u64 ^ seed) as u8
                } else {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                }
            })
            .collect()
    }

    fn server(capacity: u64) -> (MemServerHandle, Arc<CompressedStore>) {
        let store = Arc::new(CompressedStore::new(PAGE, capacity));
        let h = MemServer::bind(
            "127.0.0.1:0",
            store.clone(),
            ServerConfig::new(auth(), capacity),
        )
        .unwrap()
        .spawn()
        .unwrap();
        (h, store)
    }

    fn auth() -> Auth {
        Auth::Secret(Arc::new(Secret::from_bytes(vec![5; 32]).unwrap()))
    }

    /// Serves every connection of `l` through the handshake with `serve`, which
    /// answers each request (a fake server).
    fn fake_server(
        serve: impl Fn(Request) -> Response + Send + Sync + 'static,
    ) -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let serve = Arc::new(serve);
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let serve = serve.clone();
                std::thread::spawn(move || {
                    let Ok(mut k) = channel::server_handshake(&mut s, &auth()) else {
                        return;
                    };
                    let mut r = BufReader::new(s.try_clone().unwrap());
                    let mut w = s;
                    while let Ok(Some(req)) = wire::read_request(&mut r, &mut k.recv) {
                        if wire::write_response(&mut w, &mut k.send, &serve(req)).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// Short timeouts and back-offs so failure tests finish quickly.
    fn quick(addr: impl ToString) -> RemoteConfig {
        RemoteConfig {
            connect_timeout: Duration::from_millis(300),
            io_timeout: Duration::from_millis(500),
            attempts: 3,
            backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(40),
            ..RemoteConfig::new(addr.to_string(), PAGE, auth())
        }
    }

    #[test]
    fn round_trips_batches_and_removal() {
        let (h, store) = server(64 << 20);
        let t = RemoteTier::connect(quick(h.addr())).unwrap();
        let pages: Vec<Vec<u8>> = (0..64).map(page).collect();
        t.store(PageKey::new(1, 0), &pages[0]).unwrap();
        let batch: Vec<(PageKey, &[u8])> = (1..64)
            .map(|i| (PageKey::new(1, i as u64), pages[i].as_slice()))
            .collect();
        t.store_batch(&batch).unwrap();
        t.store(PageKey::new(2, 0), &vec![0u8; PAGE]).unwrap();
        let mut out = vec![0u8; PAGE];
        for (i, p) in pages.iter().enumerate() {
            t.load(PageKey::new(1, i as u64), &mut out).unwrap();
            assert_eq!(&out, p, "page {i}");
        }
        t.load(PageKey::new(2, 0), &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        assert_eq!(store.stats().pages, 65);
        let ss = t.server_stats().unwrap();
        assert_eq!((ss.pages, ss.stores, ss.loads), (65, 65, 65));
        assert!(t.remove(PageKey::new(1, 0)).unwrap());
        assert!(!t.remove(PageKey::new(1, 0)).unwrap());
        assert_eq!(t.remove_region(1).unwrap(), 63);
        assert!(matches!(
            t.load(PageKey::new(1, 5), &mut out),
            Err(TierError::NotFound { key }) if key == PageKey::new(1, 5)
        ));
        let st = t.stats();
        assert_eq!((st.stores, st.loads, st.retries), (65, 65, 0));
    }

    #[test]
    fn page_size_mismatch_is_refused_at_connect() {
        let (h, _) = server(1 << 20);
        let r = RemoteTier::connect(RemoteConfig {
            page_bytes: 8192,
            ..quick(h.addr())
        });
        match r {
            Err(TierError::Server { message, .. }) => {
                assert!(message.contains("page size mismatch"), "{message}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("connected with the wrong page size"),
        }
    }

    #[test]
    fn corruption_at_rest_is_reported_not_retried() {
        let (h, store) = server(1 << 20);
        let t = RemoteTier::connect(quick(h.addr())).unwrap();
        let k = PageKey::new(4, 4);
        t.store(k, &page(4)).unwrap();
        store.corrupt_for_test(k);
        let mut out = vec![0xAAu8; PAGE];
        match t.load(k, &mut out) {
            Err(TierError::Corrupt { key, .. }) => assert_eq!(key, k),
            other => panic!("{other:?}"),
        }
        assert!(
            out.iter().all(|&b| b == 0xAA),
            "corrupt bytes were handed back"
        );
        assert_eq!(t.stats().retries, 0);
    }

    /// A server's hello answer: the page size asked, an instance id, an idle timeout.
    fn hello(req: &Request) -> Vec<u8> {
        [
            &req.payload[..],
            &7u64.to_le_bytes(),
            &60_000u32.to_le_bytes(),
        ]
        .concat()
    }

    /// A server that answers hellos properly and every load with a damaged page.
    fn lying_server() -> std::net::SocketAddr {
        fake_server(|req| {
            let mut resp = Response {
                status: Status::Ok,
                id: req.id,
                crc: 0,
                payload: req.payload.clone(),
            };
            if req.op == Op::Hello {
                resp.payload = hello(&req);
            }
            if req.op == Op::Load {
                let p = page(1);
                resp.crc = checksum(&p) ^ 0x0100;
                resp.payload = p;
            }
            resp
        })
    }

    #[test]
    fn corruption_in_transit_is_retried_then_reported() {
        let t = RemoteTier::connect(quick(lying_server())).unwrap();
        let mut out = vec![0xAAu8; PAGE];
        match t.load(PageKey::new(1, 1), &mut out) {
            Err(TierError::Corrupt {
                expected, actual, ..
            }) => assert_ne!(expected, actual),
            other => panic!("{other:?}"),
        }
        assert!(
            out.iter().all(|&b| b == 0xAA),
            "damaged bytes were handed back"
        );
        assert_eq!(t.stats().retries, 2);
        assert_eq!(t.stats().corrupt, 3);
    }

    /// A server that answers hellos properly and every list-region request with
    /// `listing` as its payload, under a CRC-32 flipped if `damaged`.
    fn listing_server(listing: Vec<u8>, damaged: bool) -> std::net::SocketAddr {
        fake_server(move |req| {
            let payload = match req.op {
                Op::ListRegion => listing.clone(),
                Op::Hello => hello(&req),
                _ => req.payload.clone(),
            };
            Response {
                status: Status::Ok,
                id: req.id,
                crc: checksum(&payload) ^ u32::from(damaged),
                payload,
            }
        })
    }

    fn le(indices: &[u64]) -> Vec<u8> {
        indices.iter().flat_map(|p| p.to_le_bytes()).collect()
    }

    #[test]
    fn malformed_listings_are_protocol_errors() {
        let cases = [
            ("descending", le(&[4, 3])),
            ("repeated", le(&[4, 4])),
            ("more than asked", le(&[1, 2, 3, 4, 5])),
            ("not whole u64s", vec![1u8; 7]),
        ];
        for (what, listing) in cases {
            let t = RemoteTier::connect(RemoteConfig {
                list_batch: 4,
                ..quick(listing_server(listing, false))
            })
            .unwrap();
            match t.list_region(1) {
                Err(TierError::Protocol { reason, .. }) => {
                    assert!(reason.contains("listing of region 1"), "{what}: {reason}")
                }
                other => panic!("{what}: {other:?}"),
            }
            assert_eq!(t.stats().retries, 0, "{what}");
        }
        // A well-formed short listing from a fake server is taken as it is.
        let t = RemoteTier::connect(RemoteConfig {
            list_batch: 4,
            ..quick(listing_server(le(&[2, 9]), false))
        })
        .unwrap();
        assert_eq!(t.list_region(1).unwrap(), [2, 9]);
    }

    #[test]
    fn damaged_listing_is_retried_then_given_up() {
        let t = RemoteTier::connect(quick(listing_server(le(&[1, 2]), true))).unwrap();
        match t.list_region(3) {
            Err(TierError::Unreachable {
                attempts, source, ..
            }) => {
                assert_eq!(attempts, 3);
                assert!(
                    source.to_string().contains("damaged in transit"),
                    "{source}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t.stats().retries, 2);
    }

    #[test]
    fn killed_server_gives_a_clear_error_within_the_bound_never_zeros() {
        let (h, _) = server(1 << 20);
        let addr = h.addr();
        let cfg = quick(addr);
        let bound = cfg.retry_bound();
        let t = RemoteTier::connect(cfg).unwrap();
        let first = t.instance();
        assert_ne!(first, 0, "the hello answered no instance");
        let k = PageKey::new(9, 9);
        t.store(k, &page(9)).unwrap();
        h.stop();
        let mut out = vec![0xAAu8; PAGE];
        let start = Instant::now();
        let err = t.load(k, &mut out).unwrap_err();
        let took = start.elapsed();
        match &err {
            TierError::Unreachable {
                addr: a, attempts, ..
            } => {
                assert_eq!(a, &addr.to_string());
                assert_eq!(*attempts, 3);
            }
            other => panic!("{other}"),
        }
        assert!(took <= bound, "gave up after {took:?}, bound {bound:?}");
        assert!(err.to_string().contains("unreachable"), "{err}");
        assert!(out.iter().all(|&b| b == 0xAA));
        // Stores are refused too: the caller keeps its page.
        assert!(matches!(
            t.store(k, &page(9)),
            Err(TierError::Unreachable { .. })
        ));
        // A server restarted on the same port has lost the page: not found, not zeros.
        let store = Arc::new(CompressedStore::new(PAGE, 1 << 20));
        let h2 = MemServer::bind(addr, store, ServerConfig::new(auth(), 1 << 20))
            .unwrap()
            .spawn()
            .unwrap();
        assert!(matches!(
            t.load(k, &mut out),
            Err(TierError::NotFound { .. })
        ));
        assert!(out.iter().all(|&b| b == 0xAA));
        // ... and tells it by its instance: a region recovered against it is refused.
        assert_ne!(t.instance(), first);
        assert_ne!(t.instance(), 0);
        t.store(k, &page(10)).unwrap();
        t.load(k, &mut out).unwrap();
        assert_eq!(out, page(10));
        drop(h2);
    }

    #[test]
    fn stale_pooled_connections_are_replaced() {
        let (h, _) = server(1 << 20);
        let addr = h.addr();
        let t = RemoteTier::connect(quick(addr)).unwrap();
        t.store(PageKey::new(1, 1), &page(1)).unwrap();
        h.stop();
        let _h2 = MemServer::bind(
            addr,
            Arc::new(CompressedStore::new(PAGE, 1 << 20)),
            ServerConfig::new(auth(), 1 << 20),
        )
        .unwrap()
        .spawn()
        .unwrap();
        // The pooled connection is dead; the retry opens a new one.
        t.store(PageKey::new(1, 1), &page(2)).unwrap();
        assert!(t.stats().retries >= 1);
    }

    #[test]
    fn full_server_refuses_and_keeps_nothing() {
        let (h, store) = server(PAGE as u64 + 100);
        let t = RemoteTier::connect(quick(h.addr())).unwrap();
        let mut x = 7u64;
        let random: Vec<u8> = (0..PAGE)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        t.store(PageKey::new(1, 0), &random).unwrap();
        match t.store(PageKey::new(1, 1), &random) {
            Err(TierError::Full { capacity_bytes, .. }) => {
                assert_eq!(capacity_bytes, PAGE as u64 + 100)
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(store.stats().pages, 1);
    }

    #[test]
    fn wrong_sizes_fail_locally() {
        let (h, _) = server(1 << 20);
        let t = RemoteTier::connect(quick(h.addr())).unwrap();
        assert!(matches!(
            t.store(PageKey::new(1, 1), &[0u8; 10]),
            Err(TierError::WrongSize { .. })
        ));
    }

    #[test]
    fn concurrent_clients_share_the_pool() {
        let (h, _) = server(64 << 20);
        let t = Arc::new(RemoteTier::connect(quick(h.addr())).unwrap());
        let threads: Vec<_> = (0..4u64)
            .map(|n| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let mut out = vec![0u8; PAGE];
                    for i in 0..200 {
                        let k = PageKey::new(n, i);
                        let p = page(n * 1000 + i);
                        t.store(k, &p).unwrap();
                        t.load(k, &mut out).unwrap();
                        assert_eq!(out, p);
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(t.server_stats().unwrap().pages, 800);
    }

    #[test]
    fn unreachable_at_connect() {
        // A port with nothing listening (bound, then closed).
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        match RemoteTier::connect(quick(addr)) {
            Err(TierError::Unreachable { attempts: 3, .. }) => {}
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("connected to nothing"),
        }
    }

    #[test]
    fn retry_bound_of_the_defaults() {
        let c = RemoteConfig::new("x:1", PAGE, Auth::InsecureNoAuth);
        // 5 × (1 s + 2 × 2 s) + 50 + 100 + 200 + 400 ms.
        assert_eq!(c.retry_bound(), Duration::from_millis(25_750));
    }
}
