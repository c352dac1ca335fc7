#!/usr/bin/env bash
# Runs the test layers on every supported PostgreSQL major and prints a summary per major; the
# last line is `N passed, N failed` over all of them. Installs what is missing first
# (scripts/setup.sh). Exits non-zero if any layer fails.
#
#   scripts/test.sh                 every layer on the default major (PG_CONFIG, default Debian's
#                                   15), the core layers on each other major (scripts/pg-env.sh)
#   scripts/test.sh --all-majors    every layer on every major
#   scripts/test.sh --majors "14 17"  only these majors (every layer on the default one, if given)
#
# Layers (* = core: run on every major):
#   unit        cargo test -p idempotency-core -p idempotency-client (fingerprint, key rules, vocabulary, response policy, the layer's header, record and fingerprint rules, statement binding, sslmode parsing with and without the tls feature, the sqlx constructor's sslmode with and without it, doc tests)
#   lint        cargo clippy over every crate and target, the extension included; a warning fails
#   pg_test *   cargo pgrx test: the Rust that runs inside PostgreSQL
#   package *   scripts/package.sh, then each package installed into a fresh copy of the major's
#               tree (the .deb with dpkg on Debian's 15) and tests/package's smoke test against it
#   install *   cargo pgrx install --release (what the next layers test)
#   regress *   pg_regress golden files (tests/regress) against the major's private cluster
#   isolation * pg_isolation_regress specs (tests/isolation) against the private cluster
#   e2e *       cargo test -p idempotency-tests: the client end to end against the private cluster
#               (core: the checklist test binary, which holds the concurrency tests)
#   e2e_portable * the same tests against the portable install (IDEM_INSTALL=portable)
#   e2e_sqlx *  the same tests over the sqlx driver (cargo test --features sqlx)
#   upgrade *   scripts/test-upgrade.sh: updates from every released version, schema diff, load
#   portable *  scripts/test-portable.sh: the portable install, fingerprint parity, suites, upgrade
#   python *    scripts/test-python.sh: the SQL API from Python (psycopg 3, examples/python) against
#               the extension and the portable install, both flows, concurrent duplicates run once
#   bench       the benchmark in smoke mode: every case runs and produces numbers (no speed asserted)
#   failover *  tests/tests/failover.rs: a primary and a streaming standby, the primary killed
#               under load, the standby promoted (records, business rows, tokens, the worker)
#   pg_upgrade  tests/tests/pg_upgrade.rs, once after the majors: pg_upgrade 14 -> 18 and 15 -> 17
#               (records in every state, a two-phase reservation in flight, the worker after)
#   ops         scripts/test-ops.sh: the maintenance worker, the counters and the pg_cron recipe
#               on preloaded servers of their own
#   pgspot      pgspot over the generated install script
#   citus       scripts/test-citus.sh: a coordinator and two workers on loopback, the records
#               distributed with a business table (in-transaction flow, duplicates, tokens,
#               maintenance across shards, a shard move under load). Runs when Citus is installed
#               in the major's PostgreSQL (its citus.control); otherwise reported as skipped.
#
# Each major's private cluster is scripts/pg.sh's (port 554NN; IDEM_PG_PORT overrides the default
# major's). Logs: target/test-logs/pgNN/LAYER.log.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
env_sh=$root/scripts/pg-env.sh

all_majors=0
only=
while [ $# -gt 0 ]; do
    case "$1" in
    --all-majors) all_majors=1 ;;
    --majors) only=${2:?--majors needs a list such as \"14 17\"}; shift ;;
    *) echo "test.sh: unknown argument '$1'; usage:" >&2; sed -n '6,9p' "$0" >&2; exit 2 ;;
    esac
    shift
done

default_config=${PG_CONFIG:-$("$env_sh" config "$("$env_sh" default)")}
export PG_CONFIG=$default_config
default_major=$("$env_sh" major "$default_config") || { echo "PG_CONFIG=$PG_CONFIG: not a pg_config"; exit 1; }
default_port=${IDEM_PG_PORT:-}
majors=${only:-$("$env_sh" majors)}
for major in $majors; do
    case " $("$env_sh" majors) " in *" $major "*) ;; *) echo "--majors: $major is not one of: $("$env_sh" majors)"; exit 2 ;; esac
done

bash scripts/setup.sh || { echo "setup failed"; exit 1; }
export IDEM_SETUP_DONE=1 # scripts/package.sh need not run it again
version=$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)

total_pass=0
total_fail=0
summary=()
failed_layers=0

# record LAYER PASSED FAILED STATUS (for the current major)
record() {
    local layer=$1 pass=$2 fail=$3 status=$4
    if [ "$status" != 0 ] && [ "$fail" = 0 ]; then fail=1; fi # a crash or build failure counts
    if [ "$pass" = 0 ] && [ "$fail" = 0 ]; then fail=1; fi     # so does a layer that counted nothing
    total_pass=$((total_pass + pass))
    total_fail=$((total_fail + fail))
    major_pass=$((major_pass + pass))
    major_fail=$((major_fail + fail))
    [ "$fail" = 0 ] || failed_layers=$((failed_layers + 1))
    summary+=("$(printf 'pg%s %-16s %5s passed, %s failed  %4ss' "$major" "$layer" "$pass" "$fail" "$((SECONDS - layer_started))")")
    printf '== pg%s %s: %s passed, %s failed (log: %s)\n' "$major" "$layer" "$pass" "$fail" "${logs#$root/}/$layer.log"
}

# Sums the `test result:` lines of cargo's test harness.
cargo_counts() {
    awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1); if ($(i) ~ /^failed/) f += $(i-1) } }
         END { printf "%d %d\n", p, f }' "$1"
}

# Counts pg_regress / pg_isolation_regress result lines: `test name ... ok` up to 15, TAP lines
# (`ok 1 - name`, `not ok 1 - name`) from 16.
regress_counts() {
    awk '/\.\.\. +ok/ || /^ok [0-9]+ / { p++ } /\.\.\. +FAILED/ || /\.\.\. +failed/ || /^not ok [0-9]+ / { f++ }
         END { printf "%d %d\n", p, f }' "$1"
}

# layer NAME: starts a layer (its time, in the summary, runs until its record).
layer() {
    printf '\n== pg%s %s\n' "$major" "$1"
    layer_started=$SECONDS
}

# pg_regress_run NAME LOGNAME CONFIG DRIVER ARGS...: a pg_regress-style run of tests/NAME against
# the private cluster, with CONFIG's binaries; records it as LOGNAME.
pg_regress_run() {
    local name=$1 logname=$2 config=$3 driver=$4 out=$root/target/$2/pg$major
    shift 4
    local pgxs
    pgxs=$(dirname "$(dirname "$(dirname "$("$config" --pgxs)")")")
    rm -rf "$out"
    mkdir -p "$out"
    "$pgxs/$driver" --bindir="$("$config" --bindir)" --host=127.0.0.1 --port="$IDEM_PG_PORT" --user=postgres \
        --dbname="idem_$logname" --inputdir="tests/$name" --outputdir="$out" "$@" >"$logs/$logname.log" 2>&1
    local status=$?
    grep -E '\.\.\.|tests|FAIL|^(not )?ok ' "$logs/$logname.log"
    [ $status = 0 ] || head -150 "$out/regression.diffs" 2>/dev/null
    read -r p f < <(regress_counts "$logs/$logname.log")
    record "$logname" "$p" "$f" "$status"
}

# package_smoke LAYER CONFIG: the package smoke test against the private cluster run with CONFIG's
# binaries (the cluster's data directory is the major's own).
package_smoke() {
    local name=$1 config=$2
    scripts/pg.sh stop
    if PG_CONFIG=$config scripts/pg.sh start >/dev/null; then
        pg_regress_run package "$name" "$config" src/test/regress/pg_regress smoke
    else
        record "$name" 0 1 1
    fi
    PG_CONFIG=$config scripts/pg.sh stop
}

# run_major MAJOR PG_CONFIG FULL: the layers on one major (every layer when FULL is 1).
run_major() {
    major=$1
    local config=$2 full=$3
    major_pass=0
    major_fail=0
    export PG_CONFIG=$config
    if [ "$major" = "$default_major" ] && [ -n "$default_port" ]; then
        export IDEM_PG_PORT=$default_port
    else
        export IDEM_PG_PORT=$((55400 + major))
    fi
    logs=$root/target/test-logs/pg$major
    mkdir -p "$logs"
    printf '\n######## PostgreSQL %s (%s, port %s, %s layers)\n' "$major" "$config" "$IDEM_PG_PORT" \
        "$([ "$full" = 1 ] && echo all || echo core)"
    local features=(--no-default-features --features "pg$major")
    local runas=()
    [ "$(id -u)" = 0 ] && runas=(--runas postgres)

    if [ "$major" = "$default_major" ]; then # the client crate does not depend on the major
        layer unit
        # The pure rules, the client without TLS (the feature-off refusals), then its TLS code;
        # the sqlx driver's constructor without TLS and with it.
        { cargo test --no-fail-fast -p idempotency-core -p idempotency-client --features idempotency-client/axum,idempotency-client/metrics 2>&1 &&
            cargo test --no-fail-fast -p idempotency-client --features tls --lib tls 2>&1 &&
            cargo test --no-fail-fast -p idempotency-client --features sqlx --lib driver::sqlx 2>&1 &&
            cargo test --no-fail-fast -p idempotency-client --features sqlx,tls --lib driver::sqlx 2>&1; } | tee "$logs/unit.log" | grep -E '^(test |test result|error)' | grep -v '\.\.\. ok$'
        status=${PIPESTATUS[0]}
        read -r p f < <(cargo_counts "$logs/unit.log")
        record unit "$p" "$f" "$status"

        layer lint
        # The lints are configured once, in the root Cargo.toml's [workspace.lints].
        # Then the client, its test kit and tests over sqlx with TLS (the code behind those features).
        { cargo clippy --workspace --all-targets -- -D warnings &&
            cargo clippy -p idempotency-client -p idempotency-testkit -p idempotency-tests --all-targets \
                --features idempotency-client/sqlx,idempotency-client/tls,idempotency-tests/sqlx -- -D warnings; } >"$logs/lint.log" 2>&1
        status=$?
        grep -E '^(warning|error)' -A5 "$logs/lint.log" | head -60
        record lint "$([ $status = 0 ] && echo 1 || echo 0)" 0 "$status"
    fi

    layer pg_test
    local pgrx_data=$root/target/pgrx-test-data/$major
    mkdir -p "$pgrx_data"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$(dirname "$pgrx_data")" "$pgrx_data"
    (cd extension && cargo pgrx test "pg$major" "${features[@]}" "${runas[@]}" --pgdata "$pgrx_data") >"$logs/pg_test.log" 2>&1
    status=$?
    grep -E '^(test |test result|error)' "$logs/pg_test.log" | grep -v '\.\.\. ok$'
    read -r p f < <(cargo_counts "$logs/pg_test.log")
    record pg_test "$p" "$f" "$status"

    layer package
    local pkg=$root/target/packages/pg$major tested=$root/target/package-test/pg$major
    if scripts/package.sh "$major" >"$logs/package.log" 2>&1; then
        cat "$logs/package.log"
        # The tarball, into a fresh copy of the major's relocatable tree, installed by its install.sh.
        local copy
        copy=$("$env_sh" unpack "$major" "$tested/tree") &&
            tar -xzf "$pkg/idempotency-$version-pg$major-linux-"*.tar.gz -C "$tested" &&
            PG_CONFIG=$copy "$tested"/idempotency-*/install.sh >>"$logs/package.log" 2>&1
        if [ $? = 0 ]; then package_smoke package_tarball "$copy"; else record package_tarball 0 1 1; fi
        layer_started=$SECONDS
        # The .deb: dpkg into Debian's own directories when the default major is Debian's (and
        # removed again); otherwise its files, unpacked, into a fresh copy of the tree.
        local deb
        deb=$(ls "$pkg"/postgresql-"$major"-idempotency_*.deb 2>/dev/null)
        if [ -n "$deb" ] && [ "$config" = "$("$env_sh" debian)" ]; then
            if dpkg -i "$deb" >>"$logs/package.log" 2>&1; then
                package_smoke package_deb "$config"
                dpkg -r "postgresql-$major-idempotency" >>"$logs/package.log" 2>&1 || record package_deb_remove 0 1 1
            else
                record package_deb 0 1 1
            fi
        elif [ -n "$deb" ]; then
            local debian_config
            debian_config=$("$env_sh" debian)
            copy=$("$env_sh" unpack "$major" "$tested/deb-tree") &&
                dpkg-deb -x "$deb" "$tested/deb-root" &&
                cp "$tested/deb-root$("$debian_config" --pkglibdir)"/idempotency.so "$("$copy" --pkglibdir)/" &&
                cp "$tested/deb-root$("$debian_config" --sharedir)"/extension/idempotency* "$("$copy" --sharedir)/extension/"
            if [ $? = 0 ]; then package_smoke package_deb "$copy"; else record package_deb 0 1 1; fi
        fi
        rm -rf "$tested"
    else
        tail -30 "$logs/package.log"
        record package 0 1 1
    fi

    layer install
    # cargo pgrx test installed a debug build; the remaining layers test the release build.
    (cd extension && cargo pgrx install --release --pg-config "$config" "${features[@]}") >"$logs/install.log" 2>&1 &&
        python3 scripts/sqlbuild.py install-files "$("$config" --sharedir)/extension" >>"$logs/install.log" 2>&1 # released + update scripts
    status=$?
    tail -1 "$logs/install.log"
    record install "$([ $status = 0 ] && echo 1 || echo 0)" 0 "$status"

    layer regress
    local url
    url=$(scripts/pg.sh start) || { record regress 0 1 1; url=; }
    if [ -n "$url" ]; then
        pg_regress_run regress regress "$config" src/test/regress/pg_regress --load-extension=idempotency \
            --schedule=tests/regress/schedule

        layer isolation
        # shellcheck disable=SC2046
        pg_regress_run isolation isolation "$config" src/test/isolation/pg_isolation_regress --load-extension=idempotency \
            $(cd tests/isolation/specs && ls -- *.spec | sed 's/\.spec$//' | sort)

        # e2e against the extension, then against the portable install (IDEM_INSTALL: the test kit
        # installs target/idempotency-portable.sql instead of CREATE EXTENSION).
        local e2e=(--no-fail-fast -p idempotency-tests) kind install # every test binary runs, and is counted
        [ "$full" = 1 ] || e2e+=(--test checklist)
        # e2e_sqlx: the same tests over the sqlx driver (the test kit's handle follows the feature).
        for kind in e2e e2e_portable e2e_sqlx; do
            layer $kind
            install=extension
            local driver=()
            if [ $kind = e2e_portable ]; then
                install=portable
                bash scripts/portable.sh >target/idempotency-portable.sql || { record $kind 0 1 1; continue; }
            fi
            [ $kind = e2e_sqlx ] && driver=(--features sqlx)
            IDEM_INSTALL=$install cargo test "${e2e[@]}" "${driver[@]}" >"$logs/$kind.log" 2>&1
            status=$?
            grep -E '^(test |test result|error)' "$logs/$kind.log" | grep -v '\.\.\. ok$'
            [ $status = 0 ] || grep -A30 -- '---- ' "$logs/$kind.log" | head -80
            read -r p f < <(cargo_counts "$logs/$kind.log")
            record $kind "$p" "$f" "$status"
        done

        if [ "$full" = 1 ]; then
            layer bench
            cargo build --release -q -p idempotency-bench --bin bench >"$logs/bench.log" 2>&1 && target/release/bench --smoke >>"$logs/bench.log" 2>&1
            status=$?
            tail -3 "$logs/bench.log"
            record bench "$([ $status = 0 ] && echo 1 || echo 0)" 0 "$status"
        fi
    fi
    scripts/pg.sh stop || true

    layer failover
    # A primary and a streaming standby of this major (tests/tests/failover.rs, servers of its own).
    IDEM_SERVERS_PORT=$((IDEM_PG_PORT + 400)) cargo test --no-fail-fast -p idempotency-tests --test failover -- --ignored >"$logs/failover.log" 2>&1
    status=$?
    grep -E '^(test |test result|error)' "$logs/failover.log" | grep -v '\.\.\. ok$'
    [ $status = 0 ] || grep -A30 -- '---- ' "$logs/failover.log" | head -60
    read -r p f < <(cargo_counts "$logs/failover.log")
    record failover "$p" "$f" "$status"

    # The upgrade, portable and python layers run their own throwaway cluster on the (now free) port.
    local name
    local names=(upgrade portable python)
    [ "$full" = 1 ] && names+=(ops) # the worker and pg_cron need a preloaded server of their own
    for name in "${names[@]}"; do
        layer "$name"
        IDEM_OPS_PORT=$((IDEM_PG_PORT + 20)) IDEM_CRON_PORT=$((IDEM_PG_PORT + 21)) \
            bash "scripts/test-$name.sh" >"$logs/$name.log" 2>&1
        status=$?
        grep -E '^FAILED|^   ' "$logs/$name.log" | head -60
        read -r p f < <(tail -1 "$logs/$name.log" | awk '/passed,.*failed/ { print $1, $3; next } { print 0, 1 }')
        record "$name" "$p" "$f" "$status"
    done

    if [ "$full" = 1 ]; then
        layer citus
        if [ -f "$("$config" --sharedir)/extension/citus.control" ]; then
            # Three servers of its own: ports 30-32 above the private cluster's.
            IDEM_CITUS_PORT=$((IDEM_PG_PORT + 30)) bash scripts/test-citus.sh >"$logs/citus.log" 2>&1
            status=$?
            grep -E '^FAILED|^== ' "$logs/citus.log" | head -40
            read -r p f < <(tail -1 "$logs/citus.log" | awk '/passed,.*failed/ { print $1, $3; next } { print 0, 1 }')
            record citus "$p" "$f" "$status"
        else
            printf '== pg%s citus: skipped (Citus is not installed in %s)\n' "$major" "$("$config" --sharedir)/extension"
            summary+=("$(printf 'pg%s %-16s skipped: Citus is not installed' "$major" citus)")
        fi

        layer pgspot
        # Every finding fails the layer, but one: the native functions of sql/native.sql are
        # SECURITY DEFINER without a SET search_path on purpose (they resolve nothing by name;
        # see that file), which pgspot reports as PS003.
        local script native findings
        script="$("$config" --sharedir)/extension/idempotency--$version.sql"
        python3 -m pgspot --proc-without-search-path 'extschema.idem_maintain(batch_size integer,action text)' "$script" >"$logs/pgspot.log" 2>&1
        cat "$logs/pgspot.log"
        native=$(sed -n 's/^CREATE OR REPLACE FUNCTION @extschema@\.\([a-z_]*\)(.*/\1/p' sql/native.sql | paste -sd'|')
        findings=$(grep -E '^PS[0-9]+' "$logs/pgspot.log" |
            grep -cvE "^PS003: SECURITY DEFINER function without explicit search_path: extschema\.($native)\(")
        if [ -n "$native" ] && [ "$findings" = 0 ] && grep -q '^ Errors: [0-9]* Warnings: 0 Unknown: 0' "$logs/pgspot.log"; then
            record pgspot 1 0 0
        else
            record pgspot 0 "$findings" 1
        fi
    fi
    per_major+=("$(printf 'pg%s: %d passed, %d failed (%s layers, %ds)' "$major" "$major_pass" "$major_fail" \
        "$([ "$full" = 1 ] && echo all || echo core)" "$((SECONDS - started))")")
}

per_major=()
# The default major first: it runs every layer.
majors="$(printf '%s\n' $majors | grep -x "$default_major") $(printf '%s\n' $majors | grep -vx "$default_major")"
for m in $majors; do
    started=$SECONDS
    if [ "$m" = "$default_major" ]; then
        run_major "$m" "$default_config" 1
    else
        run_major "$m" "$("$env_sh" config "$m")" "$all_majors"
    fi
done

# pg_upgrade between majors (14 -> 18, 15 -> 17), once every major's tree has the extension:
# the default major's tree gets it here (its layers used Debian's own directories).
if [ -z "$only" ] || (for m in 14 15 17 18; do case " $majors " in *" $m "*) ;; *) exit 1 ;; esac; done); then
    major=all
    logs=$root/target/test-logs/pg_upgrade
    mkdir -p "$logs"
    started=$SECONDS
    layer pg_upgrade
    tree15=$("$env_sh" tree "$default_major")
    (cd extension && cargo pgrx install --release --pg-config "$tree15" --no-default-features --features "pg$default_major") >"$logs/install.log" 2>&1 &&
        python3 scripts/sqlbuild.py install-files "$("$tree15" --sharedir)/extension" >>"$logs/install.log" 2>&1
    if [ $? = 0 ]; then
        IDEM_SERVERS_PORT=56000 cargo test --no-fail-fast -p idempotency-tests --test pg_upgrade -- --ignored >"$logs/pg_upgrade.log" 2>&1
        status=$?
        grep -E '^(test |test result|error)' "$logs/pg_upgrade.log" | grep -v '\.\.\. ok$'
        [ $status = 0 ] || grep -A30 -- '---- ' "$logs/pg_upgrade.log" | head -60
        read -r p f < <(cargo_counts "$logs/pg_upgrade.log")
        record pg_upgrade "$p" "$f" "$status"
    else
        tail -20 "$logs/install.log"
        record pg_upgrade 0 1 1
    fi
fi

printf '\n== summary\n'
printf '%s\n' "${summary[@]}"
printf '%s\n' "${per_major[@]}"
printf '%d passed, %d failed\n' "$total_pass" "$total_fail"
[ "$total_fail" = 0 ] && [ "$failed_layers" = 0 ]
