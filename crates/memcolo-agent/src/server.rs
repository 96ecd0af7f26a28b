//! The Unix socket server: one task per connection reads bounded JSON lines,
//! hands each request to the core through the main loop and writes the reply; the
//! same task writes notifications the core pushes to that connection.
//!
//! A malformed line, an unknown message, a line over the size limit or a message
//! of a newer protocol version is answered with an error and the connection stays
//! open: nothing a client sends can stop the agent.

use crate::config::LimitsSection;
use crate::core::Peer;
use crate::slots::{SlotLimits, SlotOwner, Slots};
use memcolo_linux::identity::ProvenProcess;
use memcolo_linux::procfs::ProcFs;
use memcolo_proto::{decode_request, encode, ErrorCode, Reply, Request, MAX_LINE_BYTES};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// What a connection asks of the main loop.
pub enum Command {
    Opened {
        conn: u64,
        push: mpsc::Sender<Reply>,
    },
    Request {
        conn: u64,
        peer: Peer,
        req: Request,
        reply: oneshot::Sender<Reply>,
    },
    Closed {
        conn: u64,
    },
}

/// Binds the socket: creates its directory, replaces a stale socket file (one no
/// agent answers on), and opens it to every local user (who may register only
/// themselves: the rule is enforced with `SO_PEERCRED`, not file modes).
pub async fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| {
            anyhow::anyhow!("cannot create socket directory {}: {e}", dir.display())
        })?;
        prepare_alloc_stats_dir(dir);
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            anyhow::bail!("another agent is listening on {}", path.display());
        }
        std::fs::remove_file(path)
            .map_err(|e| anyhow::anyhow!("cannot remove stale socket {}: {e}", path.display()))?;
    }
    let l = UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("cannot bind {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| anyhow::anyhow!("cannot chmod {}: {e}", path.display()))?;
    Ok(l)
}

/// Creates `<socket dir>/alloc`, where libmemcolo publishes each registered
/// process's allocator statistics (`<pid>.json`, read by `memcolo alloc-stats`),
/// with mode 1777 (sticky, as `/tmp`): every local user's LC process may write its
/// own file there and nobody may replace another's. A failure is only logged: the
/// statistics files are optional and the agent serves without them.
fn prepare_alloc_stats_dir(socket_dir: &Path) {
    let dir = socket_dir.join("alloc");
    let res = std::fs::create_dir_all(&dir).and_then(|()| {
        // create_dir_all's mode passes through the umask; set it explicitly.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))
    });
    if let Err(e) = res {
        tracing::warn!(dir = %dir.display(), error = %e,
            "cannot prepare the allocator statistics directory; `memcolo alloc-stats` will see only processes that can create it themselves");
    }
}

/// Accepts connections until the listener fails; each gets its own task. A
/// connection over `limits` is answered `limit_exceeded` (without waiting for the
/// client to read it) and closed.
pub async fn serve(
    listener: UnixListener,
    cmds: mpsc::Sender<Command>,
    limits: LimitsSection,
    procfs: ProcFs,
) {
    let next = AtomicU64::new(1);
    let slots = Arc::new(Mutex::new(Slots::default()));
    let limits = Arc::new(limits);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let accepted_ticks = memcolo_linux::identity::ticks_since_boot();
        let cred = match stream.peer_cred() {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "no peer credentials; closing");
                continue;
            }
        };
        let uid = cred.uid();
        let who = SlotOwner::of(&procfs, uid, cred.pid());
        let caps = SlotLimits {
            total: limits.connections,
            root_reserved: limits.root_reserved_connections,
            per_owner: limits.connections_per_uid,
        };
        if let Err(why) = slots.lock().unwrap().take(who, &caps) {
            let reply = Reply::Error {
                code: ErrorCode::LimitExceeded,
                message: format!("connection refused: {why}"),
            };
            // Best effort, never waiting on the client.
            let _ = stream.try_write(encode(&reply).as_bytes());
            tracing::debug!(uid, why, "connection refused");
            continue;
        }
        let conn = next.fetch_add(1, Ordering::Relaxed);
        let cmds = cmds.clone();
        let (slots, limits, procfs) = (slots.clone(), limits.clone(), procfs.clone());
        tokio::spawn(async move {
            let process = ProvenProcess::from_peer(&procfs, stream.as_fd(), accepted_ticks);
            let process = match process {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::debug!(conn, uid, error = %e, "connecting process not identified");
                    None
                }
            };
            let peer = Peer::accepted(&procfs, uid, cred.pid(), process);
            let timeout = std::time::Duration::from_millis(limits.write_timeout_ms);
            if let Err(e) = connection(conn, stream, peer, cmds, timeout).await {
                tracing::debug!(conn, error = %e, "connection ended with an error");
            }
            slots.lock().unwrap().give_back(who);
        });
    }
}

/// Reads one line of at most [`MAX_LINE_BYTES`]. `Ok(None)` at end of stream;
/// `Ok(Some(Err(n)))` when a line of `n` bytes was too long (it is consumed).
async fn read_line<R: AsyncBufReadExt + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<Result<(), usize>>> {
    buf.clear();
    let mut overflow = 0usize;
    loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(if buf.is_empty() && overflow == 0 {
                None
            } else if overflow > 0 {
                Some(Err(overflow))
            } else {
                Some(Ok(()))
            });
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        if overflow == 0 && buf.len() + take <= MAX_LINE_BYTES + 1 {
            buf.extend_from_slice(&chunk[..take]);
        } else {
            overflow += buf.len() + take;
            buf.clear();
        }
        r.consume(take);
        if done {
            return Ok(Some(if overflow > 0 { Err(overflow) } else { Ok(()) }));
        }
    }
}

/// How many replies and notifications may wait for a slow reader.
const OUT_QUEUE: usize = 64;

/// Serves one connection: a reader that takes one line at a time (never cancelled
/// mid-line, so a notification pushed meanwhile cannot cut a request in two) and a
/// writer that sends replies and notifications in order. A client that does not read
/// for `write_timeout` is disconnected; it holds up nobody else (notifications to it
/// are dropped once its queue is full, see [`crate::core`]).
async fn connection(
    conn: u64,
    stream: UnixStream,
    peer: Peer,
    cmds: mpsc::Sender<Command>,
    write_timeout: std::time::Duration,
) -> std::io::Result<()> {
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let (out_tx, mut out_rx) = mpsc::channel::<Reply>(OUT_QUEUE);
    let cmds_closed = cmds.clone();
    if cmds
        .send(Command::Opened {
            conn,
            push: out_tx.clone(),
        })
        .await
        .is_err()
    {
        return Ok(());
    }
    let writer = async move {
        while let Some(msg) = out_rx.recv().await {
            match tokio::time::timeout(write_timeout, wr.write_all(encode(&msg).as_bytes())).await {
                Ok(r) => r?,
                Err(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client did not read its replies",
                    ))
                }
            }
        }
        Ok(())
    };
    let reader = async move {
        let mut buf = Vec::with_capacity(512);
        loop {
            let reply = match read_line(&mut rd, &mut buf).await? {
                None => return Ok(()),
                Some(Err(n)) => Reply::Error {
                    code: ErrorCode::BadRequest,
                    message: format!("line of {n} bytes is over the {MAX_LINE_BYTES}-byte limit"),
                },
                Some(Ok(())) => {
                    let text = String::from_utf8_lossy(&buf);
                    if text.trim().is_empty() {
                        continue;
                    }
                    match decode_request(&text) {
                        Err(e) => Reply::Error {
                            code: e.code(),
                            message: e.to_string(),
                        },
                        Ok(req) => {
                            let (tx, rx) = oneshot::channel();
                            let cmd = Command::Request {
                                conn,
                                peer: peer.clone(),
                                req,
                                reply: tx,
                            };
                            if cmds.send(cmd).await.is_err() {
                                return Ok(());
                            }
                            match rx.await {
                                Ok(r) => r,
                                Err(_) => return Ok(()),
                            }
                        }
                    }
                }
            };
            if out_tx.send(reply).await.is_err() {
                return Ok(());
            }
        }
    };
    let mut writer = tokio::spawn(writer);
    let res = tokio::select! {
        r = reader => r,
        w = &mut writer => {
            // The writer failed (the client stopped reading): stop reading too.
            let _ = cmds_closed.send(Command::Closed { conn }).await;
            return w.unwrap_or(Ok(()));
        }
    };
    // The client is done sending: the core forgets the connection (dropping its
    // sender of notifications), then what is queued is still written out.
    let _ = cmds_closed.send(Command::Closed { conn }).await;
    let _ = writer.await;
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A connection served with `write_timeout`: the client's end, the commands it
    /// sends the main loop, its push sender and its task.
    async fn served(
        write_timeout: std::time::Duration,
    ) -> (
        UnixStream,
        mpsc::Receiver<Command>,
        mpsc::Sender<Reply>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        let (agent_end, client) = UnixStream::pair().unwrap();
        let (cmds, mut rx) = mpsc::channel(8);
        let peer = Peer {
            pid: None,
            uid: 0,
            process: None,
            pid_ns: crate::core::PeerNamespace::Agent,
        };
        let conn = tokio::spawn(connection(1, agent_end, peer, cmds, write_timeout));
        let Some(Command::Opened { push, .. }) = rx.recv().await else {
            panic!("no Opened")
        };
        (client, rx, push, conn)
    }

    /// A notification pushed while the client is halfway through a request line
    /// neither loses nor corrupts that request.
    #[tokio::test]
    async fn a_push_in_the_middle_of_a_request_keeps_the_request_whole() {
        let (mut client, mut rx, push, conn) = served(std::time::Duration::from_secs(5)).await;
        client.write_all(br#"{"v":1,"type":"pi"#).await.unwrap();
        // Let the reader take in the first half before the push.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        push.send(Reply::Notify {
            seq: 1,
            level: memcolo_policy::Level::Low,
            target_bytes: 4096,
        })
        .await
        .unwrap();
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\n") {
            client.read_exact(&mut byte).await.unwrap();
            got.push(byte[0]);
        }
        assert!(String::from_utf8_lossy(&got).contains("notify"));
        client.write_all(b"ng\"}\n").await.unwrap();
        let Some(Command::Request { req, reply, .. }) = rx.recv().await else {
            panic!("the request was lost")
        };
        assert_eq!(req, Request::Ping);
        reply
            .send(Reply::Pong {
                agent_version: "t".into(),
            })
            .unwrap();
        got.clear();
        while !got.ends_with(b"\n") {
            client.read_exact(&mut byte).await.unwrap();
            got.push(byte[0]);
        }
        assert!(String::from_utf8_lossy(&got).contains("pong"), "{got:?}");
        drop(client);
        drop(push);
        let _ = conn.await;
    }

    /// A client that never reads is disconnected after the write timeout; its task
    /// ends instead of holding its slot.
    #[tokio::test]
    async fn a_client_that_never_reads_is_disconnected() {
        let (client, _rx, push, conn) = served(std::time::Duration::from_millis(200)).await;
        let big = Reply::Status {
            status: serde_json::json!({"pad": "x".repeat(60_000)}),
        };
        // Fill the socket buffer and the queue; try_send never waits.
        for _ in 0..(OUT_QUEUE * 4) {
            let _ = push.try_send(big.clone());
        }
        let res = tokio::time::timeout(std::time::Duration::from_secs(60), conn)
            .await
            .expect("the connection outlived its write timeout")
            .unwrap();
        assert_eq!(res.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        drop(client);
    }

    #[tokio::test]
    async fn read_line_bounds_and_recovers() {
        let long = "x".repeat(MAX_LINE_BYTES + 10);
        let input = format!("{{\"a\":1}}\n{long}\nok\n");
        let mut r = BufReader::with_capacity(1024, input.as_bytes());
        let mut buf = Vec::new();
        assert!(matches!(
            read_line(&mut r, &mut buf).await.unwrap(),
            Some(Ok(()))
        ));
        assert_eq!(buf, b"{\"a\":1}\n");
        assert!(
            matches!(read_line(&mut r, &mut buf).await.unwrap(), Some(Err(n)) if n > MAX_LINE_BYTES)
        );
        assert!(matches!(
            read_line(&mut r, &mut buf).await.unwrap(),
            Some(Ok(()))
        ));
        assert_eq!(buf, b"ok\n");
        assert!(read_line(&mut r, &mut buf).await.unwrap().is_none());
    }
}
