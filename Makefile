# memcolo's top-level targets. `make test` is the README's test command and what CI runs.
.PHONY: test test-rust lint test-alloc test-sdk build fuzz-smoke fuzz fuzz-soak

build:
	cargo build --release --workspace

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings

# Rust: unit tests, fake-tree tests and the end-to-end agent test on a real scratch cgroup.
test-rust:
	cargo test --workspace --locked

# libmemcolo: C unit and stress tests, debug/ASan/UBSan builds, real programs under LD_PRELOAD.
test-alloc:
	@if [ -f alloc/Makefile ]; then $(MAKE) --no-print-directory -C alloc test; else echo "no alloc/"; fi

# SDKs in C, Rust, Python, Go and Java against the shared protocol test vectors.
test-sdk:
	@if [ -x sdk/test.sh ]; then sdk/test.sh; else echo "no sdk/"; fi

# Coverage-guided fuzzing of the wire decoders (fuzz/, stable Rust, cargo-fuzz):
# each target 20 s from the committed seeds, failing on any crash.
fuzz-smoke:
	scripts/fuzz.sh smoke

# Longer runs (FUZZ_SECONDS per target, default 600) growing fuzz/corpus/ (ignored).
fuzz:
	scripts/fuzz.sh run

# Hostile traffic against a real agent and memory server (fuzz/soak): 10 M agent.sock
# lines, 1 M tier.sock lines and 1 M memory-server frames (a tenth from peers without
# the secret), connections past the per-uid caps refused and counted, then liveness and
# RSS/thread/fd growth checks. SOAK_ARGS passes options (e.g. --agent-lines 100000).
fuzz-soak:
	cargo build --release --locked -p memcolo
	cargo build --release --locked --manifest-path fuzz/Cargo.toml -p memcolo-soak
	fuzz/target/release/memcolo-soak --memcolo target/release/memcolo $(SOAK_ARGS)

test: lint test-rust test-alloc test-sdk fuzz-smoke
