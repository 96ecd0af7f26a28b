# memcolo's top-level targets. `make test` is the README's test command and what CI runs.
.PHONY: test test-rust lint test-alloc test-sdk build

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

test: lint test-rust test-alloc test-sdk
