//! A real `redis-server` as the LC service: no persistence (`--save "" --appendonly
//! no`), on a free port of 127.0.0.1, so its memory is its dataset and allocator
//! overhead (jemalloc in Debian's build, or libmemcolo when preloaded), the situation
//! of Hermes §5.3.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use crate::error::{BenchError, Result};
use crate::process::{spawn, ChildGuard, ChildPlacement};
use crate::service::{free_port, LcLaunch};

/// A running `redis-server`; killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: ChildGuard,
    pid: i32,
    port: u16,
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
