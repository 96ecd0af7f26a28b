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
use crate::process::{spawn, ChildGuard, ChildPlacement};

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

/// How to start the LC service's program: directly, or under a wrapper (e.g.
/// `memcolo run --class lc -- env LD_PRELOAD=libmemcolo.so`), with extra environment.
#[derive(Clone, Debug, Default)]
pub struct LcLaunch {
    /// Program and arguments put before the service's program (empty: none). The
    /// wrapper must start the service as its child (or exec it).
    pub wrapper: Vec<std::ffi::OsString>,
    /// Extra environment of the service (and of the wrapper).
    pub env: Vec<(String, String)>,
}

impl LcLaunch {
    /// The command that starts `exe`.
    pub(crate) fn command(&self, exe: &Path) -> Command {
        let mut cmd = match self.wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// The service's pid: the child's, or with a wrapper the wrapper's first child
    /// (`/proc/<pid>/task/<pid>/children`), waited for up to `timeout`.
    pub(crate) fn server_pid(&self, child: &mut ChildGuard, timeout: Duration) -> Result<i32> {
        let pid = child.pid();
        if self.wrapper.is_empty() {
            return Ok(pid);
        }
        let path = format!("/proc/{pid}/task/{pid}/children");
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = child.try_wait()? {
                return Err(BenchError::Process(format!(
                    "the LC service's wrapper exited at start: {st}"
                )));
            }
            if let Some(c) = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.split_whitespace().next().and_then(|x| x.parse().ok()))
            {
                return Ok(c);
            }
            if Instant::now() >= end {
                return Err(BenchError::Process(
                    "the LC service's wrapper started no child".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
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
        place: &ChildPlacement<'_>,
        log: &Path,
        memory_mib: u64,
        launch: &LcLaunch,
    ) -> Result<Self> {
        Ok(match kind {
            LcKind::Redis => LcServer::Redis(RedisServer::start(exe, place, log, launch)?),
            LcKind::Memcached => {
                LcServer::Memcached(MemcachedServer::start(exe, place, log, memory_mib, launch)?)
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

    /// The bytes the service itself counts as allocated: Redis `INFO memory`
    /// `used_memory`; `None` for memcached or on error.
    pub async fn used_memory_bytes(&mut self) -> Option<u64> {
        match self {
            LcConn::Redis(c) => {
                let info: String = redis::cmd("INFO").arg("memory").query_async(c).await.ok()?;
                parse_used_memory(&info)
            }
            LcConn::Memcached(_) => None,
        }
    }
}

/// `used_memory` of a Redis `INFO memory` answer, bytes.
pub fn parse_used_memory(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A running `redis-server`; killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: ChildGuard,
    pid: i32,
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
    pub fn start(
        exe: &Path,
        place: &ChildPlacement<'_>,
        log: &Path,
        launch: &LcLaunch,
    ) -> Result<Self> {
        let port = free_port()?;
        let log_file = std::fs::File::create(log).map_err(|e| BenchError::io(log, e))?;
        let mut cmd = launch.command(exe);
        cmd.args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--protected-mode", "no"])
            .args(["--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(|e| BenchError::io(log, e))?)
            .stderr(log_file);
        let mut child = spawn(&mut cmd, "redis-server", place)?;
        let pid = launch.server_pid(&mut child, Duration::from_secs(10))?;
        Ok(RedisServer { child, pid, port })
    }

    /// The server's pid.
    pub fn pid(&self) -> i32 {
        self.pid
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_memory_of_info() {
        let info = "# Memory\r\nused_memory:1066464\r\nused_memory_human:1.02M\r\n";
        assert_eq!(parse_used_memory(info), Some(1_066_464));
        assert_eq!(parse_used_memory("# Memory\r\n"), None);
    }

    #[test]
    fn a_wrapper_goes_before_the_program() {
        let l = LcLaunch {
            wrapper: vec!["memcolo".into(), "run".into(), "--".into()],
            env: vec![("A".into(), "1".into())],
        };
        let c = l.command(Path::new("redis-server"));
        assert_eq!(c.get_program(), "memcolo");
        let args: Vec<_> = c.get_args().collect();
        assert_eq!(args, ["run", "--", "redis-server"]);
        assert_eq!(c.get_envs().count(), 1);
        let c = LcLaunch::default().command(Path::new("redis-server"));
        assert_eq!(c.get_program(), "redis-server");
    }
}
