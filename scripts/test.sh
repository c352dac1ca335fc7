#!/usr/bin/env bash
# Runs every test layer and prints a summary; the last line is `N passed, N failed`.
# Installs what is missing first (scripts/setup.sh). Exits non-zero if any layer fails.
#
#   unit        cargo test -p idempotency-client (fingerprint, key rules, response policy, doc tests)
#   pg_test     cargo pgrx test: the Rust that runs inside PostgreSQL
#   install     cargo pgrx install --release (what the next layers test)
#   regress     pg_regress golden files (tests/regress) against the private cluster
#   isolation   pg_isolation_regress specs (tests/isolation) against the private cluster
#   e2e         cargo test -p idempotency-tests: the client end to end against the private cluster
#   bench       the benchmark in smoke mode: every case runs and produces numbers (no speed asserted)
#   pgspot      pgspot over the generated install script
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
pgxs=$(dirname "$(dirname "$(dirname "$("$PG_CONFIG" --pgxs)")")")
bindir=$("$PG_CONFIG" --bindir)
sharedir=$("$PG_CONFIG" --sharedir)
port=${IDEM_PG_PORT:-55415}
logs=$root/target/test-logs
mkdir -p "$logs"

bash scripts/setup.sh || { echo "setup failed"; exit 1; }

total_pass=0
total_fail=0
summary=()
failed_layers=0

# record LAYER PASSED FAILED STATUS
record() {
    local layer=$1 pass=$2 fail=$3 status=$4
    if [ "$status" != 0 ] && [ "$fail" = 0 ]; then fail=1; fi # a crash or build failure counts
    total_pass=$((total_pass + pass))
    total_fail=$((total_fail + fail))
    [ "$fail" = 0 ] || failed_layers=$((failed_layers + 1))
    summary+=("$(printf '%-10s %5s passed, %s failed' "$layer" "$pass" "$fail")")
    printf '== %s: %s passed, %s failed (log: %s)\n' "$layer" "$pass" "$fail" "${logs#$root/}/$layer.log"
}

# Sums the `test result:` lines of cargo's test harness.
cargo_counts() {
    awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1); if ($(i) ~ /^failed/) f += $(i-1) } }
         END { printf "%d %d\n", p, f }' "$1"
}

# Counts pg_regress / pg_isolation_regress result lines.
regress_counts() {
    awk '/\.\.\. +ok/ { p++ } /\.\.\. +FAILED/ || /\.\.\. +failed/ { f++ } END { printf "%d %d\n", p, f }' "$1"
}

layer() { printf '\n== %s\n' "$1"; }

layer unit
cargo test -p idempotency-client 2>&1 | tee "$logs/unit.log" | grep -E '^(test |test result|error)' | grep -v '\.\.\. ok$'
status=${PIPESTATUS[0]}
read -r p f < <(cargo_counts "$logs/unit.log")
record unit "$p" "$f" "$status"

layer pg_test
pgrx_data=$root/target/pgrx-test-data
mkdir -p "$pgrx_data"
[ "$(id -u)" = 0 ] && chown postgres:postgres "$pgrx_data"
runas=()
[ "$(id -u)" = 0 ] && runas=(--runas postgres)
(cd extension && cargo pgrx test pg15 "${runas[@]}" --pgdata "$pgrx_data") >"$logs/pg_test.log" 2>&1
status=$?
grep -E '^(test |test result|error)' "$logs/pg_test.log" | grep -v '\.\.\. ok$'
read -r p f < <(cargo_counts "$logs/pg_test.log")
record pg_test "$p" "$f" "$status"

layer install
# cargo pgrx test installed a debug build; the remaining layers test the release build.
(cd extension && cargo pgrx install --release --pg-config "$PG_CONFIG") >"$logs/install.log" 2>&1
status=$?
tail -1 "$logs/install.log"
record install "$([ $status = 0 ] && echo 1 || echo 0)" 0 "$status"

# pg_regress_layer NAME DRIVER ARGS...: one pg_regress-style layer against the private cluster.
pg_regress_layer() {
    local name=$1 driver=$2
    shift 2
    rm -rf "$root/target/$name"
    "$driver" --bindir="$bindir" --host=127.0.0.1 --port="$port" --user=postgres \
        --dbname="idem_$name" --inputdir="tests/$name" --outputdir="$root/target/$name" "$@" \
        >"$logs/$name.log" 2>&1
    local status=$?
    grep -E '\.\.\.|tests|FAIL' "$logs/$name.log"
    [ $status = 0 ] || head -150 "$root/target/$name/regression.diffs" 2>/dev/null
    read -r p f < <(regress_counts "$logs/$name.log")
    record "$name" "$p" "$f" "$status"
}

layer regress
url=$(scripts/pg.sh start) || { record regress 0 1 1; url=; }
if [ -n "$url" ]; then
    pg_regress_layer regress "$pgxs/src/test/regress/pg_regress" --schedule=tests/regress/schedule
fi

layer isolation
if [ -n "$url" ]; then
    # shellcheck disable=SC2046
    pg_regress_layer isolation "$pgxs/src/test/isolation/pg_isolation_regress" \
        $(cd tests/isolation/specs && ls -- *.spec | sed 's/\.spec$//' | sort)
fi

layer e2e
if [ -n "$url" ]; then
    cargo test -p idempotency-tests >"$logs/e2e.log" 2>&1
    status=$?
    grep -E '^(test |test result|error)' "$logs/e2e.log" | grep -v '\.\.\. ok$'
    [ $status = 0 ] || grep -A30 -- '---- ' "$logs/e2e.log" | head -80
    read -r p f < <(cargo_counts "$logs/e2e.log")
    record e2e "$p" "$f" "$status"
fi

layer bench
if [ -n "$url" ]; then
    cargo build --release -q -p idempotency-tests --bin bench >"$logs/bench.log" 2>&1 && target/release/bench --smoke >>"$logs/bench.log" 2>&1
    status=$?
    tail -3 "$logs/bench.log"
    record bench "$([ $status = 0 ] && echo 1 || echo 0)" 0 "$status"
fi
scripts/pg.sh stop || true

layer pgspot
# Every finding fails the layer unless it is explained in tests/pgspot-ignore (code + reason).
ignores=()
while read -r code _; do
    [ -n "$code" ] && ignores+=(--ignore "$code")
done < <(grep -v '^#' tests/pgspot-ignore 2>/dev/null || true)
script="$sharedir/extension/idempotency--$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2).sql"
# idem_maintain commits between batches, so it cannot pin its search_path with a SET clause; its
# body qualifies every name and operator instead (sql/operations.sql).
python3 -m pgspot "${ignores[@]}" --proc-without-search-path 'extschema.idem_maintain(batch_size integer,action text)' \
    "$script" >"$logs/pgspot.log" 2>&1
status=$?
cat "$logs/pgspot.log"
findings=$(grep -cE '^PS[0-9]+' "$logs/pgspot.log")
if [ "$findings" = 0 ] && [ $status = 0 ] && grep -q 'Errors: 0 Warnings: 0 Unknown: 0' "$logs/pgspot.log"; then
    record pgspot 1 0 0
else
    record pgspot 0 "$findings" 1
fi

printf '\n== summary\n'
printf '%s\n' "${summary[@]}"
printf '%d passed, %d failed\n' "$total_pass" "$total_fail"
[ "$total_fail" = 0 ] && [ "$failed_layers" = 0 ]
