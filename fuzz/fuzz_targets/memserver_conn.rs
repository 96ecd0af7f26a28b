//! Fuzzes a real memory server (`memcolo_tier::memserver::MemServer`, in this
//! process, on loopback) through its socket: the input is what an unauthenticated
//! client sends on one connection. Reaches what `memserver_frame` cannot: the
//! server's handling of each operation's payload (hello, list region, stores of
//! the wrong size or checksum) and its compressed store. A panic in a connection
//! thread aborts the process (libFuzzer's panic hook), so it is a crash here.
//! When the wire gains authentication, prefix the input with a valid handshake here.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::memserver::{MemServer, MemServerHandle};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

fn server() -> &'static MemServerHandle {
    static SERVER: OnceLock<MemServerHandle> = OnceLock::new();
    SERVER.get_or_init(|| {
        let store = Arc::new(CompressedStore::new(4096, 16 << 20));
        MemServer::bind("127.0.0.1:0", store)
            .and_then(MemServer::spawn)
            .expect("memory server on loopback")
    })
}

fuzz_target!(|data: &[u8]| {
    let mut s = TcpStream::connect(server().addr()).expect("connect to the memory server");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // The server may close first (a frame it refuses): a failed write is fine.
    let _ = s.write_all(data);
    let _ = s.shutdown(Shutdown::Write);
    let mut sink = Vec::new();
    match s.read_to_end(&mut sink) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("memory server did not finish the connection: {e}"),
    }
});
