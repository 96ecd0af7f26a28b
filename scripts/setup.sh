#!/usr/bin/env bash
# Installs everything memcolo needs on a fresh Debian machine (as root, or with
# sudo), then builds the agent, the benchmarks and libmemcolo in release mode.
# Safe to run again: packages already present are not reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

# Real peers and services the tests and benchmarks drive, and the build tools.
PKGS=(
  build-essential pkg-config make gcc
  libjson-c-dev  # alloc/test/test_vectors.c reads sdk/testvectors
  redis-server memcached stress-ng rocksdb-tools fio hyperfine sqlite3 numactl util-linux
  libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0
  systemd  # systemd-analyze: `make test-install` verifies the unit (PID 1 need not be systemd)
  python3 python3-matplotlib python3-numpy python3-pip python3-venv
  python3-yaml openssl  # crates/memcolo-agent/tests/kubernetes_apiserver.rs: the chart's RBAC, a signing key
  systemd-container debootstrap
  qemu-system-x86 linux-image-cloud-amd64 busybox-static  # scripts/v2bed: the cgroup v2 guest
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Toolchains for the SDKs: Java and Maven from Debian when absent; Go must be >= 1.21
# (Debian bookworm's golang is older, so a Go toolchain is expected on the machine).
extra=()
command -v javac >/dev/null || extra+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || extra+=(maven)
if [ "${#extra[@]}" -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${extra[@]}"
fi
python3 -c "import pytest" 2>/dev/null || python3 -m pip install -q pytest
for tool in cargo go; do
  command -v "$tool" >/dev/null || echo "setup: warning: $tool not found" >&2
done

# cargo-fuzz for `make fuzz-smoke` / `make fuzz` (fuzz/): built from crates.io, pinned.
CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION\$"; then
  cargo install --locked --version "$CARGO_FUZZ_VERSION" cargo-fuzz
fi
# The fuzz project has its own lock file: fetch its crates now, so that the tests
# need no network of their own.
cargo fetch --locked --manifest-path fuzz/Cargo.toml

# A Debian root file system that boots systemd, for scripts/service-test.sh (`make
# install` must give a running memcolo.service; this machine's PID 1 may not be
# systemd). Made once; the test boots a scratch copy of it with systemd-nspawn.
NSPAWN_BASE=${MEMCOLO_NSPAWN_BASE:-/var/lib/memcolo-test/bookworm}
if [ ! -x "$NSPAWN_BASE/lib/systemd/systemd" ]; then
  echo "setup: debootstrap of a systemd test machine into $NSPAWN_BASE"
  $SUDO rm -rf "$NSPAWN_BASE.partial"
  $SUDO mkdir -p "$(dirname "$NSPAWN_BASE")"
  $SUDO debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,make \
    bookworm "$NSPAWN_BASE.partial" http://deb.debian.org/debian >/dev/null
  echo memcolo-service-test | $SUDO tee "$NSPAWN_BASE.partial/etc/hostname" >/dev/null
  $SUDO mv "$NSPAWN_BASE.partial" "$NSPAWN_BASE"
fi

# The Helm chart's test (`make test-chart`, scripts/test-chart.sh), offline at test
# time: helm built from its Go module through the Go module proxy, and
# kubernetes-validate from PyPI, which bundles the Kubernetes JSON schemas, in a venv
# of its own; both pinned. Kept in $MEMCOLO_TOOLS across runs.
TOOLS=${MEMCOLO_TOOLS:-/var/lib/memcolo-test/tools}
HELM_VERSION=v3.19.0
KUBERNETES_VALIDATE_VERSION=1.37.0
$SUDO mkdir -p "$TOOLS/bin"
if ! go version -m "$TOOLS/bin/helm" 2>/dev/null | grep -Eq "^\s+mod\s+helm.sh/helm/v3\s+$HELM_VERSION\s"; then
  echo "setup: building helm $HELM_VERSION into $TOOLS/bin"
  $SUDO env GOBIN="$TOOLS/bin" PATH="$PATH" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
if ! "$TOOLS/venv/bin/kubernetes-validate" --version 2>/dev/null | grep -qx "$KUBERNETES_VALIDATE_VERSION"; then
  echo "setup: kubernetes-validate $KUBERNETES_VALIDATE_VERSION into $TOOLS/venv"
  $SUDO python3 -m venv "$TOOLS/venv"
  $SUDO "$TOOLS/venv/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi

# A real API server for Kubernetes mode's client test
# (crates/memcolo-agent/tests/kubernetes_apiserver.rs): etcd and kube-apiserver built
# from their Go modules through the Go module proxy, pinned, into $TOOLS/bin. `go
# install m@v` refuses both (their go.mod files have replace directives pointing into
# their own source trees), so each is built in a module of our own: etcd's server
# module as a dependency (its replaces then do not apply), kube-apiserver from a copy
# of k8s.io/kubernetes whose replaces of its staging modules (k8s.io/api, ...) are
# swapped for the published versions of the same release. The first time: about 9
# CPU-minutes (25 minutes of wall time on a busy 2-core machine), 0.6 GB of Go
# modules and 3 GB of Go build cache; afterwards nothing while the versions match.
ETCD_VERSION=v3.7.3
KUBERNETES_VERSION=v1.37.2
KUBERNETES_STAGING_VERSION=v0.37.2 # k8s.io/api, k8s.io/apiserver, ... of that release
if ! go version -m "$TOOLS/bin/etcd" 2>/dev/null | grep -Eq "^\s+mod\s+go.etcd.io/etcd/server/v3\s+$ETCD_VERSION\s"; then
  echo "setup: building etcd $ETCD_VERSION into $TOOLS/bin"
  build=$(mktemp -d)
  printf 'module memcolo.test/etcd\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
    "$ETCD_VERSION" > "$build/go.mod"
  (cd "$build" && go build -mod=mod -o "$build/etcd" go.etcd.io/etcd/server/v3)
  $SUDO install -m 0755 "$build/etcd" "$TOOLS/bin/etcd"
  rm -rf "$build"
fi
if ! "$TOOLS/bin/kube-apiserver" --version 2>/dev/null | grep -qx "Kubernetes $KUBERNETES_VERSION"; then
  echo "setup: building kube-apiserver $KUBERNETES_VERSION into $TOOLS/bin"
  src=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  build=$(mktemp -d)
  # The module has no staging/ sources (each is a module of its own) and its vendor/
  # lacks them too (symlinks are left out of module zips): build a copy without
  # vendor/, in module mode.
  (cd "$src" && tar --exclude=./vendor -cf - .) | tar -xf - -C "$build"
  chmod -R u+w "$build"
  (
    cd "$build"
    rm -f go.work go.work.sum
    args=()
    for m in $(go mod edit -json | python3 -c 'import json,sys; print("\n".join(r["Old"]["Path"] for r in json.load(sys.stdin).get("Replace") or [] if r["New"]["Path"].startswith("./staging/")))'); do
      args+=("-dropreplace=$m" "-require=$m@$KUBERNETES_STAGING_VERSION")
    done
    go mod edit "${args[@]}"
    # The version the binary reports (normally stamped by the release build).
    ldflags="-X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION"
    go build -mod=mod -ldflags "$ldflags" -o "$build/kube-apiserver" ./cmd/kube-apiserver
  )
  $SUDO install -m 0755 "$build/kube-apiserver" "$TOOLS/bin/kube-apiserver"
  rm -rf "$build"
fi

cargo build --release --workspace --locked
if [ -f alloc/Makefile ]; then make -C alloc; fi
# The elastic cache of `memcolo bench colocation` (M3's Go-Cache job on sdk/go/cache),
# next to the memcolo binary where the bench looks for it.
if command -v go >/dev/null; then
  (cd sdk/go && go build -o ../../target/release/memcolo-gocache ./examples/gocache)
fi
echo "setup: done. The memcolo binary is target/release/memcolo"
