#!/usr/bin/env bash
# The benchmark (DESIGN section 8): installs what is missing, starts the private cluster, installs
# the release build, runs every case interleaved A/B/B/A, prints the table, and writes
# target/bench/results.csv and target/bench/benchmark.png. `--smoke`: a few seconds per case,
# checking only that every case produced numbers (the test command runs this). `--http`: only the
# HTTP rows (the example services against their routes without the layer, ≈ 2.5 minutes), into
# target/bench/http.csv; IDEM_BENCH_HTTP_PORT=N serves them on port N (and N+1), not ephemeral.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
mkdir -p target/bench
bash scripts/setup.sh
export PG_CONFIG=${PG_CONFIG:-$(scripts/pg-env.sh config "$(scripts/pg-env.sh default)")}
major=$(scripts/pg-env.sh major "$PG_CONFIG")
(cd extension && cargo pgrx install --release --pg-config "$PG_CONFIG" --no-default-features --features "pg$major") >target/bench/build.log 2>&1 \
    || { tail -30 target/bench/build.log; exit 1; }
cargo build --release -q -p idempotency-bench --bin bench >>target/bench/build.log 2>&1 || { tail -30 target/bench/build.log; exit 1; }
scripts/pg.sh start >/dev/null
trap 'scripts/pg.sh stop' EXIT
"$root/target/release/bench" "$@"
