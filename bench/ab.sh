#!/usr/bin/env bash
# A quick interleaved A/B of pgbench scripts, for measuring one change (the full benchmark is
# scripts/bench.sh):
#
#   bench/ab.sh URL SECONDS REPS CLIENTS A B ...
#
# runs bench/pgbench/A.sql, B.sql, ... (pgbench -M prepared) REPS times each, in the order A B ..
# then reversed, so machine drift cancels, and prints each script's mean tps and its ratio to A.
# The database must hold the extension and bench/pgbench/setup.sql. PostgreSQL from PG_CONFIG.
set -euo pipefail
[ $# -ge 5 ] || { sed -n '2,9p' "$0" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
url=$1 secs=$2 reps=$3 clients=$4
shift 4
pgbench=$("${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}" --bindir)/pgbench
declare -A sum
for r in $(seq 1 "$reps"); do
    order=("$@")
    if [ $((r % 2)) = 0 ]; then
        mapfile -t order < <(printf '%s\n' "$@" | tac)
    fi
    for s in "${order[@]}"; do
        tps=$("$pgbench" -n -M prepared -c"$clients" -j2 -T"$secs" -f "$root/bench/pgbench/$s.sql" "$url" 2>&1 |
            awk '/^tps/ { print $3 }')
        sum[$s]=$(awk -v a="${sum[$s]:-0}" -v b="${tps:-0}" 'BEGIN { print a + b }')
    done
done
for s in "$@"; do
    awk -v s="$s" -v t="${sum[$s]}" -v a="${sum[$1]}" -v n="$reps" -v first="$1" \
        'BEGIN { printf "%-12s %8.0f tps   ratio to %s %.3f\n", s, t / n, first, (a > 0 ? t / a : 0) }'
done
