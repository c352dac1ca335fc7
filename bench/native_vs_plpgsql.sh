#!/usr/bin/env bash
# Native vs PL/pgSQL in one interleaved run (docs/performance.md, "The native hot path").
#
#   bench/native_vs_plpgsql.sh URL [SECONDS=3] [REPS=6]
#
# URL is a database prepared with bench/pgbench/setup.sql. The 0.1.0 PL/pgSQL idem_reserve and
# idem_complete are installed next to the native ones as public.idem_reserve_pl /
# idem_complete_pl, built from sql/reserve.sql and sql/finish.sql (never written twice), and the
# pgbench scripts get `_pl` twins. Each client count (1, 8, 32) runs the scripts interleaved
# (A B … B A) and prints tps and the ratio to the first. PGBIN: the server's bin directory.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
url=$1; secs=${2:-3}; reps=${3:-6}
bin=${PGBIN:-$(dirname "$(command -v pgbench)")}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

twin() { # twin FILE FUNCTION: the PL/pgSQL definition of FUNCTION as public.FUNCTION_pl
    sed -n "/^CREATE FUNCTION @extschema@.$2(/,/^\\\$fn\\\$;/p" "$root/sql/$1" |
        sed "s/^CREATE FUNCTION @extschema@.$2(/CREATE OR REPLACE FUNCTION public.$2_pl(/; s/@extschema@/public/g"
}
{ twin reserve.sql idem_reserve; twin finish.sql idem_complete; } >"$dir/twins.sql"
"$bin/psql" -X -q -v ON_ERROR_STOP=1 "$url" -f "$dir/twins.sql"

cp "$root"/bench/pgbench/*.sql "$dir/"
sed 's/idem_reserve(/idem_reserve_pl(/; s/idem_complete(/idem_complete_pl(/' "$dir/fresh.sql" >"$dir/fresh_pl.sql"
sed 's/idem_reserve(/idem_reserve_pl(/' "$dir/replay.sql" >"$dir/replay_pl.sql"

run() { # run CLIENTS SCRIPT...
    local c=$1; shift
    declare -A sum=()
    for r in $(seq 1 "$reps"); do
        local order="$*"
        [ $((r % 2)) = 1 ] || order=$(printf '%s\n' "$@" | tac | tr '\n' ' ')
        for s in $order; do
            t=$("$bin/pgbench" -n -M prepared -c"$c" -j2 -T"$secs" -f "$dir/$s.sql" "$url" 2>&1 | awk '/^tps/ {print $3}')
            sum[$s]=$(echo "${sum[$s]:-0} + $t" | bc -l)
        done
    done
    for s in "$@"; do
        printf '%s %.0f ratio-to-%s %.3f\n' "$s" "$(echo "${sum[$s]}/$reps" | bc -l)" "$1" "$(echo "${sum[$s]}/${sum[$1]}" | bc -l)"
    done
}
for c in 1 8 32; do
    echo "== clients=$c"
    run "$c" handwritten fresh fresh_pl bare seed_store
    run "$c" pk_select replay replay_pl
done
