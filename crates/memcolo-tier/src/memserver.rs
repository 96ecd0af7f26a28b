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
//! One thread per connection; a connection serves pipelined requests in order and
//! flushes its answers whenever no request is waiting in its buffer.
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

use crate::wire::{self, Op, Request, Response, Status};
use crate::{checksum, SlowTier, TierError};
use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

struct Shared {
    /// This server's instance: random, answered in every hello, so that a client
    /// can tell a restarted (empty) server from the one that holds its pages.
    instance: u64,
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
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
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl MemServer {
    /// Binds `addr` (e.g. `0.0.0.0:7070`, or port 0 for any free port) with `backend`
    /// holding the pages.
    ///
    /// # Errors
    /// The bind's I/O error.
    pub fn bind(addr: impl ToSocketAddrs, backend: Arc<dyn SlowTier>) -> io::Result<Self> {
        Ok(MemServer {
            listener: TcpListener::bind(addr)?,
            backend,
            shared: Arc::new(Shared {
                instance: new_instance(),
                stop: AtomicBool::new(false),
                conns: Mutex::new(HashMap::new()),
                next_conn: AtomicU64::new(0),
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
    /// [`MemServerHandle`]); each connection gets a thread.
    ///
    /// # Errors
    /// An I/O error of the listening socket.
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
                    continue;
                }
            };
            let id = self.shared.next_conn.fetch_add(1, Ordering::Relaxed);
            if let Ok(clone) = stream.try_clone() {
                lock(&self.shared.conns).insert(id, clone);
            }
            let backend = self.backend.clone();
            let shared = self.shared.clone();
            std::thread::Builder::new()
                .name(format!("memserver-conn-{id}"))
                .spawn(move || {
                    let peer = stream.peer_addr().ok();
                    if let Err(e) = serve_conn(stream, &*backend, shared.instance) {
                        if !shared.stop.load(Ordering::Acquire) {
                            tracing::debug!(?peer, error = %e, "memserver: connection closed");
                        }
                    }
                    lock(&shared.conns).remove(&id);
                })?;
        }
        Ok(())
    }

    /// Runs the server on a new thread.
    ///
    /// # Errors
    /// The socket's or the thread spawn's I/O error.
    pub fn spawn(self) -> io::Result<MemServerHandle> {
        let addr = self.local_addr()?;
        let shared = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name("memserver".into())
            .spawn(move || self.run())?;
        Ok(MemServerHandle {
            addr,
            shared,
            thread: Some(thread),
        })
    }
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
    use std::hash::BuildHasher;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::collections::hash_map::RandomState::new()
        .hash_one((now, std::process::id()))
        .max(1)
}

fn serve_conn(stream: TcpStream, backend: &dyn SlowTier, instance: u64) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut r = BufReader::new(stream.try_clone()?);
    let mut w = BufWriter::new(stream);
    let mut page = vec![0u8; backend.page_bytes()];
    while let Some(req) = wire::read_request(&mut r)? {
        let resp = handle(&req, backend, &mut page, instance);
        wire::write_response(&mut w, &resp)?;
        if r.buffer().is_empty() {
            w.flush()?;
        }
    }
    w.flush()
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

fn handle(req: &Request, backend: &dyn SlowTier, page: &mut [u8], instance: u64) -> Response {
    let id = req.id;
    match req.op {
        Op::Hello => {
            let ours = backend.page_bytes() as u32;
            let theirs = req
                .payload
                .get(..4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
            if theirs == Some(ours) {
                let mut p = ours.to_le_bytes().to_vec();
                p.extend_from_slice(&instance.to_le_bytes());
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
                return reply(id, Status::Corrupt, p);
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
                    return reply(
                        id,
                        Status::BadRequest,
                        format!("list region: payload of {n} bytes, expected 0 or 4").into_bytes(),
                    )
                }
            };
            if asked == 0 {
                return reply(
                    id,
                    Status::BadRequest,
                    b"list region: asked for 0 indices".to_vec(),
                );
            }
            let n = asked.min(wire::LIST_MAX_PAGES) as usize;
            match backend.list_region(req.key.region) {
                Ok(pages) => {
                    let from = pages.partition_point(|&p| p < req.key.page);
                    let p: Vec<u8> = pages[from..]
                        .iter()
                        .take(n)
                        .flat_map(|v| v.to_le_bytes())
                        .collect();
                    reply(id, Status::Ok, p)
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compressed::CompressedStore;
    use crate::PageKey;

    const PAGE: usize = 64;

    /// Sends `req` on a raw connection and reads the answer.
    fn ask(stream: &TcpStream, req: &Request) -> Response {
        let mut w = stream;
        wire::write_request(&mut w, req).unwrap();
        let mut r = stream;
        wire::read_response(&mut r).unwrap()
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
        let h = MemServer::bind("127.0.0.1:0", store)
            .unwrap()
            .spawn()
            .unwrap();
        let c = TcpStream::connect(h.addr()).unwrap();
        // No payload: up to LIST_MAX_PAGES indices.
        assert_eq!(
            indices(&ask(&c, &list(3, 0, Vec::new()))),
            [2, 5, 7, 9, 1 << 40]
        );
        // A first index and a count: a page of the listing.
        assert_eq!(
            indices(&ask(&c, &list(3, 3, 2u32.to_le_bytes().to_vec()))),
            [5, 7]
        );
        assert_eq!(
            indices(&ask(&c, &list(3, 8, 9u32.to_le_bytes().to_vec()))),
            [9, 1 << 40]
        );
        assert_eq!(
            indices(&ask(&c, &list(3, (1 << 40) + 1, Vec::new()))),
            Vec::<u64>::new()
        );
        // A region the server holds nothing of: no indices, not "not found".
        assert_eq!(
            indices(&ask(&c, &list(77, 0, Vec::new()))),
            Vec::<u64>::new()
        );
        // Bad requests are refused and the connection stays usable.
        let zero = ask(&c, &list(3, 0, 0u32.to_le_bytes().to_vec()));
        assert_eq!(zero.status, Status::BadRequest);
        let odd = ask(&c, &list(3, 0, vec![1, 2, 3]));
        assert_eq!(odd.status, Status::BadRequest);
        assert_eq!(indices(&ask(&c, &list(4, 0, Vec::new()))), [6]);
    }
}
