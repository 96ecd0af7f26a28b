//! The latency-critical service: a real `redis-server` or `memcached`
//! ([`crate::memcached`]), started in the node's `lc/` group and preloaded with a
//! dataset; [`LcServer`] and [`LcConn`] hide which one the load generator talks to.
//!
//! Redis runs without persistence (`--save "" --appendonly no`) on a free port of
//! 127.0.0.1, so its memory is its dataset and allocator overhead (jemalloc in Debian's
//! build), the situation of Hermes §5.3. memcached keeps items in its slab allocator,
//! grown 1 MiB page by page as items arrive.

use std::path::Path;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::error::Result;
use crate::memcached::{McConn, MemcachedServer};
use crate::process::ChildPlacement;
use crate::redis_server::RedisServer;
pub use crate::service::LcLaunch;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_memory_of_info() {
        let info = "# Memory\r\nused_memory:1066464\r\nused_memory_human:1.02M\r\n";
        assert_eq!(parse_used_memory(info), Some(1_066_464));
        assert_eq!(parse_used_memory("# Memory\r\n"), None);
    }
}
