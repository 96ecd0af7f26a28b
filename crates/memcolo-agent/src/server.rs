//! The Unix socket server: one task per connection reads bounded JSON lines,
//! hands each request to the core through the main loop and writes the reply; the
//! same task writes notifications the core pushes to that connection.
//!
//! A malformed line, an unknown message, a line over the size limit or a message
//! of a newer protocol version is answered with an error and the connection stays
//! open: nothing a client sends can stop the agent.

use crate::core::Peer;
use memcolo_proto::{decode_request, encode, ErrorCode, Reply, Request, MAX_LINE_BYTES};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// The most connections served at once; more are closed on accept.
pub const MAX_CONNECTIONS: usize = 1024;

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

/// Accepts connections until the listener fails; each gets its own task.
pub async fn serve(listener: UnixListener, cmds: mpsc::Sender<Command>) {
    let next = AtomicU64::new(1);
    let live = Arc::new(AtomicUsize::new(0));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if live.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            tracing::warn!("too many connections; closing a new one");
            continue;
        }
        let conn = next.fetch_add(1, Ordering::Relaxed);
        let cmds = cmds.clone();
        let live = live.clone();
        live.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            if let Err(e) = connection(conn, stream, cmds.clone()).await {
                tracing::debug!(conn, error = %e, "connection ended with an error");
            }
            let _ = cmds.send(Command::Closed { conn }).await;
            live.fetch_sub(1, Ordering::Relaxed);
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

async fn connection(
    conn: u64,
    stream: UnixStream,
    cmds: mpsc::Sender<Command>,
) -> std::io::Result<()> {
    let cred = stream.peer_cred()?;
    let peer = Peer {
        pid: cred.pid(),
        uid: cred.uid(),
    };
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let (push_tx, mut push_rx) = mpsc::channel::<Reply>(64);
    if cmds
        .send(Command::Opened {
            conn,
            push: push_tx,
        })
        .await
        .is_err()
    {
        return Ok(());
    }
    let mut buf = Vec::with_capacity(512);
    loop {
        tokio::select! {
            line = read_line(&mut rd, &mut buf) => {
                let reply = match line? {
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
                            Err(e) => Reply::Error { code: e.code(), message: e.to_string() },
                            Ok(req) => {
                                let (tx, rx) = oneshot::channel();
                                if cmds.send(Command::Request { conn, peer, req, reply: tx }).await.is_err() {
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
                wr.write_all(encode(&reply).as_bytes()).await?;
            }
            Some(msg) = push_rx.recv() => {
                wr.write_all(encode(&msg).as_bytes()).await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
