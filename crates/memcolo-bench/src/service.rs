//! How the bench starts an LC service's program ([`LcLaunch`]: directly, or under a
//! wrapper such as `memcolo run`) and the port it listens on.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{BenchError, Result};
use crate::process::ChildGuard;

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

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| BenchError::io("127.0.0.1:0", e))?;
    let port = l
        .local_addr()
        .map_err(|e| BenchError::io("127.0.0.1:0", e))?
        .port();
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

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
