#!/usr/bin/env bash
# The demo: installs what is missing for the default major only (Debian's PostgreSQL 15: no other
# major is downloaded; the test command fetches them when it first needs them), starts the
# private cluster, installs the extension (the dev build the test command's install layer makes,
# in target/debug: the demo measures nothing), runs the demo program (demo/src/main.rs),
# prints its findings, and stops the cluster.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
logs=$root/target/demo-logs
mkdir -p "$logs"
export PG_CONFIG=${PG_CONFIG:-$(scripts/pg-env.sh config "$(scripts/pg-env.sh default)")}
major=$(scripts/pg-env.sh major "$PG_CONFIG")
bash scripts/setup.sh --majors "$major"
echo "building and installing the extension (log: target/demo-logs/build.log) ..."
(cd extension && cargo pgrx install --pg-config "$PG_CONFIG" --no-default-features --features "pg$major") >"$logs/build.log" 2>&1 \
    || { tail -30 "$logs/build.log"; exit 1; }
cargo build -q -p idempotency-demo --bin demo >>"$logs/build.log" 2>&1 || { tail -30 "$logs/build.log"; exit 1; }
cargo run -q -p xtask -- pg start >/dev/null
trap 'cargo run -q -p xtask -- pg stop' EXIT
echo
"$root/target/debug/demo"
