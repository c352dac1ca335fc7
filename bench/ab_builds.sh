#!/usr/bin/env bash
# Two (or more) builds of the extension against each other, interleaved, on one server: for each
# round, each build in turn (the order reversed every other round) is copied over the installed
# library, the server restarted with it, and each pgbench script run (its order reversed too):
#
#   bench/ab_builds.sh SECONDS ROUNDS CLIENTS "A.so B.so" "fresh minimal"
#
# prints one line per run (tps, and backend CPU µs per transaction: the postmaster's reaped
# children, cutime + cstime, so only the benchmark's backends), then per build and script the
# mean tps and CPU and their ratios to the last script of the list in the same build. Needs a
# server made by `bench/wal_per_cycle.sh start` (PG_CONFIG, PORT: default 56220; data under
# target/hbench, or BENCH_DIR as there) and root (the server runs as the postgres user). Leaves the last build installed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-$root/target/postgres/16/bin/pg_config}
bindir=$("$PG_CONFIG" --bindir); lib=$("$PG_CONFIG" --pkglibdir)/idempotency.so
port=${PORT:-56220}; url=postgresql://postgres@127.0.0.1:$port/b; dir=${BENCH_DIR:-$root/target/hbench}; data=$dir/data
secs=$1 rounds=$2 clients=$3; read -r -a builds <<<"$4"; read -r -a scripts <<<"$5"
tck=$(getconf CLK_TCK)
cticks() { awk '{ print $16 + $17 }' "/proc/$(head -1 "$data/postmaster.pid")/stat"; }
log=$(mktemp)
for r in $(seq 1 "$rounds"); do
    bo=("${builds[@]}"); so=("${scripts[@]}")
    if [ $((r % 2)) = 0 ]; then
        mapfile -t bo < <(printf '%s\n' "${builds[@]}" | tac); mapfile -t so < <(printf '%s\n' "${scripts[@]}" | tac)
    fi
    for b in "${bo[@]}"; do
        sudo -u postgres "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null
        # Not over an identical library: cp rewrites it in place, under every server mapping it.
        cmp -s "$b" "$lib" || cp "$b" "$lib"
        sudo -u postgres "$bindir/pg_ctl" -D "$data" -l "$dir/server.log" -w start >/dev/null
        "$bindir/pgbench" -n -M prepared -c"$clients" -j2 -T2 -f "$root/bench/pgbench/${scripts[0]}.sql" "$url" >/dev/null 2>&1 || true
        for s in "${so[@]}"; do
            c0=$(cticks)
            out=$("$bindir/pgbench" -n -M prepared -c"$clients" -j2 -T"$secs" -f "$root/bench/pgbench/$s.sql" "$url" 2>&1)
            sleep 0.5; c1=$(cticks)
            tps=$(awk '/^tps/ { print $3 }' <<<"$out")
            n=$(awk '/number of transactions actually processed/ { print $NF }' <<<"$out" | cut -d/ -f1)
            cpu=$(awk -v c=$((c1 - c0)) -v t="$tck" -v n="$n" 'BEGIN { printf "%.0f", c / t * 1e6 / n }')
            echo "round $r build $b script $s tps $tps cpu_us_per_tx $cpu" | tee -a "$log"
        done
    done
done
awk -v base="${scripts[${#scripts[@]}-1]}" '
    { k = $4 " " $6; tps[k] += $8; cpu[k] += $10; n[k]++; b[$4] = 1; s[$6] = 1 }
    END { for (x in b) for (y in s) { k = x " " y; kb = x " " base
        printf "%s %-10s tps %7.0f  cpu/tx %5.0f µs  vs %s: tps %.3f, cpu %.3f\n", x, y, tps[k] / n[k], cpu[k] / n[k], base, tps[k] / tps[kb], cpu[k] / cpu[kb] } }' "$log" | sort
rm -f "$log"
