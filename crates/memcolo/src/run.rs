//! `memcolo run`: start a command registered with a class, optionally inside a
//! child cgroup of the agent's scope, and wait for it, passing its exit status on.
//!
//! The child joins its cgroup before `exec` (so every page it faults is charged
//! there) and is registered right after it starts. SIGINT, SIGTERM and SIGHUP sent
//! to `memcolo run` are forwarded to the child. When no agent runs, the command
//! still starts (unregistered) with a warning, unless `--cgroup` was asked for.

use crate::client::Client;
use crate::SocketArg;
use memcolo_policy::Class;
use memcolo_proto::{ErrorCode, NotifyMode, Reply, Request};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// lc, be or elastic.
    #[arg(long)]
    class: Class,
    /// Start the command in this child cgroup of the agent's scope (created if needed).
    #[arg(long)]
    cgroup: Option<String>,
    /// A name for status and metrics (default: the command's name).
    #[arg(long)]
    name: Option<String>,
    /// Expected reclamation on a high signal, in bytes (M3 §5.1).
    #[arg(long)]
    expected_reclaim_bytes: Option<u64>,
    /// How to notify it: `signal` (SIGRTMIN+1/2/3 for low/high/top) or `none`.
    #[arg(long, default_value = "none", value_parser = crate::parse_notify)]
    notify: NotifyMode,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// Writes `pid` in decimal to the open fd; async-signal-safe (runs between fork and exec).
fn write_pid(fd: i32, pid: i32) -> bool {
    let mut buf = [0u8; 16];
    let mut n = pid as u32;
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let len = buf.len() - i;
    // SAFETY: fd is open and buf[i..] is a valid readable range.
    unsafe { libc::write(fd, buf[i..].as_ptr().cast(), len) == len as isize }
}

pub fn run(a: RunArgs) -> ExitCode {
    match run_inner(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("memcolo run: {e:#}");
            ExitCode::from(125)
        }
    }
}

fn run_inner(a: RunArgs) -> anyhow::Result<ExitCode> {
    let mut client = match Client::connect(&a.socket.socket) {
        Ok(c) => Some(c),
        Err(e) if a.cgroup.is_none() => {
            eprintln!("memcolo run: warning: {e:#}; starting the command unregistered");
            None
        }
        Err(e) => return Err(e),
    };
    let procs_file = match (&a.cgroup, client.as_mut()) {
        (Some(name), Some(c)) => match c.call_ok(&Request::Cgroup { name: name.clone() })? {
            Reply::Cgroup { path } => Some(CString::new(
                std::path::Path::new(&path)
                    .join("cgroup.procs")
                    .as_os_str()
                    .as_bytes(),
            )?),
            r => anyhow::bail!("unexpected reply {r:?}"),
        },
        _ => None,
    };
    // Block the signals we forward, so that a thread can wait for them; the child
    // gets the normal mask back before exec.
    let mut fwd = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        fwd.add(s);
    }
    let mut old = SigSet::empty();
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&fwd), Some(&mut old))?;
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..]);
    // libmemcolo (when preloaded) reads its class and the agent's socket from the
    // environment: the class turns the Hermes reservation on for `lc`, and the
    // socket is where its agent link registers and publishes statistics.
    cmd.env("MEMCOLO_CLASS", a.class.as_str());
    cmd.env("MEMCOLO_SOCKET", &a.socket.socket);
    let child_mask = old;
    // SAFETY: the closure only makes async-signal-safe calls (open, write, close,
    // getpid, sigprocmask).
    unsafe {
        cmd.pre_exec(move || {
            if let Some(p) = &procs_file {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = write_pid(fd, libc::getpid());
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                if !ok {
                    return Err(e);
                }
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, child_mask.as_ref(), std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start `{}`: {e}", a.command[0]))?;
    let pid = child.id() as i32;
    if let Some(c) = client.as_mut() {
        let name = a.name.clone().or_else(|| {
            std::path::Path::new(&a.command[0])
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        });
        let req = Request::Register {
            pid: Some(pid),
            class: a.class,
            name,
            expected_reclaim_bytes: a.expected_reclaim_bytes,
            notify: a.notify,
        };
        // With --notify signal the agent refuses a process that does not catch
        // SIGRTMIN+1..3 yet: give the program a few seconds after exec to install its
        // handlers.
        let t0 = std::time::Instant::now();
        let mut reply = c.call(&req);
        while a.notify == NotifyMode::Signal
            && t0.elapsed() < std::time::Duration::from_secs(5)
            && matches!(&reply, Ok(Reply::Error { code: ErrorCode::BadRequest, message }) if message.contains("no handler"))
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
            reply = c.call(&req);
        }
        match reply {
            Ok(Reply::Registered { .. }) => {}
            Ok(Reply::Error { message, .. }) => {
                eprintln!("memcolo run: warning: not registered: {message}")
            }
            Ok(r) => eprintln!("memcolo run: warning: unexpected reply {r:?}"),
            Err(e) => eprintln!("memcolo run: warning: not registered: {e:#}"),
        }
    }
    drop(client);
    std::thread::spawn(move || loop {
        if let Ok(sig) = fwd.wait() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
        }
    });
    let status = child.wait()?;
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(s)) => ExitCode::from(128u8.wrapping_add(s as u8)),
        _ => ExitCode::FAILURE,
    })
}
