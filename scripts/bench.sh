#!/usr/bin/env bash
# The benchmark of the performance goals (docs/performance.md): installs what is missing, starts the private cluster, installs
# the release build, runs every case interleaved A/B/B/A, prints the table, and writes
# target/bench/results.csv and target/bench/benchmark.png; then the soak (100 cycles swept by the
# maintenance worker, on a server of its own with idempotency preloaded, port IDEM_SOAK_PORT,
# default 55915), which writes target/bench/soak.csv and target/bench/soak.png. `--smoke`: a few
# seconds per case and a 6-cycle soak, checking only that every case produced numbers (the test
# command runs this). `--soak`: the soak alone. `--rust`: the Rust client's rows alone. `--http`:
# only the HTTP rows (the example services against their routes without the layer, ≈ 2.5
# minutes), into target/bench/http.csv; IDEM_BENCH_HTTP_PORT=N serves them on port N (and N+1).
# `--stacks`: only the actix-web and tonic rows (each example's route behind its layer against the
# same route without it), into target/bench/stacks.csv. `--scale`: only the ten-million-key rows
# (bench/src/scale.rs: reserve at 10M vs 10k records, the sweep of a 10M backlog, bytes per record,
# the worker's effect on p99, the 0.5.0 upgrade over 10M records) on a server of their own (data
# directory target/scale, port IDEM_SCALE_PORT, default 56230, the PostgreSQL of PG_CONFIG; it takes
# no URL and uses no other cluster), into target/bench/scale.csv; `--scale --smoke`: 20,000 rows.
# The binary alone runs it too, without the install: PG_CONFIG=target/postgres/16/bin/pg_config
# target/release/bench --scale.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
mkdir -p target/bench
export PG_CONFIG=${PG_CONFIG:-$(scripts/pg-env.sh config "$(scripts/pg-env.sh default)")}
major=$(scripts/pg-env.sh major "$PG_CONFIG")
bash scripts/setup.sh --majors "$major"
# The release build (fat LTO) that ships, in target/release (the package layer's).
(cd extension && cargo pgrx install --release --pg-config "$PG_CONFIG" --no-default-features --features "pg$major") >target/bench/build.log 2>&1 \
    || { tail -30 target/bench/build.log; exit 1; }
cargo build --release -q -p idempotency-bench --bin bench >>target/bench/build.log 2>&1 || { tail -30 target/bench/build.log; exit 1; }
# fsync on for every server of the benchmark (a test server runs with it off), so the figures are
# a real server's; a cluster running without it is restarted.
export IDEM_PG_DURABLE=1
cargo run -q -p xtask -- pg start >/dev/null
trap 'cargo run -q -p xtask -- pg stop' EXIT
"$root/target/release/bench" "$@"
