//! memcached as the latency-critical service: a real `memcached` started in the
//! node's `lc/` group, and a pipelined client of its text protocol for the open-loop
//! load generator.
//!
//! The client multiplexes any number of outstanding requests on one TCP connection:
//! memcached answers the requests of a connection in order, so a writer task records
//! each request's completion slot in a FIFO before it sends the request and a reader
//! task fills the slots as the answers arrive. That keeps the load open-loop with a
//! handful of connections, as the Redis client does; the crates.io memcached clients
//! take `&mut self` per request (one outstanding request per connection), which would
//! turn a stalled server into coordinated omission. Commands used: `get <key>`
//! (`VALUE <key> <flags> <bytes>` + data + `END`, or `END` for a miss) and
//! `set <key> 0 0 <bytes>` + data (`STORED`); `ERROR`, `CLIENT_ERROR …` and
//! `SERVER_ERROR …` answers are errors.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::error::{BenchError, Result};
use crate::process::{spawn, ChildGuard, ChildPlacement};

/// A running `memcached`; killed when dropped.
#[derive(Debug)]
pub struct MemcachedServer {
    child: ChildGuard,
    pid: i32,
    port: u16,
}

impl MemcachedServer {
    /// Starts `exe` (normally `memcached`) on a free port of 127.0.0.1 with one worker
    /// thread and `memory_mib` MiB of item memory (`-m`; allocated as items arrive),
    /// placed as `place`, logging to `log`.
    pub fn start(
        exe: &Path,
        place: &ChildPlacement<'_>,
        log: &Path,
        memory_mib: u64,
        launch: &crate::service::LcLaunch,
    ) -> Result<Self> {
        let port = crate::service::free_port()?;
        let log_file = std::fs::File::create(log).map_err(|e| BenchError::io(log, e))?;
        let mut cmd = launch.command(exe);
        cmd.args(["-p", &port.to_string()])
            .args(["-l", "127.0.0.1"])
            .args(["-U", "0"])
            .args(["-t", "1"])
            .args(["-c", "4096"])
            .args(["-m", &memory_mib.max(64).to_string()])
            .args(["-u", "root"])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(|e| BenchError::io(log, e))?)
            .stderr(log_file);
        let mut child = spawn(&mut cmd, "memcached", place)?;
        let pid = launch.server_pid(&mut child, Duration::from_secs(10))?;
        Ok(MemcachedServer { child, pid, port })
    }

    /// The server's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Opens `n` pipelined connections, retrying until the server accepts them or
    /// `timeout` passes. Must be called inside a tokio runtime (the connection tasks
    /// run on it).
    pub async fn connect(&mut self, n: usize, timeout: Duration) -> Result<Vec<McConn>> {
        let end = Instant::now() + timeout;
        let addr = format!("127.0.0.1:{}", self.port);
        let mut conns = Vec::new();
        while conns.len() < n {
            if let Some(st) = self.child.try_wait()? {
                return Err(BenchError::Process(format!(
                    "memcached exited at start: {st}"
                )));
            }
            crate::signal::check()?;
            match TcpStream::connect(&addr).await {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    let c = McConn::new(s);
                    // The server answers: it is up.
                    c.get("memcolo:ping")
                        .await
                        .map_err(|e| BenchError::Process(format!("memcached: {e}")))?;
                    conns.push(c);
                }
                Err(e) if Instant::now() >= end => return Err(BenchError::io(&addr, e)),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        Ok(conns)
    }

    /// Fails if the server has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            Some(st) => Err(BenchError::Process(format!("memcached exited: {st}"))),
            None => Ok(()),
        }
    }
}

/// An answer: `Ok(Some(len))` for a hit, `Ok(None)` for a miss or `STORED`.
type Reply = std::result::Result<Option<usize>, String>;
type Slot = oneshot::Sender<Reply>;

/// One pipelined connection; cheap to clone (clones share the connection).
#[derive(Clone, Debug)]
pub struct McConn {
    tx: mpsc::UnboundedSender<(Vec<u8>, Slot)>,
}

impl McConn {
    fn new(stream: TcpStream) -> McConn {
        let (rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<(Vec<u8>, Slot)>();
        let pending: Arc<Mutex<VecDeque<Slot>>> = Arc::default();
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p, c) = (pending.clone(), closed.clone());
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some((bytes, slot)) = rx.recv().await {
                // Coalesce what is already queued into one write.
                buf.clear();
                buf.extend_from_slice(&bytes);
                p.lock().unwrap().push_back(slot);
                while let Ok((more, slot)) = rx.try_recv() {
                    buf.extend_from_slice(&more);
                    p.lock().unwrap().push_back(slot);
                    if buf.len() > 1 << 20 {
                        break;
                    }
                }
                if let Err(e) = wr.write_all(&buf).await {
                    fail_all(&p, &format!("write: {e}"));
                    return;
                }
                // The reader is gone: nothing will answer what was just queued.
                if c.load(std::sync::atomic::Ordering::SeqCst) {
                    fail_all(&p, "connection closed by memcached");
                }
            }
        });
        tokio::spawn(async move {
            let mut rd = BufReader::new(rd);
            let err = loop {
                let reply = match read_reply(&mut rd).await {
                    Ok(r) => r,
                    Err(e) => break e,
                };
                if let Some(tx) = pending.lock().unwrap().pop_front() {
                    let _ = tx.send(reply);
                }
            };
            closed.store(true, std::sync::atomic::Ordering::SeqCst);
            fail_all(&pending, &err);
        });
        McConn { tx }
    }

    fn submit(&self, bytes: Vec<u8>) -> oneshot::Receiver<Reply> {
        let (tx, rx) = oneshot::channel();
        if let Err(mpsc::error::SendError((_, tx))) = self.tx.send((bytes, tx)) {
            let _ = tx.send(Err("connection closed".into()));
        }
        rx
    }

    /// `get key`: `Ok(Some(len))` on a hit, `Ok(None)` on a miss.
    pub async fn get(&self, key: &str) -> std::result::Result<Option<usize>, String> {
        let rx = self.submit(format!("get {key}\r\n").into_bytes());
        rx.await.unwrap_or_else(|_| Err("connection closed".into()))
    }

    /// Sends `set key 0 0 <len>` with `value` without waiting; the receiver completes
    /// when memcached answers.
    pub fn set_pipelined(&self, key: &str, value: &[u8]) -> oneshot::Receiver<Reply> {
        let mut b = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        b.extend_from_slice(value);
        b.extend_from_slice(b"\r\n");
        self.submit(b)
    }

    /// `set key 0 0 <len>` with `value`.
    pub async fn set(&self, key: &str, value: &[u8]) -> std::result::Result<(), String> {
        self.set_pipelined(key, value)
            .await
            .unwrap_or_else(|_| Err("connection closed".into()))
            .map(|_| ())
    }
}

fn fail_all(pending: &Mutex<VecDeque<Slot>>, why: &str) {
    for tx in pending.lock().unwrap().drain(..) {
        let _ = tx.send(Err(why.to_string()));
    }
}

/// Reads one answer. `Err` only when the connection is unusable (closed, garbled);
/// a protocol error answer is `Ok(Err(..))`.
async fn read_reply<R: AsyncBufReadExt + AsyncReadExt + Unpin>(
    rd: &mut R,
) -> std::result::Result<Reply, String> {
    let mut line = String::new();
    let mut len = None;
    loop {
        line.clear();
        let n = rd
            .read_line(&mut line)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("connection closed by memcached".into());
        }
        let l = line.trim_end();
        if l == "END" || l == "STORED" {
            return Ok(Ok(len));
        }
        if l == "ERROR"
            || l == "NOT_STORED"
            || l.starts_with("CLIENT_ERROR")
            || l.starts_with("SERVER_ERROR")
        {
            return Ok(Err(l.to_string()));
        }
        if let Some(rest) = l.strip_prefix("VALUE ") {
            let bytes: usize = rest
                .split_whitespace()
                .nth(2)
                .and_then(|b| b.parse().ok())
                .ok_or_else(|| format!("bad VALUE line {l:?}"))?;
            let mut data = vec![0u8; bytes + 2];
            rd.read_exact(&mut data)
                .await
                .map_err(|e| format!("read: {e}"))?;
            len = Some(bytes);
            continue;
        }
        return Err(format!("unexpected answer {l:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(text: &[u8]) -> std::result::Result<Reply, String> {
        let mut rd = BufReader::new(text);
        read_reply(&mut rd).await
    }

    #[tokio::test]
    async fn answers_of_the_text_protocol() {
        assert_eq!(
            parse(b"VALUE key:1 0 5\r\nhello\r\nEND\r\n").await,
            Ok(Ok(Some(5)))
        );
        // A value may contain the terminator bytes.
        assert_eq!(
            parse(b"VALUE k 0 6\r\nEND\r\nx\r\nEND\r\n").await,
            Ok(Ok(Some(6)))
        );
        assert_eq!(parse(b"END\r\n").await, Ok(Ok(None)));
        assert_eq!(parse(b"STORED\r\n").await, Ok(Ok(None)));
        assert_eq!(
            parse(b"SERVER_ERROR out of memory storing object\r\n").await,
            Ok(Err("SERVER_ERROR out of memory storing object".into()))
        );
        assert!(parse(b"").await.is_err());
        assert!(parse(b"WHAT\r\n").await.is_err());
    }

    #[tokio::test]
    async fn pipelined_requests_complete_in_order_against_a_fake_server() {
        use tokio::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        // A fake server that answers two sets and a hit and a miss, in order, only
        // after it has read all four requests (so they are outstanding together).
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let (rd, mut wr) = s.into_split();
            let mut rd = BufReader::new(rd);
            let mut got = Vec::new();
            let mut line = String::new();
            while got.len() < 4 {
                line.clear();
                rd.read_line(&mut line).await.unwrap();
                if line.starts_with("set") {
                    let mut data = String::new();
                    rd.read_line(&mut data).await.unwrap();
                }
                got.push(line.trim_end().to_string());
            }
            wr.write_all(b"STORED\r\nSTORED\r\nVALUE a 0 3\r\nabc\r\nEND\r\nEND\r\n")
                .await
                .unwrap();
            got
        });
        let c = McConn::new(TcpStream::connect(addr).await.unwrap());
        let s1 = c.set_pipelined("a", b"abc");
        let s2 = c.set_pipelined("b", b"xy");
        let (g1, g2) = tokio::join!(c.get("a"), c.get("zz"));
        assert_eq!(s1.await.unwrap(), Ok(None));
        assert_eq!(s2.await.unwrap(), Ok(None));
        assert_eq!(g1, Ok(Some(3)));
        assert_eq!(g2, Ok(None));
        let got = server.await.unwrap();
        assert_eq!(got, vec!["set a 0 0 3", "set b 0 0 2", "get a", "get zz"]);
        // The server hung up: later requests fail instead of hanging.
        assert!(c.get("a").await.is_err());
    }
}
