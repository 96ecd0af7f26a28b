//! The latency-critical service: a real `redis-server` or `memcached`
//! ([`crate::memcached`]), started in the node's `lc/` group and preloaded with a
//! dataset; [`LcServer`] and [`LcConn`] hide which one the load generator talks to.
//!
//! Redis runs without persistence (`--save "" --appendonly no`) on a free port of
//! 127.0.0.1, so its memory is its dataset and allocator overhead (jemalloc in Debian's
//! build), the situation of Hermes §5.3. memcached keeps items in its slab allocator,
//! grown 1 MiB page by page as items arrive.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use crate::error::{BenchError, Result};
use crate::memcached::{McConn, MemcachedServer};
use crate::process::{spawn, ChildGuard, Placement};

/// Which LC service a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LcKind {
    Redis,
    Memcached,
}

impl LcKind {
    /// The service's name in results.
    pub fn as_str(self) -> &'static str {
        match self {
            LcKind::Redis => "redis",
            LcKind::Memcached => "memcached",
        }
    }
}

/// A running LC server of either kind; killed when dropped.
#[derive(Debug)]
pub enum LcServer {
    Redis(RedisServer),
    Memcached(MemcachedServer),
}

impl LcServer {
    /// Starts the service of `kind` from `exe`, placed as `place`, logging to `log`;
    /// `memory_mib` is memcached's item memory (`-m`).
    pub fn start(
        kind: LcKind,
        exe: &Path,
        place: &Placement<'_>,
        log: &Path,
        memory_mib: u64,
    ) -> Result<Self> {
        Ok(match kind {
            LcKind::Redis => LcServer::Redis(RedisServer::start(exe, place, log)?),
            LcKind::Memcached => {
                LcServer::Memcached(MemcachedServer::start(exe, place, log, memory_mib)?)
            }
        })
    }

    /// The server's pid.
    pub fn pid(&self) -> i32 {
        match self {
            LcServer::Redis(r) => r.pid(),
            LcServer::Memcached(m) => m.pid(),
        }
    }

    /// Opens `n` multiplexed connections (see the servers' `connect`).
    pub async fn connect(&mut self, n: usize, timeout: Duration) -> Result<Vec<LcConn>> {
        Ok(match self {
            LcServer::Redis(r) => r
                .connect(n, timeout)
                .await?
                .into_iter()
                .map(LcConn::Redis)
                .collect(),
            LcServer::Memcached(m) => m
                .connect(n, timeout)
                .await?
                .into_iter()
                .map(LcConn::Memcached)
                .collect(),
        })
    }

    /// Fails if the server has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self {
            LcServer::Redis(r) => r.check_alive(),
            LcServer::Memcached(m) => m.check_alive(),
        }
    }
}

/// A multiplexed connection to either service; cheap to clone.
#[derive(Clone)]
pub enum LcConn {
    Redis(MultiplexedConnection),
    Memcached(McConn),
}

impl LcConn {
    /// GET `key` (a miss is no error).
    pub async fn get(&mut self, key: &str) -> std::result::Result<(), String> {
        match self {
            LcConn::Redis(c) => redis::cmd("GET")
                .arg(key)
                .query_async::<Option<Vec<u8>>>(c)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            LcConn::Memcached(c) => c.get(key).await.map(|_| ()),
        }
    }

    /// SET `key` to `value`.
    pub async fn set(&mut self, key: &str, value: &[u8]) -> std::result::Result<(), String> {
        match self {
            LcConn::Redis(c) => redis::cmd("SET")
                .arg(key)
                .arg(value)
                .query_async::<()>(c)
                .await
                .map_err(|e| e.to_string()),
            LcConn::Memcached(c) => c.set(key, value).await,
        }
    }
}

/// A running `redis-server`; killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: ChildGuard,
    port: u16,
}

/// A port on 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| BenchError::io("127.0.0.1:0", e))?;
    let port = l
        .local_addr()
        .map_err(|e| BenchError::io("127.0.0.1:0", e))?
        .port();
    Ok(port)
}

/// The key of dataset entry `i`.
pub fn key_name(i: u64) -> String {
    format!("key:{i}")
}

impl RedisServer {
    /// Starts `exe` (normally `redis-server`) placed as `place`, logging to `log`.
    pub fn start(exe: &Path, place: &Placement<'_>, log: &Path) -> Result<Self> {
        let port = free_port()?;
        let log_file = std::fs::File::create(log).map_err(|e| BenchError::io(log, e))?;
        let mut cmd = Command::new(exe);
        cmd.args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--protected-mode", "no"])
            .args(["--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(|e| BenchError::io(log, e))?)
            .stderr(log_file);
        let child = spawn(&mut cmd, "redis-server", place)?;
        Ok(RedisServer { child, port })
    }

    /// The server's pid.
    pub fn pid(&self) -> i32 {
        self.child.pid()
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Opens `n` multiplexed connections, retrying until the server accepts them or
    /// `timeout` passes. Responses have no client-side deadline here: the load
    /// generator applies its own.
    pub async fn connect(
        &mut self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<MultiplexedConnection>> {
        let client = redis::Client::open(self.url())?;
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(Duration::from_secs(5)));
        let end = Instant::now() + timeout;
        let first = loop {
            if let Some(st) = self.child.try_wait()? {
                return Err(BenchError::Process(format!(
                    "redis-server exited at start: {st}"
                )));
            }
            crate::signal::check()?;
            match client
                .get_multiplexed_async_connection_with_config(&config)
                .await
            {
                Ok(mut c) => {
                    let pong: redis::RedisResult<String> =
                        redis::cmd("PING").query_async(&mut c).await;
                    if pong.is_ok() {
                        break c;
                    }
                }
                Err(e) if Instant::now() >= end => return Err(e.into()),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut conns = vec![first];
        while conns.len() < n {
            conns.push(
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            );
        }
        Ok(conns)
    }

    /// Fails if the server has exited (OOM-killed, say).
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            Some(st) => Err(BenchError::Process(format!("redis-server exited: {st}"))),
            None => Ok(()),
        }
    }
}

/// Loads `keys` entries `key:0 .. key:<keys-1>` with `value_bytes`-byte values cut
/// from `pool` (see [`crate::loadgen::value_pool`]), in pipelines of 1,000 SETs.
pub async fn preload(con: &mut LcConn, keys: u64, value_bytes: usize, pool: &[u8]) -> Result<()> {
    const BATCH: u64 = 1000;
    let con = match con {
        LcConn::Redis(c) => c,
        LcConn::Memcached(c) => {
            let mut i = 0;
            while i < keys {
                crate::signal::check()?;
                let pending: Vec<_> = (i..(i + BATCH).min(keys))
                    .map(|k| {
                        let off = crate::loadgen::value_offset(k, pool.len(), value_bytes);
                        c.set_pipelined(&key_name(k), &pool[off..off + value_bytes])
                    })
                    .collect();
                for rx in pending {
                    rx.await
                        .unwrap_or_else(|_| Err("connection closed".into()))
                        .map_err(|e| BenchError::Process(format!("memcached preload: {e}")))?;
                }
                i += BATCH;
            }
            return Ok(());
        }
    };
    let mut i = 0;
    while i < keys {
        crate::signal::check()?;
        let mut p = redis::pipe();
        for k in i..(i + BATCH).min(keys) {
            let off = crate::loadgen::value_offset(k, pool.len(), value_bytes);
            p.cmd("SET")
                .arg(key_name(k))
                .arg(&pool[off..off + value_bytes])
                .ignore();
        }
        p.query_async::<()>(con).await?;
        i += BATCH;
    }
    Ok(())
}
