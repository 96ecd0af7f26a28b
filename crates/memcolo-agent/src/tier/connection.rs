//! The tiering socket's connections: accepting within the caps, reading lines and
//! descriptors (`SCM_RIGHTS`) from a proven peer, answering and pushing without
//! waiting on a client that does not read, and dispatching requests
//! (`docs/protocol.md` §11).

use super::register::{apply_fault_priority, register, RegionFds};
use super::status::status_json;
use super::{
    lock, release, Region, Shared, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_UID, MAX_FDS,
    ROOT_RESERVED_CONNECTIONS, WRITE_TIMEOUT,
};
use crate::slots::{SlotLimits, SlotOwner};
use memcolo_linux::identity::{peer_cred, ticks_since_boot, ProvenProcess};
use memcolo_policy::{Pid, PolicyError};
use memcolo_proto::tier::{decode_tier_request, TierReply, TierRequest};
use memcolo_proto::{encode, ErrorCode, MAX_LINE_BYTES};
use std::collections::VecDeque;
use std::io::{IoSliceMut, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A connection's place in the caps; given back when dropped.
pub(super) struct Slot {
    pub(super) shared: Arc<Shared>,
    pub(super) owner: SlotOwner,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.shared.slots).give_back(self.owner);
    }
}

/// A place for a connection of `owner`, or why not: [`MAX_CONNECTIONS`] in all, of
/// which [`ROOT_RESERVED_CONNECTIONS`] only for the node's root, and
/// [`MAX_CONNECTIONS_PER_UID`] per other owner ([`crate::slots`]).
pub(super) fn take_slot(shared: &Arc<Shared>, owner: SlotOwner) -> Result<Slot, String> {
    lock(&shared.slots).take(
        owner,
        &SlotLimits {
            total: MAX_CONNECTIONS,
            root_reserved: ROOT_RESERVED_CONNECTIONS,
            per_owner: MAX_CONNECTIONS_PER_UID,
        },
    )?;
    Ok(Slot {
        shared: shared.clone(),
        owner,
    })
}

/// Answers a connection that is not served with `reply` and closes it, never
/// waiting for the peer to read.
pub(super) fn refuse(stream: &UnixStream, reply: &TierReply) {
    let line = encode(reply);
    // SAFETY: a non-blocking send from a live buffer on our socket.
    let _ = unsafe {
        libc::send(
            stream.as_raw_fd(),
            line.as_ptr().cast(),
            line.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

pub(super) fn accept_loop(shared: &Arc<Shared>, listener: UnixListener) {
    while !shared.stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one valid descriptor.
        unsafe { libc::poll(&mut pfd, 1, 200) };
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!(error = %e, "tiering: accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let accepted_at = ticks_since_boot();
        let _ = stream.set_nonblocking(false);
        let (uid, pid) = match peer_cred(stream.as_fd()) {
            Ok(c) => (c.uid, c.pid),
            Err(e) => {
                tracing::warn!(error = %e, "tiering: no peer credentials");
                continue;
            }
        };
        let owner = SlotOwner::of(&shared.procfs, uid, Some(pid));
        let slot = match take_slot(shared, owner) {
            Ok(s) => s,
            Err(why) => {
                tracing::warn!(uid, reason = %why, "tiering: connection refused");
                refuse(&stream, &err(ErrorCode::PermissionDenied, why));
                continue;
            }
        };
        let s = shared.clone();
        let conn = s.next_conn.fetch_add(1, Ordering::Relaxed);
        let _ = std::thread::Builder::new()
            .name(format!("tier-conn-{conn}"))
            .spawn(move || connection(&s, conn, stream, accepted_at, slot));
    }
}

/// An open connection: its proven peer and how answers and pushes reach it.
pub(super) struct Conn {
    pub(super) id: u64,
    /// The process that connected (`SO_PEERPIDFD`): the only process the
    /// connection's requests act on.
    pub(super) proc_: Arc<ProvenProcess>,
    /// Its effective uid when proved.
    pub(super) uid: u32,
    /// Root of the node: uid 0 in the agent's pid namespace (root of a container's
    /// pid namespace is not, and is held to the per-user caps).
    pub(super) root: bool,
    /// The socket, to hang up on (never written through).
    pub(super) stream: UnixStream,
    /// The socket to write through, held only while a message is written.
    pub(super) writer: Mutex<UnixStream>,
    /// Pushes waiting for the writer (`tier_target_set`, `tier_released`).
    pub(super) outbox: Mutex<VecDeque<String>>,
}

impl Conn {
    pub(super) fn pid(&self) -> Pid {
        self.proc_.pid()
    }

    /// Writes the connection's own answer, waiting up to [`WRITE_TIMEOUT`] for the
    /// peer to read; false (and the connection hung up) if it did not.
    pub(super) fn answer(&self, line: &str) -> bool {
        let mut w = lock(&self.writer);
        let ok = w.write_all(line.as_bytes()).is_ok() && self.drain(&w);
        drop(w);
        if !ok {
            self.hang_up();
            return false;
        }
        self.flush()
    }

    /// Queues a push and writes what the writer is free to write now, never waiting
    /// for the peer: a peer whose socket buffer is full is hung up on.
    pub(super) fn push(&self, line: String) {
        lock(&self.outbox).push_back(line);
        self.flush();
    }

    pub(super) fn flush(&self) -> bool {
        loop {
            let w = match self.writer.try_lock() {
                Ok(w) => w,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                // Its holder writes the outbox before it lets go.
                Err(std::sync::TryLockError::WouldBlock) => return true,
            };
            let ok = self.drain(&w);
            drop(w);
            if !ok {
                self.hang_up();
                return false;
            }
            if lock(&self.outbox).is_empty() {
                return true;
            }
        }
    }

    /// Writes the outbox without waiting; false if the peer's buffer is full.
    pub(super) fn drain(&self, w: &UnixStream) -> bool {
        loop {
            let Some(m) = lock(&self.outbox).pop_front() else {
                return true;
            };
            // SAFETY: a non-blocking send from a live buffer on our socket.
            let n = unsafe {
                libc::send(
                    w.as_raw_fd(),
                    m.as_ptr().cast(),
                    m.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n != m.len() as isize {
                return false;
            }
        }
    }

    /// Ends the connection: its thread sees the end of the stream and hands its
    /// regions back as on any disconnect.
    pub(super) fn hang_up(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Reads what is available: bytes into `buf`, descriptors into `fds`. Returns the
/// bytes read (0 at end of stream).
pub(super) fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<usize> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut iov = [IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; 8]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let n = msg.bytes;
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(rs) = c {
            for fd in rs {
                // SAFETY: the kernel just installed this descriptor for us.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Ok(n)
}

/// Waits until `stream` is readable (true) or the process behind `pidfd` exited
/// (false); wakes every second to look at `stop`.
pub(super) fn wait_readable(shared: &Shared, stream: &UnixStream, pidfd: RawFd) -> bool {
    while !shared.stop.load(Ordering::Acquire) {
        let mut fds = [
            libc::pollfd {
                fd: stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: polling two valid descriptors.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
        if n > 0 {
            if fds[1].revents != 0 {
                return false;
            }
            return true;
        }
    }
    false
}

pub(super) fn connection(
    shared: &Arc<Shared>,
    id: u64,
    stream: UnixStream,
    accepted_at: u64,
    _slot: Slot,
) {
    let proc_ = match ProvenProcess::from_peer(&shared.procfs, stream.as_fd(), accepted_at) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            tracing::warn!(error = %e, "tiering: the connecting process cannot be proved");
            let code = if e.is_gone() {
                ErrorCode::NoSuchProcess
            } else {
                ErrorCode::PermissionDenied
            };
            refuse(&stream, &err(code, format!("the connecting process: {e}")));
            return;
        }
    };
    let (Ok(writer), Ok(hangup)) = (stream.try_clone(), stream.try_clone()) else {
        return;
    };
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let uid = proc_.credentials().euid();
    let root = uid == 0
        && matches!(
            (proc_.pid_namespace(&shared.procfs), shared.procfs.own_pid_namespace()),
            (Ok(a), Ok(b)) if a == b
        );
    let conn = Arc::new(Conn {
        id,
        uid,
        root,
        proc_,
        stream: hangup,
        writer: Mutex::new(writer),
        outbox: Mutex::new(VecDeque::new()),
    });
    lock(&shared.conns).insert(id, conn.clone());
    let pid = conn.pid();
    let pidfd = conn.proc_.pidfd().as_raw_fd();
    let mut pending: Vec<u8> = Vec::new();
    // Bytes of an over-long line dropped so far (its newline not seen yet).
    let mut overflow = 0usize;
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    'read: loop {
        if !wait_readable(shared, &stream, pidfd) {
            break;
        }
        let n = match recv_with_fds(&stream, &mut buf, &mut fds) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if fds.len() > MAX_FDS {
            // More than any request carries: none is kept (the request then lacks
            // them and is refused).
            fds.clear();
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some(i) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            // A line over the limit is refused whole (protocol §2), never its tail
            // taken for a request of its own.
            let long = overflow + line.len();
            overflow = 0;
            if long > MAX_LINE_BYTES + 1 {
                fds.clear();
                let e = err(
                    ErrorCode::BadRequest,
                    format!("line of {long} bytes is over the {MAX_LINE_BYTES}-byte limit"),
                );
                if !conn.answer(&encode(&e)) {
                    break 'read;
                }
                continue;
            }
            let text = String::from_utf8_lossy(&line);
            if text.trim().is_empty() {
                continue;
            }
            // The connecting process is still the one proved, or the connection ends.
            if let Err(e) = conn.proc_.verify(&shared.procfs) {
                let code = if e.is_gone() {
                    ErrorCode::NoSuchProcess
                } else {
                    ErrorCode::PermissionDenied
                };
                tracing::info!(pid, error = %e, "tiering: the connecting process changed; connection ends");
                conn.answer(&encode(&err(code, format!("the connecting process: {e}"))));
                break 'read;
            }
            let reply = match decode_tier_request(&text) {
                Err(e) => TierReply::Error {
                    code: e.code(),
                    message: e.to_string(),
                },
                Ok(req) => handle(shared, &conn, req, &mut fds),
            };
            // Descriptors go with the line they came with.
            fds.clear();
            if !conn.answer(&encode(&reply)) {
                break 'read;
            }
        }
        if pending.len() > MAX_LINE_BYTES {
            overflow += pending.len();
            pending.clear();
        }
    }
    if shared.stop.load(Ordering::Acquire) {
        // The stop hands the regions back, then pushes tier_released and hangs up.
        return;
    }
    conn.hang_up();
    lock(&shared.conns).remove(&id);
    // The process exited (or closed its link): discard or hand back its regions.
    let mine: Vec<Region> = {
        let mut rs = lock(&shared.regions);
        let (mine, rest) = rs.drain(..).partition(|r| r.conn == id);
        *rs = rest;
        mine
    };
    let restore = conn.proc_.verify(&shared.procfs).is_ok();
    for r in &mine {
        tracing::info!(
            pid,
            region = r.seq,
            restore,
            "tiering: connection closed; region leaves management"
        );
        release(shared, r, restore);
    }
}

pub(super) fn err(code: ErrorCode, message: impl Into<String>) -> TierReply {
    TierReply::Error {
        code,
        message: message.into(),
    }
}

pub(super) fn policy_err(e: PolicyError) -> TierReply {
    match e {
        PolicyError::UnknownProcess { pid } => err(
            ErrorCode::NotRegistered,
            format!("pid {pid} has no tiered region"),
        ),
        other => err(ErrorCode::BadRequest, other.to_string()),
    }
}

pub(super) fn handle(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    req: TierRequest,
    fds: &mut Vec<OwnedFd>,
) -> TierReply {
    let pid = conn.pid();
    match req {
        TierRequest::TierRegister {
            start,
            length,
            t_miss,
        } => {
            let Some(fds) = RegionFds::take(fds, 2) else {
                return err(
                    ErrorCode::BadRequest,
                    "tier_register needs two or three descriptors (userfaultfd, memfd, shadow) as SCM_RIGHTS",
                );
            };
            register(shared, conn, start, length, t_miss, fds, None)
        }
        TierRequest::TierRecover {
            start,
            length,
            region,
            slow_instance,
            t_miss,
        } => {
            let Some(fds) = RegionFds::take(fds, 3) else {
                return err(
                    ErrorCode::BadRequest,
                    "tier_recover needs three descriptors (userfaultfd, memfd, shadow) as SCM_RIGHTS",
                );
            };
            let recover = Some((region, slow_instance));
            register(shared, conn, start, length, t_miss, fds, recover)
        }
        TierRequest::TierUnregister { start } => {
            let r = {
                let mut rs = lock(&shared.regions);
                match rs.iter().position(|r| r.pid == pid && r.start == start) {
                    Some(k) => rs.swap_remove(k),
                    None => {
                        return err(
                            ErrorCode::NotRegistered,
                            format!("no tiered region of pid {pid} at {start:#x}"),
                        )
                    }
                }
            };
            release(shared, &r, false);
            TierReply::Ok
        }
        TierRequest::TierTarget {
            pid: target,
            t_miss,
        } => {
            let target = target.unwrap_or(pid);
            if !conn.root && target != pid {
                return err(
                    ErrorCode::PermissionDenied,
                    format!("pid {target} is not yours"),
                );
            }
            match shared.node.set_t_miss(target, t_miss) {
                Ok(()) => {
                    apply_fault_priority(shared, target);
                    tracing::info!(pid = target, t_miss, "tiering: target changed");
                    // The process keeps its target, for a new agent after a crash.
                    let push = encode(&TierReply::TierTargetSet { t_miss });
                    let to: Vec<Arc<Conn>> = lock(&shared.conns)
                        .values()
                        .filter(|c| c.pid() == target)
                        .cloned()
                        .collect();
                    for c in to {
                        c.push(push.clone());
                    }
                    TierReply::Ok
                }
                Err(e) => policy_err(e),
            }
        }
        TierRequest::TierStatus => TierReply::TierStatus {
            status: status_json(shared),
        },
    }
}
