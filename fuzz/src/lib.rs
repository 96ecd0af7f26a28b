//! Harnesses shared by memcolo's fuzz targets (`fuzz_targets/`).
//!
//! - [`json_lines`]: the invariants every JSON-lines decoder of `memcolo-proto` must
//!   keep (`docs/protocol.md` §2–3, §10): no panic on any bytes, and a decoded message
//!   re-encodes to one canonical line that decodes to the same value.
//! - [`memserver_wire`]: the memory server's handshake and sealed frames
//!   (`memcolo_tier::channel` and `memcolo_tier::wire`, `docs/protocol.md` §12),
//!   compiled from those modules' own source files, since their readers are
//!   crate-private. This is the one place to adapt when the wire changes.

pub mod json_lines;
pub mod memserver_wire;

// The memory server's channel and frames, from the crate's own source files: the
// code the server and the agent's remote tier run, without widening the crate's API.
// They name each other and these as `crate::…`.
#[allow(dead_code)]
#[path = "../../crates/memcolo-tier/src/channel.rs"]
mod channel;
#[allow(dead_code)]
#[path = "../../crates/memcolo-tier/src/wire.rs"]
mod wire;

pub use memcolo_tier::{checksum, PageKey};
