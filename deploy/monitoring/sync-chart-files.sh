#!/usr/bin/env bash
# Copy the files the Helm chart renders from deploy/ into the chart, which can read only files inside itself
# (deploy/helm/raygpu/files/): the alerting rules and the Grafana dashboard (the PrometheusRule and the
# dashboard ConfigMap), the guard's PriorityClass (guard.priorityClass.enabled) and the workload backend's
# admission policy (workloadPolicy.enabled). Run after editing any of them; tests/unit/test_monitoring.py and
# tests/unit/test_deploy_helm.py fail while the copies differ.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
deploy="$here/.."
dest="$deploy/helm/raygpu/files"
mkdir -p "$dest"
cp "$here/raygpu-rules.yaml" "$here/grafana-dashboard.json" "$dest/"
cp "$deploy/guard/priorityclasses.yaml" "$dest/guard-priorityclasses.yaml"
cp "$deploy/workload/mutating-admission-policy.yaml" "$dest/workload-mutating-admission-policy.yaml"
echo "copied raygpu-rules.yaml, grafana-dashboard.json, guard-priorityclasses.yaml and" \
     "workload-mutating-admission-policy.yaml to deploy/helm/raygpu/files"
