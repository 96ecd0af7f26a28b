#!/usr/bin/env bash
# `make test-chart`: the Helm chart (deploy/helm/memcolo) renders with `helm template`
# for a recent Kubernetes, with its default values and with every optional part on,
# and the output validates against that Kubernetes version's schemas (strict: no
# unknown field) with kubernetes-validate, which bundles them (no network). The
# agent.toml the chart renders is accepted by the agent itself (`memcolo agent
# --print-config`), and values the chart owns are refused when given in `config`.
# helm and kubernetes-validate are installed by scripts/setup.sh into
# $MEMCOLO_TOOLS (default /var/lib/memcolo-test/tools).
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS=${MEMCOLO_TOOLS:-/var/lib/memcolo-test/tools}
HELM=$TOOLS/bin/helm
VALIDATE=$TOOLS/venv/bin/kubernetes-validate
KUBE_VERSION=${KUBE_VERSION:-1.34.0}
CHART=deploy/helm/memcolo
for t in "$HELM" "$VALIDATE"; do
  [ -x "$t" ] || { echo "test-chart: $t missing: run scripts/setup.sh" >&2; exit 1; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pass=0
fail=0
ok() { echo "ok: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

render() { # name, then helm flags
  local name=$1; shift
  "$HELM" template memcolo "$CHART" --namespace memcolo-system \
    --kube-version "$KUBE_VERSION" "$@" > "$out/$name.yaml"
}

validate() { # name; every resource passes, the only schema missing is the CRD's
  local name=$1
  if "$VALIDATE" --strict -k "$KUBE_VERSION" "$out/$name.yaml" > "$out/$name.log" 2>&1; then
    if grep -v '^INFO' "$out/$name.log" | grep -v "Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/v1" | grep -q .; then
      bad "$name: unexpected validator output"; cat "$out/$name.log"
    else
      ok "$name: $(grep -c '^INFO .* passed' "$out/$name.log") resources validate against Kubernetes $KUBE_VERSION"
    fi
  else
    bad "$name: does not validate"; cat "$out/$name.log"
  fi
}

"$HELM" lint --kube-version "$KUBE_VERSION" "$CHART" > "$out/lint.log" 2>&1 \
  && ok "helm lint" || { bad "helm lint"; cat "$out/lint.log"; }

render defaults
validate defaults
for kind in DaemonSet ServiceAccount ConfigMap ClusterRole ClusterRoleBinding; do
  grep -q "^kind: $kind\$" "$out/defaults.yaml" && ok "defaults render a $kind" || bad "no $kind"
done
grep -q '^kind: ServiceMonitor$' "$out/defaults.yaml" && bad "ServiceMonitor rendered by default" || ok "no ServiceMonitor by default"
for rule in 'resources: \[pods\]' 'resources: \[pods/eviction\]' 'resources: \[events\]' 'resources: \[nodes\]'; do
  grep -q "$rule" "$out/defaults.yaml" && ok "RBAC: $rule" || bad "RBAC lacks $rule"
done
for must in 'hostPID: true' 'privileged: true' 'path: /sys/fs/cgroup' 'path: /run/memcolo' '- --kubernetes' 'fieldPath: spec.nodeName' 'livenessProbe:' 'path: /healthz' 'readinessProbe:'; do
  grep -qF -- "$must" "$out/defaults.yaml" && ok "DaemonSet: $must" || bad "DaemonSet lacks $must"
done

render full --set serviceMonitor.enabled=true --set config.poll_ms=500 \
  --set-json 'config.m3={"kill_after_s":60}' --set-json 'config.hermes={"adv_thr_ratio":1.0}' \
  --set-json 'config.reclaim={"max_low_ratio":0.25}' --set kubernetes.burstableClass=be \
  --set kubernetes.kubepodsCgroup=kubepods.slice --set rbac.create=true \
  --set-json 'kubernetes.trustedNamespaces=["prod","caches"]'
validate full
grep -q '^kind: ServiceMonitor$' "$out/full.yaml" && ok "ServiceMonitor when asked" || bad "no ServiceMonitor"

# The rendered agent.toml is one the agent accepts, with the values given.
awk '/^  agent.toml: \|/{f=1; next} f && /^---/{f=0} f && /^    /{sub(/^    /, ""); print} f && /^$/{print}' \
  "$out/full.yaml" > "$out/agent.toml"
if cargo run --locked -q -p memcolo -- agent --config "$out/agent.toml" --print-config > "$out/effective.toml" 2> "$out/agent.err"; then
  for want in 'poll_ms = 500' 'kill_after_s = 60' 'adv_thr_ratio = 1.0' 'max_low_ratio = 0.25' 'burstable_class = "be"' 'kubepods_cgroup = "kubepods.slice"' 'trusted_namespaces = [' '"caches",' 'enabled = true'; do
    grep -qF "$want" "$out/effective.toml" && ok "agent reads the chart's $want" || bad "agent config lacks $want"
  done
else
  bad "the agent refuses the chart's agent.toml"; cat "$out/agent.err" "$out/agent.toml"
fi

# Settings the chart owns cannot be given twice.
for owned in scope socket metrics_addr kubernetes; do
  if render "owned-$owned" --set "config.$owned=x" 2> "$out/owned.err"; then
    bad "config.$owned accepted"
  else
    grep -q "config.$owned is set by the chart" "$out/owned.err" && ok "config.$owned refused" || { bad "config.$owned: wrong error"; cat "$out/owned.err"; }
  fi
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
