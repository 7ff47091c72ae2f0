#!/usr/bin/env bash
# Build every Go component of the raygpu testbed from the Go module proxy.
#
# Output: $RAYGPU_CACHE/bin/<set>-<versions>/ (default ~/.cache/raygpu), one
# folder per version set, reused when present (a ".done" stamp marks success).
# GOCACHE / GOMODCACHE are Go's defaults (outside the repo) and are reused.
# Prints how long each set took; exits non-zero naming the component that failed.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"          # kube-apiserver/scheduler/controller-manager/kubectl
# (v1.34.7 would match scheduler-plugins exactly, but the module proxy refuses
#  several of its staging modules, e.g. k8s.io/cri-client@v0.34.7: 403.)
SCHED_PLUGINS_VERSION="${SCHED_PLUGINS_VERSION:-v0.34.7}"  # released for k8s 1.34.7, built here against 1.34.4
# Further control planes, selectable with `raygpu testbed up --kubernetes 1.N`: kube-apiserver, scheduler,
# controller-manager and kubectl only (no scheduler-plugins release for them: the 1.34 set's coscheduling
# runs against them, docs/testbed.md "Kubernetes versions"). Target `k8s-vX.Y.Z` builds one of them.
K8S_OTHER_VERSIONS="${K8S_OTHER_VERSIONS:-v1.37.2}"
KUBERAY_VERSION="${KUBERAY_VERSION:-v1.6.2}"   # own build: 1.6 needs k8s 0.35 libs (1.7.0 refused by the proxy: docs/decisions.md)
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v4.3.2}"          # renders/lints deploy/helm/raygpu in the unit tests
# promtool checks and unit-tests deploy/monitoring's alerting rules (tests/unit/test_monitoring.py); v0.316.0 is
# the Go module version of Prometheus 3.16.0. Built with -tags remove_all_sd: promtool needs no service discovery.
PROMTOOL_VERSION="${PROMTOOL_VERSION:-v0.316.0}"
# Only the CRDs of the prometheus-operator (ServiceMonitor, PodMonitor, PrometheusRule), no binary: the chart's
# server-side dry run installs them on the testbed (tests/integration/test_deploy_helm_dry_run.py).
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"

CACHE="${RAYGPU_CACHE:-$HOME/.cache/raygpu}"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
mkdir -p "$CACHE/bin" "$CACHE/src"
# One build at a time per cache: two checkouts set up at once (worktrees, CI beside a developer) would
# compile the same sets twice on the same source folders; the second waits and then finds them cached.
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then echo "[build] another build of the testbed components is running; waiting for it" >&2; flock 9; fi

# The module proxy sometimes answers 403 for a version it serves a minute later:
# retry a step a few times before calling it failed.
retry() { local n; for n in 1 2 3 4; do "$@" && return 0; log "attempt $n of: $* failed; retrying in $((n * 15)) s"; sleep $((n * 15)); done; return 1; }

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

stamp_ok() { [ -f "$1/.done" ]; }

# ---- kubernetes (+ scheduler-plugins when its version is given): one module, one compile
build_k8s() {  # k8s_version [scheduler_plugins_version]
  local kv=$1 sp=${2:-}
  local out="$CACHE/bin/k8s-$kv${sp:+-sp-$sp}"
  if stamp_ok "$out"; then log "k8s set cached: $out"; echo "$out"; return; fi
  local t0=$SECONDS src="$CACHE/src/k8s-$kv${sp:+-sp-$sp}"
  mkdir -p "$src" "$out"
  log "k8s set: resolving k8s.io/kubernetes@$kv"
  local gomod
  gomod=$(retry go mod download -json "k8s.io/kubernetes@$kv" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])') \
    || { log "FAILED: go mod download k8s.io/kubernetes@$kv"; exit 1; }
  local minor="${kv#v1.}"; local staging="v0.${minor}"
  {
    echo "module raygpu.local/k8sbuild"
    echo
    echo "go 1.24.0"
    echo
    echo "require ("
    echo "  k8s.io/kubernetes $kv"
    [ -n "$sp" ] && echo "  sigs.k8s.io/scheduler-plugins $sp"
    echo ")"
    echo
    echo "replace ("
    echo "  k8s.io/kubernetes => k8s.io/kubernetes $kv"
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk -v v="$staging" '{print "  " $1 " => " $1 " " v}'
    echo ")"
  } > "$src/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
    [ -n "$sp" ] && printf '\t_ "sigs.k8s.io/scheduler-plugins/cmd/%s"\n' scheduler controller
    printf ')\n'
  } > "$src/tools.go"
  (cd "$src" && retry go mod tidy) || { log "FAILED: go mod tidy for the k8s set (k8s.io/kubernetes@$kv${sp:+, scheduler-plugins@$sp})"; exit 1; }
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$kv -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor%%.*} -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=2026-01-01T00:00:00Z"
  log "k8s set: compiling kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $kv"
  (cd "$src" && go build -trimpath -ldflags "$ld" -o "$out/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl) \
    || { log "FAILED: kubernetes binaries $kv"; exit 1; }
  if [ -n "$sp" ]; then
    log "k8s set: compiling scheduler-plugins $sp (scheduler, controller)"
    (cd "$src" && go build -trimpath -ldflags "$ld" -o "$out/sp-scheduler" sigs.k8s.io/scheduler-plugins/cmd/scheduler \
        && go build -trimpath -ldflags "$ld" -o "$out/sp-controller" sigs.k8s.io/scheduler-plugins/cmd/controller) \
      || { log "FAILED: scheduler-plugins $sp"; exit 1; }
    # CRDs straight from the modules the binaries were built from.
    local moddir; moddir=$(go env GOMODCACHE)
    mkdir -p "$out/crds/scheduler-plugins"
    # PodGroup (coscheduling) and ElasticQuota (the PodGroup controller watches both)
    cp "$moddir/sigs.k8s.io/scheduler-plugins@$sp"/manifests/coscheduling/crd.yaml "$out/crds/scheduler-plugins/podgroups.yaml"
    cp "$moddir/sigs.k8s.io/scheduler-plugins@$sp"/manifests/capacityscheduling/crd.yaml "$out/crds/scheduler-plugins/elasticquotas.yaml"
    chmod -R u+w "$out/crds"
  fi
  echo "$((SECONDS - t0))" > "$out/.build_seconds"
  touch "$out/.done"
  log "k8s set built in $((SECONDS - t0)) s"
  echo "$out"
}

# ---- kuberay, kueue, kwok, helm, promtool: modules without replace lines: go install with GOBIN
build_install() {  # name version pkg crd_subdir [ldflags] [build tags]
  local name=$1 ver=$2 pkg=$3 crds=${4:-} ld="-s -w ${5:-}" tags=${6:-}
  local out="$CACHE/bin/$name-$ver"
  if stamp_ok "$out"; then log "$name cached: $out"; echo "$out"; return; fi
  local t0=$SECONDS; mkdir -p "$out"
  log "$name: go install ${tags:+-tags $tags }$pkg@$ver"
  GOBIN="$out" retry go install -trimpath ${tags:+-tags "$tags"} -ldflags "$ld" "$pkg@$ver" \
    || { log "FAILED: $name $pkg@$ver"; exit 1; }
  if [ -n "$crds" ]; then
    local mod="${pkg%%/cmd/*}"; local moddir; moddir=$(go env GOMODCACHE)
    mkdir -p "$out/crds"; cp -r "$moddir/$mod@$ver/$crds"/. "$out/crds/"; chmod -R u+w "$out/crds"
  fi
  echo "$((SECONDS - t0))" > "$out/.build_seconds"
  touch "$out/.done"; log "$name built in $((SECONDS - t0)) s"; echo "$out"
}

# ---- etcd: its server module has replace lines -> wrapper module
build_etcd() {
  local out="$CACHE/bin/etcd-$ETCD_VERSION"
  if stamp_ok "$out"; then log "etcd cached: $out"; echo "$out"; return; fi
  local t0=$SECONDS src="$CACHE/src/etcd-$ETCD_VERSION"; mkdir -p "$src" "$out"
  cat > "$src/go.mod" <<MOD
module raygpu.local/etcdbuild

go 1.26.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
MOD
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$src/tools.go"
  (cd "$src" && retry go mod tidy && go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3) \
    || { log "FAILED: etcd $ETCD_VERSION"; exit 1; }
  echo "$((SECONDS - t0))" > "$out/.build_seconds"
  touch "$out/.done"; log "etcd built in $((SECONDS - t0)) s"; echo "$out"
}

# ---- CRDs only, copied from a module's files (nothing compiled)
build_crds() {  # name version module subdir file...
  local name=$1 ver=$2 mod=$3 sub=$4; shift 4
  local out="$CACHE/bin/$name-$ver"
  if stamp_ok "$out"; then log "$name cached: $out"; echo "$out"; return; fi
  local t0=$SECONDS dir; mkdir -p "$out/crds"
  log "$name: go mod download $mod@$ver"
  dir=$(retry go mod download -json "$mod@$ver" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])') \
    || { log "FAILED: go mod download $mod@$ver"; exit 1; }
  for f in "$@"; do cp "$dir/$sub/$f" "$out/crds/" || { log "FAILED: $name: no $sub/$f in $mod@$ver"; exit 1; }; done
  chmod -R u+w "$out/crds"
  echo "$((SECONDS - t0))" > "$out/.build_seconds"
  touch "$out/.done"; log "$name ready in $((SECONDS - t0)) s"; echo "$out"
}

T0=$SECONDS
only="${1:-all}"
case "$only" in
  all|etcd) build_etcd >/dev/null ;;& 
  all|kwok) build_install kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok kustomize/stage >/dev/null ;;&
  all|k8s) build_k8s "$K8S_VERSION" "$SCHED_PLUGINS_VERSION" >/dev/null ;;&
  all) for v in $K8S_OTHER_VERSIONS; do build_k8s "$v" >/dev/null; done ;;&
  k8s-v*) build_k8s "${only#k8s-}" >/dev/null ;;&
  all|kuberay) build_install kuberay "$KUBERAY_VERSION" github.com/ray-project/kuberay/ray-operator config/crd/bases >/dev/null ;;&
  all|kueue) build_install kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue config/components >/dev/null ;;&
  # helm has no replace lines; without the -X its `helm version` says only "v4.3"
  all|helm) build_install helm "$HELM_VERSION" helm.sh/helm/v4/cmd/helm "" \
              "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" >/dev/null ;;&
  # `promtool --version` says the Prometheus release: module v0.316.0 is Prometheus 3.16.0
  all|promtool) n="${PROMTOOL_VERSION#v0.}"; mm="${n%%.*}"
                build_install promtool "$PROMTOOL_VERSION" github.com/prometheus/prometheus/cmd/promtool "" \
                  "-X github.com/prometheus/common/version.Version=${mm:0:1}.$((10#${mm:1})).${n#*.}" remove_all_sd >/dev/null ;;&
  all|prometheus-operator-crds) build_crds prometheus-operator-crds "$PROMETHEUS_OPERATOR_VERSION" \
                  github.com/prometheus-operator/prometheus-operator example/prometheus-operator-crd \
                  monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_podmonitors.yaml \
                  monitoring.coreos.com_prometheusrules.yaml >/dev/null ;;&
  *) ;;
esac
log "all components ready in $((SECONDS - T0)) s (cache: $CACHE/bin)"
