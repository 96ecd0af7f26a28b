//! The memory server's secure channel: mutual authentication of client and server
//! with a shared secret, then every frame sealed with an AEAD, so that pages crossing
//! the network keep their integrity and confidentiality and a replayed, reordered or
//! altered frame is refused.
//!
//! **Handshake** (plaintext, the server speaks first; `docs/protocol.md`, "Memory
//! server"):
//!
//! 1. server → client, greeting (40 bytes): magic `MCM2`, status (0 ok, else a
//!    refusal followed by a u32 length and a UTF-8 reason of at most
//!    [`MAX_REASON`] bytes, then the server closes), mode (1 shared secret,
//!    0 no authentication), 2 zero bytes, the server nonce `Ns` (32 random bytes).
//! 2. client → server, client hello (72 bytes): magic `MCM2`, mode, 3 zero bytes, the
//!    client nonce `Nc` (32 random bytes), the client proof
//!    `HMAC-SHA256(K_auth, "memcolo memserver client proof" ‖ Ns ‖ Nc)`.
//! 3. server → client, verdict (40 bytes): magic `MCM2`, status (0 ok, else a
//!    refusal as in 1), 3 zero bytes, the server proof
//!    `HMAC-SHA256(K_auth, "memcolo memserver server proof" ‖ Ns ‖ Nc)`.
//!
//! Keys come from HKDF-SHA256 (RFC 5869) with the shared secret as input keying
//! material, `Ns ‖ Nc` as salt and the labels `memcolo memserver auth`,
//! `... client to server` and `... server to client` as info: `K_auth` for the
//! proofs and one ChaCha20-Poly1305 (RFC 8439) key per direction. Fresh nonces on
//! both sides make every session's keys new, so nothing of an old session can be
//! replayed into a new one; the two proofs carry different labels, so neither can be
//! reflected as the other.
//!
//! **Records.** After the handshake every frame of [`crate::wire`] travels as sealed
//! records: the frame's header as one record and its payload (when not empty) as a
//! second, each the plaintext's length plus a 16-byte Poly1305 tag. The AEAD nonce is
//! the record's number in its direction (4 zero bytes, then a u64 counter,
//! little-endian), so a record dropped, replayed or moved fails to open and the
//! connection is closed. No record length travels in clear: a header record has a
//! fixed size and names the length of its payload record once authenticated.
//!
//! **No authentication** ([`Auth::InsecureNoAuth`], `--insecure-no-auth`): the same
//! protocol with a secret of 32 zero bytes, known to anyone: frames are still
//! checked for accidental damage and order, but anyone who reaches the port may read
//! and write every page. For tests on the loopback interface only. A peer in the
//! other mode is refused with a reason naming the mismatch.

use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, Key, KeyInit, Nonce, Tag};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Handshake magic and protocol version (the frames of [`crate::wire`] carry it too).
pub const MAGIC: [u8; 4] = *b"MCM2";
/// The magic of the previous, unauthenticated protocol: a peer sending it is told so.
pub(crate) const OLD_MAGIC: [u8; 4] = *b"MCM1";
/// Bytes of a Poly1305 tag, added to every record.
pub const TAG_BYTES: usize = 16;
/// Longest refusal reason in a greeting or verdict, bytes.
pub const MAX_REASON: u32 = 1024;
/// Fewest bytes a shared secret may have.
pub const MIN_SECRET_BYTES: usize = 32;
/// Most bytes read from a secret file.
pub const MAX_SECRET_BYTES: usize = 4096;

const NONCE_BYTES: usize = 32;
const PROOF_BYTES: usize = 32;
const CLIENT_PROOF: &[u8] = b"memcolo memserver client proof";
const SERVER_PROOF: &[u8] = b"memcolo memserver server proof";

/// Greeting and verdict statuses.
pub(crate) const ST_OK: u8 = 0;
/// Refused: the server is at its connection cap (retry later).
pub(crate) const ST_BUSY: u8 = 1;
/// Refused: authentication failed or the modes differ (retrying cannot help).
pub(crate) const ST_DENIED: u8 = 2;

/// Why a secret file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be opened or read.
    #[error("secret file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Not a regular file.
    #[error("secret file {path}: not a regular file")]
    NotRegular {
        /// The file.
        path: PathBuf,
    },
    /// Group or others may read or write it.
    #[error("secret file {path}: mode {mode:o} lets group or others in; chmod 600 it")]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Shorter than [`MIN_SECRET_BYTES`] or longer than [`MAX_SECRET_BYTES`].
    #[error("secret of {len} bytes: needs {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes (e.g. `head -c 32 /dev/urandom > FILE`)")]
    Length {
        /// Its length, bytes.
        len: usize,
    },
}

/// A shared secret of [`MIN_SECRET_BYTES`] or more bytes; never printed.
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        for b in &mut self.0 {
            // SAFETY: a valid, aligned pointer to a byte of our own buffer; volatile so
            // the wipe is not optimised away.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl Secret {
    /// A secret of these bytes.
    ///
    /// # Errors
    /// [`SecretError::Length`] outside [`MIN_SECRET_BYTES`]..=[`MAX_SECRET_BYTES`].
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, SecretError> {
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&bytes.len()) {
            return Err(SecretError::Length { len: bytes.len() });
        }
        Ok(Secret(bytes))
    }

    /// Reads the secret of `path`: a regular file that neither group nor others may
    /// read or write (mode `0600` or stricter), of [`MIN_SECRET_BYTES`] to
    /// [`MAX_SECRET_BYTES`] bytes, used as it is (a trailing newline included).
    ///
    /// # Errors
    /// A [`SecretError`] naming the path.
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        let read = |source| SecretError::Read {
            path: path.to_owned(),
            source,
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(read)?;
        let meta = f.metadata().map_err(read)?;
        if !meta.file_type().is_file() {
            return Err(SecretError::NotRegular {
                path: path.to_owned(),
            });
        }
        if meta.mode() & 0o077 != 0 {
            return Err(SecretError::Exposed {
                path: path.to_owned(),
                mode: meta.mode() & 0o7777,
            });
        }
        let mut bytes = Vec::new();
        f.take(MAX_SECRET_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?;
        Secret::from_bytes(bytes)
    }
}

/// How a client and a memory server authenticate each other.
#[derive(Clone, Debug)]
pub enum Auth {
    /// Both sides hold this secret and prove it (module docs).
    Secret(Arc<Secret>),
    /// No authentication: anyone who reaches the port reads and writes every page.
    /// For tests on the loopback interface only.
    InsecureNoAuth,
}

impl Auth {
    /// [`Auth::Secret`] of the secret in `path` ([`Secret::from_file`]).
    ///
    /// # Errors
    /// As [`Secret::from_file`].
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        Ok(Auth::Secret(Arc::new(Secret::from_file(path)?)))
    }

    fn mode(&self) -> u8 {
        match self {
            Auth::Secret(_) => 1,
            Auth::InsecureNoAuth => 0,
        }
    }

    fn ikm(&self) -> &[u8] {
        match self {
            Auth::Secret(s) => &s.0,
            Auth::InsecureNoAuth => &[0u8; MIN_SECRET_BYTES],
        }
    }
}

fn mode_name(mode: u8) -> &'static str {
    match mode {
        1 => "a shared secret",
        0 => "no authentication (--insecure-no-auth)",
        _ => "an unknown mode",
    }
}

/// A record that failed to open: altered, replayed or reordered in transit, or
/// sealed under another key (the inner error of an `InvalidData` [`io::Error`]).
#[derive(Debug)]
pub struct Unopened;

impl fmt::Display for Unopened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("record failed authentication (altered, replayed or reordered in transit)")
    }
}

impl std::error::Error for Unopened {}

impl Unopened {
    /// Whether `e` is a record that failed to open.
    pub fn is(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|i| i.is::<Unopened>())
    }
}

/// One direction of a channel: its key and the number of the next record.
pub(crate) struct Dir {
    cipher: ChaCha20Poly1305,
    counter: u64,
}

impl Dir {
    /// Two ends of one direction under a fixed key, for tests of the framing.
    #[cfg(test)]
    pub(crate) fn test_pair() -> (Dir, Dir) {
        (Dir::new(&[9; 32]), Dir::new(&[9; 32]))
    }

    fn new(key: &[u8; 32]) -> Self {
        Dir {
            cipher: ChaCha20Poly1305::new(Key::from_slice(key)),
            counter: 0,
        }
    }

    fn nonce(&mut self) -> io::Result<Nonce> {
        let n = self.counter;
        self.counter = n
            .checked_add(1)
            .ok_or_else(|| io::Error::other("record counter exhausted"))?;
        let mut b = [0u8; 12];
        b[4..].copy_from_slice(&n.to_le_bytes());
        Ok(*Nonce::from_slice(&b))
    }

    /// Seals `plain` as the next record and writes it.
    pub(crate) fn write(&mut self, w: &mut impl Write, plain: &[u8]) -> io::Result<()> {
        let nonce = self.nonce()?;
        let mut buf = Vec::with_capacity(plain.len() + TAG_BYTES);
        buf.extend_from_slice(plain);
        let tag = self
            .cipher
            .encrypt_in_place_detached(&nonce, b"", &mut buf)
            .map_err(|_| io::Error::other("record too long to seal"))?;
        buf.extend_from_slice(&tag);
        w.write_all(&buf)
    }

    /// Reads the next record, whose plaintext is `plain.len()` bytes, into `plain`.
    ///
    /// # Errors
    /// `InvalidData` if the record fails to open (altered, replayed, reordered or
    /// sealed with another key); the read's I/O error.
    pub(crate) fn read_into(&mut self, r: &mut impl Read, plain: &mut [u8]) -> io::Result<()> {
        let nonce = self.nonce()?;
        r.read_exact(plain)?;
        let mut tag = [0u8; TAG_BYTES];
        r.read_exact(&mut tag)?;
        self.cipher
            .decrypt_in_place_detached(&nonce, b"", plain, Tag::from_slice(&tag))
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, Unopened))
    }

    /// Reads and drops the next record of `len` plaintext bytes through a fixed
    /// buffer, without holding it (a payload refused before it was read).
    pub(crate) fn skip(&mut self, r: &mut impl Read, len: usize) -> io::Result<()> {
        self.nonce()?;
        let mut left = (len + TAG_BYTES) as u64;
        let mut buf = [0u8; 16 << 10];
        while left > 0 {
            let n = (left as usize).min(buf.len());
            r.read_exact(&mut buf[..n])?;
            left -= n as u64;
        }
        Ok(())
    }
}

/// The two directions of an established channel.
pub(crate) struct Keys {
    pub send: Dir,
    pub recv: Dir,
}

struct Derived {
    auth: [u8; 32],
    c2s: [u8; 32],
    s2c: [u8; 32],
}

fn derive(auth: &Auth, ns: &[u8; NONCE_BYTES], nc: &[u8; NONCE_BYTES]) -> Derived {
    let mut salt = [0u8; 2 * NONCE_BYTES];
    salt[..NONCE_BYTES].copy_from_slice(ns);
    salt[NONCE_BYTES..].copy_from_slice(nc);
    let hk = hkdf::Hkdf::<Sha256>::new(Some(&salt), auth.ikm());
    let mut d = Derived {
        auth: [0; 32],
        c2s: [0; 32],
        s2c: [0; 32],
    };
    for (info, out) in [
        (&b"memcolo memserver auth"[..], &mut d.auth),
        (b"memcolo memserver client to server", &mut d.c2s),
        (b"memcolo memserver server to client", &mut d.s2c),
    ] {
        hk.expand(info, out)
            .expect("32 bytes is a valid HKDF-SHA256 length");
    }
    d
}

fn proof_mac(
    key: &[u8; 32],
    label: &[u8],
    ns: &[u8; NONCE_BYTES],
    nc: &[u8; NONCE_BYTES],
) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(label);
    m.update(ns);
    m.update(nc);
    m
}

fn random_nonce() -> io::Result<[u8; NONCE_BYTES]> {
    let mut n = [0u8; NONCE_BYTES];
    getrandom::fill(&mut n).map_err(|e| io::Error::other(format!("getrandom: {e}")))?;
    Ok(n)
}

/// A refusal: the 8-byte head with `status`, a u32 length and the reason (at most
/// [`MAX_REASON`] bytes); then the sender closes.
fn refusal(status: u8, reason: &str) -> Vec<u8> {
    let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON as usize)];
    let mut b = vec![0u8; 8];
    b[..4].copy_from_slice(&MAGIC);
    b[4] = status;
    b.extend_from_slice(&(reason.len() as u32).to_le_bytes());
    b.extend_from_slice(reason);
    b
}

/// The greeting that turns a connection away (status [`ST_BUSY`] or [`ST_DENIED`]).
pub(crate) fn greeting_refusal(status: u8, reason: &str) -> Vec<u8> {
    refusal(status, reason)
}

fn read_reason(r: &mut impl Read) -> io::Result<String> {
    let mut l = [0u8; 4];
    r.read_exact(&mut l)?;
    let len = u32::from_le_bytes(l).min(MAX_REASON);
    let mut b = vec![0u8; len as usize];
    r.read_exact(&mut b)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// How a client handshake failed.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    /// The network failed, or the server is busy: worth another attempt.
    Io(io::Error),
    /// Authentication failed, or the peer speaks another protocol or mode:
    /// retrying cannot help.
    Denied(String),
}

impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        HandshakeError::Io(e)
    }
}

/// The client side of the handshake (module docs) on a connected stream.
pub(crate) fn client_handshake(
    s: &mut (impl Read + Write),
    auth: &Auth,
) -> Result<Keys, HandshakeError> {
    let mut g = [0u8; 8 + NONCE_BYTES];
    s.read_exact(&mut g[..8]).map_err(|e| {
        if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut {
            io::Error::new(
                e.kind(),
                "no greeting from the memory server (a server older than protocol MCM2?)",
            )
        } else {
            e
        }
    })?;
    if g[..4] != MAGIC {
        return Err(HandshakeError::Denied(format!(
            "greeting with magic {:?}: not a memory server of protocol MCM2",
            String::from_utf8_lossy(&g[..4])
        )));
    }
    match g[4] {
        ST_OK => {}
        ST_BUSY => {
            let why = read_reason(s)?;
            return Err(HandshakeError::Io(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("memory server busy: {why}"),
            )));
        }
        _ => return Err(HandshakeError::Denied(read_reason(s)?)),
    }
    if g[5] != auth.mode() {
        return Err(HandshakeError::Denied(format!(
            "the server uses {}, this client {}",
            mode_name(g[5]),
            mode_name(auth.mode())
        )));
    }
    s.read_exact(&mut g[8..])?;
    let ns: [u8; NONCE_BYTES] = g[8..].try_into().expect("32 bytes");
    let nc = random_nonce()?;
    let d = derive(auth, &ns, &nc);
    let mut hello = [0u8; 8 + NONCE_BYTES + PROOF_BYTES];
    hello[..4].copy_from_slice(&MAGIC);
    hello[4] = auth.mode();
    hello[8..8 + NONCE_BYTES].copy_from_slice(&nc);
    let proof = proof_mac(&d.auth, CLIENT_PROOF, &ns, &nc)
        .finalize()
        .into_bytes();
    hello[8 + NONCE_BYTES..].copy_from_slice(&proof);
    s.write_all(&hello)?;
    s.flush()?;
    let mut v = [0u8; 8 + PROOF_BYTES];
    s.read_exact(&mut v[..8])?;
    if v[..4] != MAGIC {
        return Err(HandshakeError::Denied("verdict with a bad magic".into()));
    }
    if v[4] != ST_OK {
        return Err(HandshakeError::Denied(read_reason(s)?));
    }
    s.read_exact(&mut v[8..])?;
    if proof_mac(&d.auth, SERVER_PROOF, &ns, &nc)
        .verify_slice(&v[8..])
        .is_err()
    {
        return Err(HandshakeError::Denied(
            "the server's proof does not match this client's secret (a different secret, or not the memory server)".into(),
        ));
    }
    Ok(Keys {
        send: Dir::new(&d.c2s),
        recv: Dir::new(&d.s2c),
    })
}

/// The server side of the handshake (module docs) on a connected stream; refusals
/// are sent to the peer before the error is returned.
///
/// # Errors
/// `PermissionDenied` when the client is refused; the stream's I/O errors (a
/// deadline is the caller's read timeout).
pub(crate) fn server_handshake(s: &mut (impl Read + Write), auth: &Auth) -> io::Result<Keys> {
    let ns = random_nonce()?;
    let mut g = [0u8; 8 + NONCE_BYTES];
    g[..4].copy_from_slice(&MAGIC);
    g[4] = ST_OK;
    g[5] = auth.mode();
    g[8..].copy_from_slice(&ns);
    s.write_all(&g)?;
    s.flush()?;
    let mut h = [0u8; 8 + NONCE_BYTES + PROOF_BYTES];
    s.read_exact(&mut h[..8])?;
    let mut deny = |why: String| -> io::Error {
        let _ = s.write_all(&refusal(ST_DENIED, &why));
        let _ = s.flush();
        io::Error::new(io::ErrorKind::PermissionDenied, why)
    };
    if h[..4] == OLD_MAGIC {
        return Err(deny(
            "client speaks protocol MCM1 (no authentication); this server speaks MCM2".into(),
        ));
    }
    if h[..4] != MAGIC {
        return Err(deny(format!("bad magic {:02x?}", &h[..4])));
    }
    if h[4] != auth.mode() {
        return Err(deny(format!(
            "this server uses {}, the client {}",
            mode_name(auth.mode()),
            mode_name(h[4])
        )));
    }
    s.read_exact(&mut h[8..])?;
    let nc: [u8; NONCE_BYTES] = h[8..8 + NONCE_BYTES].try_into().expect("32 bytes");
    let d = derive(auth, &ns, &nc);
    if proof_mac(&d.auth, CLIENT_PROOF, &ns, &nc)
        .verify_slice(&h[8 + NONCE_BYTES..])
        .is_err()
    {
        let _ = s.write_all(&refusal(
            ST_DENIED,
            "authentication failed: the client's proof does not match this server's secret",
        ));
        let _ = s.flush();
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "client proof does not match the secret",
        ));
    }
    let mut v = [0u8; 8 + PROOF_BYTES];
    v[..4].copy_from_slice(&MAGIC);
    v[4] = ST_OK;
    let proof = proof_mac(&d.auth, SERVER_PROOF, &ns, &nc)
        .finalize()
        .into_bytes();
    v[8..].copy_from_slice(&proof);
    s.write_all(&v)?;
    s.flush()?;
    Ok(Keys {
        send: Dir::new(&d.s2c),
        recv: Dir::new(&d.c2s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn secret(b: u8) -> Auth {
        Auth::Secret(Arc::new(Secret::from_bytes(vec![b; 32]).unwrap()))
    }

    fn pair(server: Auth, client: Auth) -> (io::Result<Keys>, Result<Keys, HandshakeError>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            server_handshake(&mut s, &server)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let k = client_handshake(&mut c, &client);
        drop(c);
        (t.join().unwrap(), k)
    }

    #[test]
    fn same_secret_agrees_on_keys_and_records_round_trip() {
        let (s, c) = pair(secret(7), secret(7));
        let (mut s, mut c) = (s.unwrap(), c.unwrap());
        let mut wire = Vec::new();
        c.send.write(&mut wire, b"hello page").unwrap();
        c.send.write(&mut wire, b"second").unwrap();
        let mut rd = &wire[..];
        let mut out = [0u8; 10];
        s.recv.read_into(&mut rd, &mut out).unwrap();
        assert_eq!(&out, b"hello page");
        let mut out = [0u8; 6];
        s.recv.read_into(&mut rd, &mut out).unwrap();
        assert_eq!(&out, b"second");
    }

    #[test]
    fn replayed_reordered_or_flipped_records_fail_to_open() {
        let (s, c) = pair(secret(7), secret(7));
        let (mut s, mut c) = (s.unwrap(), c.unwrap());
        let mut one = Vec::new();
        c.send.write(&mut one, b"first").unwrap();
        let mut two = Vec::new();
        c.send.write(&mut two, b"secnd").unwrap();
        let mut out = [0u8; 5];
        // Reordered: the second record where the first is expected.
        assert!(s.recv.read_into(&mut &two[..], &mut out).is_err());
        let (s2, c2) = pair(secret(7), secret(7));
        let (mut s2, mut c2) = (s2.unwrap(), c2.unwrap());
        let mut a = Vec::new();
        c2.send.write(&mut a, b"first").unwrap();
        s2.recv.read_into(&mut &a[..], &mut out).unwrap();
        // Replayed.
        assert!(s2.recv.read_into(&mut &a[..], &mut out).is_err());
        // Flipped bit.
        let mut b = Vec::new();
        c2.send.write(&mut b, b"third").unwrap();
        b[2] ^= 1;
        let err = s2.recv.read_into(&mut &b[..], &mut out).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn wrong_secret_and_mode_mismatch_are_denied_both_ways() {
        let (s, c) = pair(secret(7), secret(8));
        assert!(s.is_err());
        match c {
            Err(HandshakeError::Denied(why)) => assert!(why.contains("proof"), "{why}"),
            other => panic!("{:?}", other.err()),
        }
        // (The client sees the mismatch in the greeting and hangs up first.)
        let (s, c) = pair(secret(7), Auth::InsecureNoAuth);
        assert!(s.is_err());
        match c {
            Err(HandshakeError::Denied(why)) => assert!(why.contains("shared secret"), "{why}"),
            other => panic!("{:?}", other.err()),
        }
        let (_, c) = pair(Auth::InsecureNoAuth, secret(7));
        match c {
            Err(HandshakeError::Denied(why)) => assert!(why.contains("insecure-no-auth"), "{why}"),
            other => panic!("{:?}", other.err()),
        }
        let (s, c) = pair(Auth::InsecureNoAuth, Auth::InsecureNoAuth);
        assert!(s.is_ok() && c.is_ok());
    }

    #[test]
    fn secret_files_must_be_private_regular_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("memcolo-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("s");
        std::fs::write(&f, [1u8; 32]).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            Secret::from_file(&f),
            Err(SecretError::Exposed { .. })
        ));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Secret::from_file(&f).is_ok());
        std::fs::write(&f, [1u8; 31]).unwrap();
        assert!(matches!(
            Secret::from_file(&f),
            Err(SecretError::Length { len: 31 })
        ));
        assert!(matches!(
            Secret::from_file(&dir),
            Err(SecretError::NotRegular { .. })
        ));
        assert!(matches!(
            Secret::from_file(&dir.join("missing")),
            Err(SecretError::Read { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
