//! The slow-tier backends (compressed store, memory-server client and server, wire
//! format, channel) stand apart from the userfaultfd manager: they depend only on
//! the crate's [`memcolo_tier::SlowTier`] contract, never on the manager, its page
//! table, the userfaultfd or managed regions. Checked on their sources.

const BACKENDS: &[(&str, &str)] = &[
    ("compressed.rs", include_str!("../src/compressed.rs")),
    ("remote.rs", include_str!("../src/remote.rs")),
    ("memserver.rs", include_str!("../src/memserver.rs")),
    ("wire.rs", include_str!("../src/wire.rs")),
    ("channel.rs", include_str!("../src/channel.rs")),
];

/// Modules of the manager's side.
const MANAGER_SIDE: &[&str] = &[
    "crate::manager",
    "crate::page_state",
    "crate::uffd",
    "crate::region",
    "crate::sampler",
    "crate::shadow",
    "crate::placement",
    "crate::node",
    "crate::numa",
];

#[test]
fn backends_do_not_reach_into_the_manager() {
    for (file, src) in BACKENDS {
        // Code only: doc and ordinary comments may name the manager.
        let code: String = src
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for m in MANAGER_SIDE {
            assert!(!code.contains(m), "{file} uses {m}");
        }
    }
}
