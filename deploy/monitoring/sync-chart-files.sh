#!/usr/bin/env bash
# Copy the alerting rules and the Grafana dashboard into the Helm chart, which can read only files inside
# itself (deploy/helm/raygpu/files/: the PrometheusRule and the dashboard ConfigMap). Run after editing either;
# tests/unit/test_monitoring.py fails while the copies differ.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="$here/../helm/raygpu/files"
mkdir -p "$dest"
cp "$here/raygpu-rules.yaml" "$here/grafana-dashboard.json" "$dest/"
echo "copied raygpu-rules.yaml and grafana-dashboard.json to ${dest#"$here/"}"
