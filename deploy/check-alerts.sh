#!/usr/bin/env bash
# Checks deploy/alerts.yaml: promtool (Debian's prometheus package) validates the rules,
# and every inplaced_* / inplace_extension_* metric name the rules use must be one the
# binaries export (the names are read from the metric tables in crates/agent/src/metrics.rs and
# crates/extension/src/metrics.rs, which tests/metrics.rs and tests/capi.rs assert are scraped).
# Then the identity rules of deploy/extension.yaml (deploy/check-extension.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v promtool >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # the daemon is not wanted, only promtool; no service starts without systemd
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
promtool check rules deploy/alerts.yaml
# each alert fires on the first event after a start (the series start at 0), not without one
promtool test rules deploy/alerts.test.yaml
exported=$(grep -ohE '`(inplaced|inplace_extension)_[a-z_]+`' crates/agent/src/metrics.rs crates/extension/src/metrics.rs | tr -d '`' | sort -u)
used=$(grep -ohE '(inplaced|inplace_extension)_[a-z_]+' deploy/alerts.yaml deploy/alerts.test.yaml | grep -v '^inplaced_prom' | sort -u)
missing=0
for m in $used; do
    if ! grep -qx "$m" <<<"$exported"; then
        echo "deploy/alerts.yaml uses $m, which no binary exports" >&2
        missing=1
    fi
done
[ "$missing" = 0 ]
echo "alerts: $(grep -c -- '- alert:' deploy/alerts.yaml) rules checked, $(grep -c -- '- eval_time:' deploy/alerts.test.yaml) rule test evaluations passed"

# what the binaries export, as promtool check metrics reads it (the Prometheus text
# format 0.0.4 and its lint): both /metrics endpoints (no Accept header, as curl) and
# the agent's node_exporter textfile
bash deploy/check-metrics.sh

# deploy/extension.yaml's identity rules (README "Who can obtain CAPI's identity"):
# deploy/check-extension.py, its mutations first (each must be reported)
if ! python3 -c 'import yaml' 2>/dev/null; then
    python3 -m pip install --quiet pyyaml 2>/dev/null ||
        { apt-get update -qq >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-yaml >/dev/null; }
fi
python3 deploy/check-extension.py --self-test
python3 deploy/check-extension.py
