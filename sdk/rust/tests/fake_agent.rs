//! The client against a fake agent: a real Unix socket server inside the test that
//! speaks the protocol through memcolo-proto.

use memcolo_proto::{decode_request, encode, Class, Level, NotifyMode, Reply, Request};
use memcolo_sdk::ClientBuilder;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Generous bound for waits; the tests never assert on how long anything took.
const WAIT: Duration = Duration::from_secs(20);

struct Peer {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Peer {
    fn accept(listener: &UnixListener) -> Peer {
        listener.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + WAIT;
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("no client connected: {e}"),
            }
        };
        stream.set_nonblocking(false).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        Peer {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
        }
    }

    fn recv(&mut self) -> Request {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("client line");
        decode_request(&line).unwrap_or_else(|e| panic!("client sent {line:?}: {e}"))
    }

    fn send_raw(&mut self, line: &str) {
        self.writer.write_all(line.as_bytes()).unwrap();
    }

    fn send(&mut self, reply: &Reply) {
        self.send_raw(&encode(reply));
    }

    /// Reads the registration and acknowledges it.
    fn handshake(&mut self) -> Request {
        let r = self.recv();
        match &r {
            Request::Register {
                class, notify, pid, ..
            } => {
                assert_eq!(*notify, NotifyMode::Socket);
                assert_eq!(*pid, None, "a client registers itself");
                self.send(&Reply::Registered {
                    pid: std::process::id() as i32,
                    class: *class,
                });
            }
            other => panic!("expected register, got {other:?}"),
        }
        r
    }

    fn notify(&mut self, seq: u64, level: Level, target_bytes: u64) -> (Option<u64>, u64, bool) {
        self.send(&Reply::Notify {
            seq,
            level,
            target_bytes,
        });
        match self.recv() {
            Request::Reclaimed { seq, bytes, ok, .. } => {
                self.send(&Reply::Ok);
                (seq, bytes, ok)
            }
            other => panic!("expected reclaimed, got {other:?}"),
        }
    }
}

fn socket(dir: &Path) -> PathBuf {
    dir.join("agent.sock")
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn registers_and_answers_notifications_through_layers() {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(socket(dir.path())).unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (o1, o2) = (order.clone(), order.clone());
    let client = ClientBuilder::new()
        .socket_path(socket(dir.path()))
        .name("cache")
        .expected_reclaim_bytes(1 << 20)
        .on(Level::High, move |n| {
            o1.lock().unwrap().push("app");
            Ok(n.target_bytes / 2)
        })
        .on(Level::High, move |_| {
            o2.lock().unwrap().push("runtime");
            Ok(100)
        })
        .on(Level::Low, |n| Ok(n.target_bytes))
        .start();
    let mut agent = Peer::accept(&listener);
    match agent.handshake() {
        Request::Register {
            class,
            name,
            expected_reclaim_bytes,
            ..
        } => {
            assert_eq!(class, Class::Elastic);
            assert_eq!(name.as_deref(), Some("cache"));
            assert_eq!(expected_reclaim_bytes, Some(1 << 20));
        }
        _ => unreachable!(),
    }
    wait_for("registration", || client.is_registered());
    assert_eq!(
        agent.notify(7, Level::High, 4096),
        (Some(7), 2048 + 100, true)
    );
    assert_eq!(*order.lock().unwrap(), ["app", "runtime"]);
    assert_eq!(agent.notify(8, Level::Low, 10), (Some(8), 10, true));
    // No handler for top: nothing given back, but still answered and ok.
    assert_eq!(agent.notify(9, Level::Top, 10), (Some(9), 0, true));
    // The high signal fed the allow-rate gate: it has an epoch now.
    assert!(client.gate().epoch().is_some());
    assert_eq!(client.notifications(), 3);
}

#[test]
fn failing_panicking_and_overlong_handlers_are_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(socket(dir.path())).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let client = ClientBuilder::new()
        .socket_path(socket(dir.path()))
        .handler_timeout(Duration::from_millis(300))
        .on(Level::Low, |_| Err("cache locked".into()))
        .on(Level::High, |_| panic!("handler bug"))
        .on(Level::Top, move |_| {
            if c.fetch_add(1, Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_secs(2));
            }
            Ok(5)
        })
        .start();
    let mut agent = Peer::accept(&listener);
    agent.handshake();
    assert_eq!(agent.notify(1, Level::Low, 1), (Some(1), 0, false));
    assert_eq!(agent.notify(2, Level::High, 1), (Some(2), 0, false));
    assert_eq!(agent.notify(3, Level::Top, 1), (Some(3), 0, false));
    // Once the overlong handler has finished, handlers run again.
    std::thread::sleep(Duration::from_secs(2));
    let mut last = agent.notify(4, Level::Top, 1);
    if !last.2 {
        // The slow handler was still running (a very slow machine): try again.
        wait_for("slow handler", || calls.load(Ordering::SeqCst) >= 1);
        std::thread::sleep(Duration::from_secs(2));
        last = agent.notify(5, Level::Top, 1);
    }
    assert!(last.2 && last.1 == 5, "{last:?}");
    assert!(client.failed_notifications() >= 3);
}

#[test]
fn reconnects_and_reregisters_when_the_agent_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(dir.path());
    let listener = UnixListener::bind(&path).unwrap();
    let reconnects = Arc::new(AtomicUsize::new(0));
    let r = reconnects.clone();
    let client = ClientBuilder::new()
        .socket_path(&path)
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .on_reconnect(move || {
            r.fetch_add(1, Ordering::SeqCst);
        })
        .on(Level::Low, |_| Ok(1))
        .start();
    let mut agent = Peer::accept(&listener);
    agent.handshake();
    wait_for("registration", || client.registrations() == 1);
    // The agent vanishes: connection closed and socket removed.
    drop(agent);
    drop(listener);
    std::fs::remove_file(&path).unwrap();
    wait_for("disconnect", || !client.is_registered());
    std::thread::sleep(Duration::from_millis(300));
    // ... and comes back.
    let listener = UnixListener::bind(&path).unwrap();
    let mut agent = Peer::accept(&listener);
    agent.handshake();
    wait_for("re-registration", || client.registrations() == 2);
    wait_for("reconnect hook", || reconnects.load(Ordering::SeqCst) == 1);
    assert_eq!(agent.notify(11, Level::Low, 1), (Some(11), 1, true));
}

#[test]
fn ignores_garbage_unknown_and_newer_messages() {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(socket(dir.path())).unwrap();
    let client = ClientBuilder::new()
        .socket_path(socket(dir.path()))
        .on(Level::Low, |n| Ok(n.target_bytes))
        .start();
    let mut agent = Peer::accept(&listener);
    agent.handshake();
    agent.send_raw("garbage\n");
    agent.send_raw("{\"v\":1,\"type\":\"hologram\"}\n");
    agent
        .send_raw("{\"v\":2,\"type\":\"notify\",\"seq\":1,\"level\":\"low\",\"target_bytes\":1}\n");
    agent.send_raw("{\"v\":1,\"type\":\"notify\",\"seq\":1,\"le\n");
    agent.send_raw(&format!("{}\n", "x".repeat(200_000)));
    agent.send(&Reply::Error {
        code: memcolo_proto::ErrorCode::Internal,
        message: "x".into(),
    });
    // The connection survives all of that: the next notification is answered.
    assert_eq!(agent.notify(2, Level::Low, 42), (Some(2), 42, true));
    assert_eq!(client.notifications(), 1);
    assert_eq!(client.registrations(), 1);
}

#[test]
fn no_agent_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let client = ClientBuilder::new()
        .socket_path(socket(dir.path()))
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .start();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!client.is_registered());
    assert_eq!(client.gate().allow_rate(), 1.0);
    client.close();
}
