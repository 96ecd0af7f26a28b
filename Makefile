# memcolo's top-level targets. `make test` is the README's test command and what CI runs.
.PHONY: test test-rust lint test-alloc test-sdk build fuzz-smoke fuzz fuzz-soak \
        install uninstall test-install test-service release-bin test-bench-report test-v2 \
        test-chart

build:
	cargo build --release --workspace

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings

# Rust: unit tests, fake-tree tests and the end-to-end agent test on a real scratch cgroup.
test-rust:
	cargo test --workspace --locked

# The real-kernel tests that need a cgroup v2 memory controller (this machine's kernel
# binds it to v1): Debian's cloud kernel booted with qemu under TCG on an initramfs of
# the test programs, scripts/v2bed/tests listing which (scripts/v2bed/run.sh; console
# log in target/v2bed/). Fails when the bed cannot run, unless MEMCOLO_TEST_ALLOW_SKIP=1.
test-v2:
	scripts/v2bed/run.sh

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

# Installed like a service. PREFIX (default /usr/local) and DESTDIR as usual:
#   $(PREFIX)/bin/memcolo, $(PREFIX)/lib/libmemcolo.so, $(PREFIX)/include/memcolo.h,
#   $(PREFIX)/lib/pkgconfig/memcolo.pc, the unit in SYSTEMD_UNITDIR (default
#   $(PREFIX)/lib/systemd/system, on systemd's search path for /usr/local and /usr:
#   `systemd-analyze unit-paths`; another PREFIX wants SYSTEMD_UNITDIR=/etc/systemd/system)
#   and the example configuration in /etc/memcolo/agent.toml.example (the agent reads
#   /etc/memcolo/agent.toml, which is never written). With DESTDIR empty: ldconfig,
#   and, when PID 1 is systemd, the service is enabled and started.
# MEMCOLO_BIN installs another build of the binary (test-install uses the debug one).
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
SYSTEMD_UNITDIR ?= $(PREFIX)/lib/systemd/system
CONFDIR ?= /etc/memcolo
MEMCOLO_BIN ?= target/release/memcolo
# The commands run after an install with DESTDIR empty (test-install stubs them), and
# the directory that exists when PID 1 is systemd (sd_booted(3)).
LDCONFIG ?= ldconfig
SYSTEMCTL ?= systemctl
SYSTEMD_RUNDIR ?= /run/systemd/system
ALLOC_DIRS = PREFIX=$(PREFIX) LIBDIR=$(LIBDIR) INCLUDEDIR=$(INCLUDEDIR) DESTDIR=$(DESTDIR)

release-bin:
	cargo build --release --locked -p memcolo

install: $(if $(filter target/release/memcolo,$(MEMCOLO_BIN)),release-bin)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SYSTEMD_UNITDIR) $(DESTDIR)$(CONFDIR)
	install -m 0755 $(MEMCOLO_BIN) $(DESTDIR)$(BINDIR)/.memcolo.new
	mv -f $(DESTDIR)$(BINDIR)/.memcolo.new $(DESTDIR)$(BINDIR)/memcolo
	$(MAKE) --no-print-directory -C alloc install $(ALLOC_DIRS)
	sed 's|@bindir@|$(BINDIR)|g' dist/memcolo.service.in > $(DESTDIR)$(SYSTEMD_UNITDIR)/memcolo.service
	chmod 0644 $(DESTDIR)$(SYSTEMD_UNITDIR)/memcolo.service
	install -m 0644 dist/agent.toml $(DESTDIR)$(CONFDIR)/agent.toml.example
	@if [ -z "$(DESTDIR)" ]; then \
	  $(LDCONFIG); \
	  if [ -d $(SYSTEMD_RUNDIR) ]; then \
	    $(SYSTEMCTL) daemon-reload && $(SYSTEMCTL) enable --now memcolo.service && \
	    echo "memcolo: memcolo.service enabled and started (systemctl status memcolo)"; \
	  else \
	    echo "memcolo: PID 1 is not systemd, no service started; start the agent by hand: $(BINDIR)/memcolo agent &"; \
	  fi; \
	fi

# Leaves /etc/memcolo/agent.toml and /var/lib/memcolo (the registry) in place.
uninstall:
	@if [ -z "$(DESTDIR)" ] && [ -d $(SYSTEMD_RUNDIR) ]; then \
	  $(SYSTEMCTL) disable --now memcolo.service || true; \
	fi
	rm -f $(DESTDIR)$(BINDIR)/memcolo $(DESTDIR)$(SYSTEMD_UNITDIR)/memcolo.service \
	      $(DESTDIR)$(CONFDIR)/agent.toml.example
	rmdir $(DESTDIR)$(CONFDIR) 2>/dev/null || true
	$(MAKE) --no-print-directory -C alloc uninstall $(ALLOC_DIRS)
	@if [ -z "$(DESTDIR)" ]; then \
	  $(LDCONFIG); \
	  if [ -d $(SYSTEMD_RUNDIR) ]; then $(SYSTEMCTL) daemon-reload; fi; \
	fi

# `make install` into a temporary DESTDIR with the binary test-rust built (no second
# release build): every file in place, pkg-config finds the library and a program
# links against it, `systemd-analyze verify` accepts the unit, an existing
# agent.toml survives install and uninstall.
test-install:
	scripts/test-install.sh

# `make install` inside a booted systemd machine (systemd-nspawn of the Debian tree
# scripts/setup.sh made) gives an enabled, running memcolo.service that answers
# `memcolo status` and stops cleanly: this machine's own PID 1 may not be systemd.
test-service:
	scripts/service-test.sh

# The colocation and sim benches' report generators on synthetic output directories; Debian's
# python3, which has python3-matplotlib (scripts/setup.sh), so the plots are tested too.
BENCH_PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
test-bench-report:
	$(BENCH_PYTHON) -m unittest bench/colocation/test_report.py bench/test_benchlib.py bench/sim/test_report.py

# The Helm chart (deploy/helm/memcolo): `helm template` output validated against the
# Kubernetes schemas (kubernetes-validate, strict), its agent.toml read by the agent;
# helm and the validator come from scripts/setup.sh, no network at test time.
test-chart:
	scripts/test-chart.sh

test: lint test-rust test-v2 test-alloc test-sdk fuzz-smoke test-install test-service test-bench-report test-chart
