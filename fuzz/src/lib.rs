//! Harnesses shared by memcolo's fuzz targets (`fuzz_targets/`) and its soak driver
//! (`src/bin/soak.rs`).
//!
//! - [`json_lines`]: the invariants every JSON-lines decoder of `memcolo-proto` must
//!   keep (`docs/protocol.md` §2–3, §10): no panic on any bytes, and a decoded message
//!   re-encodes to one canonical line that decodes to the same value.
//! - [`memserver_wire`]: the memory server's binary frames (`memcolo_tier::wire`),
//!   compiled from that module's own source file, since its decoder is crate-private.
//!   This is the one place to adapt when the frame format changes.

pub mod json_lines;
pub mod memserver_wire;

// `memcolo_tier::wire` names these as `crate::…`; the included copy finds them here.
pub use memcolo_tier::{checksum, PageKey};
