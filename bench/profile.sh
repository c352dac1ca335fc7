#!/usr/bin/env bash
# CPU profiles of the hot paths (docs/performance.md, "Profiles: where a fresh cycle and a replay
# spend their time"): the 0.1.0 PL/pgSQL implementation next to the current (native) one, with the
# hand-written protocol, the bare business transaction and a primary-key SELECT as references.
#
#   bench/profile.sh [PORT=56200] [SECONDS=10] [REPS=2] [CLIENTS=8]
#
# PG_CONFIG: the PostgreSQL to profile; default target/postgres/15 (`scripts/pg-env.sh tree 15`,
# whose binaries keep their symbols; Debian's postgres is stripped). This script installs nothing:
# the release build of the extension and the released install scripts must be in that tree first:
#   (cd extension && cargo pgrx install --release --pg-config "$PG_CONFIG" --no-default-features --features pg15)
#   python3 scripts/sqlbuild.py install-files "$("$PG_CONFIG" --sharedir)/extension"
# Needs perf (linux-perf) and root (the server runs as the `postgres` user). It creates a fresh
# cluster in target/profile/NN (deleted first) on PORT, with two databases prepared by
# bench/pgbench/setup.sql: v010 (CREATE EXTENSION ... VERSION '0.1.0', PL/pgSQL) and vcur (the
# current version, Cargo.toml's, native). Every case runs pgbench -M prepared with CLIENTS
# clients; after one second of warm-up, `perf record -e cpu-clock --call-graph dwarf` samples the
# case's server backends (and nothing else) for SECONDS. The cases run REPS times, in order then
# reversed, and their samples are added up. It prints markdown: per case, the tps reached while
# profiled (transactions that ended while perf sampled, from pgbench -l), the backends' CPU per
# transaction, the share of their samples per bucket and the same in µs per transaction, a few
# inclusive rows, and the top 15 symbols (self time). target/profile/NN/samples.txt keeps the
# resolved call chains; PROFILE_KEEP=1 keeps the perf.data files too (~100 MB each).
# PROFILE_FREQ (default 499 Hz) and PROFILE_STACK (bytes of stack per sample, 16384) tune perf;
# PROFILE_CASES="fresh-0.7.0 minimal bare" profiles only the cases named (the list is below).
#
# A sample goes to the bucket of its nearest frame, leaf first, whose symbol (or library) matches
# a bucket (BUCKETS, below: the one place they are defined); frames that match none (libc, the
# kernel, memory contexts, hash tables) pass the sample on to their caller, so "executor
# start-up" holds ExecInitNode and the palloc it calls. CONTEXT rules move a few samples by their
# callers (kernel time under the protocol code is "round trips in the kernel"; group-commit
# semaphore waits under XLogFlush are WAL flush).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
port=${1:-56200} secs=${2:-10} reps=${3:-2} clients=${4:-8}
PG_CONFIG=${PG_CONFIG:-$root/target/postgres/15/bin/pg_config}
freq=${PROFILE_FREQ:-499}     # samples per second per running backend
stack=${PROFILE_STACK:-16384} # bytes of user stack copied per sample (dwarf unwinding)

die() { echo "profile.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (the server runs as the postgres user, perf samples it)"
command -v perf >/dev/null || die "perf is not installed (Debian: apt-get install linux-perf)"
perf record -e cpu-clock -o /dev/null -- true >/dev/null 2>&1 ||
    die "perf record -e cpu-clock fails here: $(perf record -e cpu-clock -o /dev/null -- true 2>&1 | tail -1)"
[ -x "$PG_CONFIG" ] || die "PG_CONFIG=$PG_CONFIG is not an executable pg_config (default: the tree of scripts/pg-env.sh tree 15)"
bindir=$("$PG_CONFIG" --bindir)
ext=$("$PG_CONFIG" --sharedir)/extension
lib=$("$PG_CONFIG" --pkglibdir)/idempotency.so
version=$(sed -n "s/^version = \"\(.*\)\"/\1/p" "$root/Cargo.toml" | head -1)
for f in "$lib" "$ext/idempotency--0.1.0.sql" "$ext/idempotency--$version.sql"; do
    [ -f "$f" ] || die "$f is missing: install the extension into this tree first (see the top of $0)"
done
nm "$bindir/postgres" 2>/dev/null | grep ' T PostgresMain$' >/dev/null ||
    die "$bindir/postgres has no symbols (stripped): use a tree whose binary keeps them (scripts/pg-env.sh tree 15)"
major=$("$root/scripts/pg-env.sh" major "$PG_CONFIG")

out=$root/target/profile/$major
data=$out/data
url() { echo "postgresql://postgres@127.0.0.1:$port/$1"; }
as_server() { sudo -u postgres -- "$@"; }
psql_() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

stop() { [ -f "$data/PG_VERSION" ] && as_server "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true; }
[ ! -f "$data/postmaster.pid" ] || stop
rm -rf "$out"
mkdir -p "$out"
chown postgres:postgres "$out"
# Data checksums off, as before PostgreSQL 18 turned them on by default (CHECKSUMS=on keeps them).
sums=()
if [ "${CHECKSUMS:-}" = on ]; then sums=(--data-checksums); elif [ "$major" -ge 18 ]; then sums=(--no-data-checksums); fi
as_server "$bindir/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 "${sums[@]}" >"$out/initdb.log" 2>&1 ||
    { cat "$out/initdb.log" >&2; exit 1; }
cat >>"$data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$out'
max_connections = 100
shared_buffers = 256MB
fsync = on
log_min_messages = warning
CONF
as_server "$bindir/pg_ctl" -D "$data" -l "$out/server.log" -w -t 60 start >/dev/null || { tail -20 "$out/server.log" >&2; exit 1; }
trap stop EXIT

# The cases: name, database, pgbench script (bench/pgbench/). PROFILE_CASES="NAME ...": only those.
cases=(
    "fresh-0.1.0 v010 fresh"
    "fresh-$version vcur fresh"
    "hand-written vcur handwritten"
    "minimal vcur minimal"
    "bare vcur bare"
    "replay-0.1.0 v010 replay"
    "replay-$version vcur replay"
    "pk-select vcur pk_select"
)
if [ -n "${PROFILE_CASES:-}" ]; then
    mapfile -t cases < <(printf '%s\n' "${cases[@]}" | awk -v keep=" $PROFILE_CASES " 'index(keep, " " $1 " ")')
    [ "${#cases[@]}" -gt 0 ] || die "PROFILE_CASES=$PROFILE_CASES names no case"
fi

psql_ "$(url postgres)" -c 'CREATE DATABASE vcur'
psql_ "$(url vcur)" -f "$root/bench/pgbench/setup.sql"
# 0.1.0 (PL/pgSQL) only for the cases that use it: bench/pgbench/setup.sql fills the current
# version's table, which 0.1.0's is not.
if printf '%s\n' "${cases[@]}" | grep -q ' v010 '; then
    psql_ "$(url postgres)" -c 'CREATE DATABASE v010'
    psql_ "$(url v010)" -c "CREATE EXTENSION idempotency VERSION '0.1.0'" -f "$root/bench/pgbench/setup.sql"
fi
installed=$(psql_ "$(url vcur)" -Atc "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
[ "$installed" = "$version" ] || die "the tree's default version is $installed, Cargo.toml's is $version: reinstall the extension"


run_case() { # run_case NAME DB SCRIPT REP
    local name=$1 db=$2 script=$3 rep=$4 pids="" n=0 log=$out/$1.$4.pgbench t0 t1
    rm -f "$out/$name.$rep.txlog".*
    "$bindir/pgbench" -n -M prepared -c"$clients" -j2 -T$((secs + 5)) -l --log-prefix="$out/$name.$rep.txlog" \
        -f "$root/bench/pgbench/$script.sql" "$(url "$db")" >"$log" 2>&1 &
    local bench=$!
    for _ in $(seq 1 50); do
        sleep 0.2
        pids=$(psql_ "$(url postgres)" -Atc "SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE application_name = 'pgbench' AND datname = '$db'")
        n=$(tr ',' '\n' <<<"$pids" | grep -c . || true)
        [ "$n" -lt "$clients" ] || break
    done
    [ "$n" = "$clients" ] || { wait "$bench" || true; cat "$log" >&2; die "$name: $n of $clients pgbench backends found"; }
    sleep 1
    t0=$(date +%s.%N)
    perf record -q -e cpu-clock -F "$freq" --call-graph "dwarf,$stack" -p "$pids" -o "$out/$name.$rep.data" -- sleep "$secs" 2>"$out/$name.$rep.perf.log" ||
        { cat "$out/$name.$rep.perf.log" >&2; die "$name: perf record failed"; }
    t1=$(date +%s.%N)
    wait "$bench" || { cat "$log" >&2; die "$name: pgbench failed"; }
    # transactions that ended while perf sampled (pgbench -l: one line per transaction, its end
    # time in fields 5 and 6, epoch seconds and microseconds)
    cat "$out/$name.$rep.txlog".* | awk -v a="$t0" -v b="$t1" '{ t = $5 + $6 / 1e6 } t >= a && t < b { n++ }
        END { if (n == 0) exit 1; printf "%.1f %.0f\n", n / (b - a), n }' >"$out/$name.$rep.tps" ||
        { cat "$log" >&2; die "$name: no transaction ended while profiled"; }
    rm -f "$out/$name.$rep.txlog".*
}

for rep in $(seq 1 "$reps"); do
    order=("${cases[@]}")
    [ $((rep % 2)) = 1 ] || mapfile -t order < <(printf '%s\n' "${cases[@]}" | tac)
    for c in "${order[@]}"; do
        # shellcheck disable=SC2086
        set -- $c
        echo "[profile] rep $rep/$reps: $1" >&2
        run_case "$1" "$2" "$3" "$rep"
    done
done

echo "[profile] resolving call chains" >&2
for c in "${cases[@]}"; do
    name=${c%% *}
    for rep in $(seq 1 "$reps"); do
        echo "@@case $name $(cat "$out/$name.$rep.tps")"
        perf script -i "$out/$name.$rep.data" --no-inline -F pid,period,ip,sym,dso 2>/dev/null
        # ~100 MB each: kept only on request (PROFILE_KEEP=1), for perf report -i
        [ "${PROFILE_KEEP:-0}" = 1 ] || rm -f "$out/$name.$rep.data"
    done
done >"$out/samples.txt"

python3 - "$out/samples.txt" "$secs" "$reps" "$clients" <<'PY'
import re, sys
from collections import Counter, defaultdict

# THE BUCKETS, the one place they are defined. A frame belongs to the first bucket whose library
# (dso) or symbol pattern matches; a sample to the bucket of its nearest matching frame, leaf first.
BUCKETS = [
    ("our library (idempotency.so)", r"idempotency\.so", None),
    ("PL/pgSQL interpreter", r"plpgsql\.so", None),
    ("GUC save/restore (SET search_path)", None,
     r"^(set_config_option|set_config_with_handle|AtEOXact_GUC|NewGUCNestLevel|ProcessGUCArray|"
     r"find_option|push_old_value|guc_|assign_search_path|check_search_path|recomputeNamespacePath|"
     r"set_guc_|call_(string|bool|int|real|enum)_check_hook|parse_and_validate_value|SplitIdentifierString)"),
    ("SPI", None, r"^(_?SPI_|spi_|AtEOXact_SPI)"),
    ("planner / plan cache", None,
     r"^(GetCachedPlan|CheckCachedPlan|RevalidateCachedQuery|BuildCachedPlan|ReleaseCachedPlan|"
     r"CachedPlan|choose_custom_plan|cached_plan_cost|planner|standard_planner|subquery_planner|"
     r"grouping_planner|pg_plan_|query_planner|create_\w*(path|plan)|set_\w*pathlist|make_one_rel|"
     r"preprocess_|eval_const_expressions|AcquireExecutorLocks|AcquirePlannerLocks|pg_analyze|"
     r"pg_rewrite|cost_|add_path|get_relation_info|clauselist_selectivity|match_clause|"
     r"build_simple_rel|setup_simple_rel_arrays|ScanQueryForLocks|CopyCachedPlan|PlanCacheComputeResultDesc)"),
    ("executor start-up / shutdown", None,
     r"^(ExecutorStart|standard_ExecutorStart|InitPlan|ExecInit|ExecBuild|ExecReady|ExecutorEnd|"
     r"standard_ExecutorEnd|ExecEnd|ExecutorFinish|standard_ExecutorFinish|CreateExecutorState|"
     r"FreeExecutorState|ExecOpenIndices|ExecCloseIndices|ExecAssign|ExecCreateScanSlot|"
     r"ExecConditionalAssign|ExecGetResultType|CreateQueryDesc|FreeQueryDesc|ExecCheckRTPerms|"
     r"ExecCheckPermissions|ExecTypeFromTL|ExecCleanTypeFromTL|ExecResetTupleTable|ExecPushExprSlots|"
     r"ExecCreateExprSetupSteps|ExecComputeSlotInfo|ExecCloseResultRelations|ExecCloseRangeTableRelations|"
     r"ExecSetupPartitionTupleRouting|AfterTriggerBeginQuery|AfterTriggerEndQuery|InitResultRelInfo|"
     r"ExecGetRangeTableRelation|ExecOpenScanRelation|ExecInitRangeTable|ExecSetExecProcNode)"),
    ("expression evaluation", None, r"^(ExecInterpExpr|ExecEval|ExecJust|ExecProject|ExecQual|ExecAgg)"),
    ("executor run (nodes, insert/update)", None,
     r"^(ExecutorRun|standard_ExecutorRun|ExecutePlan|ExecModifyTable|ExecInsert|ExecUpdate|ExecScan|"
     r"ExecIndexScan|IndexNext|ExecSeqScan|ExecResult|ExecProcNode|ExecFunctionScan|FunctionNext|"
     r"ExecMakeTableFunctionResult|ExecMaterializeSlot|ExecFetchSlot|ExecStore|ExecCopySlot|tts_|"
     r"slot_|ExecInsertIndexTuples|ExecCheckIndexConstraints|ExecOnConflict|ExecConstraints|"
     r"ExecProcessReturning|ExecGetJunk|ExecClearTuple|MakeTupleTableSlot|MakeSingleTupleTableSlot|"
     r"ExecDropSingleTupleTableSlot|tuplestore_|ExecUpdateLockMode|ExecGetUpdateNewTuple|ExecLockRows|"
     r"EvalPlanQual|ExecComputeStoredGenerated|ExecFilterJunk|ExecPrepareTuple|ExecCheckTupleVisible)"),
    ("index access (btree)", None, r"^(_bt|bt[a-z]|index_|IndexScan|RelationGetIndexScan|btree)"),
    ("heap access", None,
     r"^(heap_|heapam_|heapgettup|Heap|RelationGetBufferForTuple|RelationPutHeapTuple|simple_heap|"
     r"toast_|table_tuple|table_slot|PageAdd|PageGet|PageIndex|PageRepair|PageInit|log_heap|"
     r"compute_new_xmax_infomask|MultiXact|visibilitymap_)"),
    ("buffer manager", None,
     r"^(ReadBuffer|ReleaseBuffer|LockBuffer|MarkBuffer|PinBuffer|UnpinBuffer|BufTable|StrategyGetBuffer|"
     r"BufferAlloc|IncrBufferRefCount|ConditionalLockBuffer|BufferGetBlockNumber|ResourceOwner\w*Buffer|"
     r"ReadRecentBuffer|PrefetchBuffer|FlushBuffer|BufferIsPermanent|BufferGetLSNAtomic)"),
    ("WAL insert / flush", None,
     r"^(XLog|CopyXLogRecordToWAL|ReserveXLog|WALInsert|WaitXLogInsertionsToFinish|pg_comp_crc32c|"
     r"issue_xlog_fsync|GetXLogBuffer|AdvanceXLInsertBuffer|XLogRecordAssemble|XLogBackgroundFlush)"),
    ("locking (lmgr, advisory, lwlocks)", None,
     r"^(LockAcquire|LockRelease|LWLock|LockRelation|UnlockRelation|LockDatabaseObject|pg_advisory|"
     r"pg_try_advisory|LockTuple|XactLockTableWait|XactLockTableInsert|ConditionalLock|SpinLock|s_lock|"
     r"GrantLock|LockCheckConflicts|FastPath|SetupLockInTable|LockTagHashCode|VirtualXactLock|"
     r"LockErrorCleanup|PGSemaphore|RemoveLocalLock|CleanUpLock|UnGrantLock|ProcLock|LockHeldByMe|"
     r"SpeculativeInsertionLock|SpeculativeInsertionWait|LockRelId|LockReleaseAll|LockReassign)"),
    ("snapshot / transaction", None,
     r"^(GetSnapshotData|GetTransactionSnapshot|GetLatestSnapshot|GetActiveSnapshot|PushActiveSnapshot|"
     r"PopActiveSnapshot|RegisterSnapshot|UnregisterSnapshot|CopySnapshot|SnapshotResetXmin|"
     r"CommitTransaction|StartTransaction|AbortTransaction|StartTransactionCommand|CommitTransactionCommand|"
     r"RecordTransactionCommit|AtEOXact_|AtCommit_|AtStart_|AtEOSubXact_|ProcArray|TransactionId|"
     r"GetNewTransactionId|AssignTransactionId|GetCurrentTransactionId|TransactionLogFetch|XidInMVCCSnapshot|"
     r"ResourceOwnerRelease|CallXactCallbacks|smgrDoPendingDeletes|PreCommit_|CommandCounterIncrement|"
     r"BeginInternalSubTransaction|ReleaseCurrentSubTransaction|CommitSubTransaction|StartSubTransaction|"
     r"ExtendCLOG|ExtendSUBTRANS|TransactionIdSetTreeStatus|SimpleLruReadPage|GetCurrentCommandId|"
     r"ProcessCompletedNotifies|pgstat_report_xact_timestamp|AtEOXact_PgStat|xactGetCommittedChildren)"),
    ("catalog caches (relcache, syscache)", None,
     r"^(SearchCatCache|SearchSysCache|SysCache|CatalogCache|RelationIdGetRelation|RelationClose|"
     r"relation_open|relation_close|table_open|table_close|try_relation_open|Relation\w*ReferenceCount|"
     r"lookup_type_cache|ReleaseCatCache|ReleaseSysCache|RangeVarGetRelid|get_(rel|func|typ|opcode|"
     r"attnum|namespace|op|atttype|type)|LookupExplicitNamespace|RelnameGetRelid|get_call_result_type|"
     r"internal_get_result_type|build_function_result_tupdesc|TypeGetTupleDesc|lookup_rowtype_tupdesc|"
     r"CatalogCacheIdInvalidate|AcceptInvalidationMessages|ReceiveSharedInvalidMessages|LocalExecuteInvalidationMessage)"),
    ("fmgr (function calls, SECURITY DEFINER)", None,
     r"^(fmgr_|FunctionCall|OidFunctionCall|DirectFunctionCall|CallerFInfoFunctionCall|fetch_finfo|"
     r"OutputFunctionCall|InputFunctionCall|ReceiveFunctionCall|SendFunctionCall|"
     r"OidOutputFunctionCall|OidInputFunctionCall)"),
    ("protocol / portal / parse", None,
     r"^(PostgresMain|exec_simple_query|exec_bind_message|exec_execute_message|exec_parse_message|"
     r"exec_describe|pq_|secure_|socket_|ReadCommand|SocketBackend|printtup|pg_parse_query|raw_parser|"
     r"base_yyparse|core_yylex|parse_analyze|transform|BeginCommand|EndCommand|ReadyForQuery|Portal|"
     r"CreatePortal|internal_flush|internal_putbytes|SendRowDescription|ProcessClientReadInterrupt|"
     r"ProcessClientWriteInterrupt|CreateDestReceiver|WaitEventSet|WaitLatch|ModifyWaitEvent|"
     r"pgstat_report_activity|set_ps_display|start_xact_command|finish_xact_command|"
     r"check_log_duration|MarkPortal|PortalRun|FillPortalStore|RunFromStore|ProcessQuery|"
     r"CreateCommandTag|SetRemoteDestReceiverParams|printtup_|debug_query_string)"),
]
OTHER = "other (no named frame)"
# Context rules: a sample of bucket FROM with a caller frame matching PATTERN goes to bucket TO.
# The semaphore sleeps and wake-ups of group commit are reached through LWLock code called by
# XLogFlush: they are the commit's WAL flush, not a lock the code asked for.
CONTEXT = [("locking (lmgr, advisory, lwlocks)", r"^XLogFlush$", "WAL insert / flush")]
# Inclusive rows: the share of samples with a frame matching the pattern anywhere in the stack.
INCLUSIVE = [
    ("in a PL/pgSQL call", r"^plpgsql_call_handler$"),
    ("in a SECURITY DEFINER call (under fmgr_security_definer)", r"^fmgr_security_definer$"),
    ("in ExecutorStart", r"^(standard_)?ExecutorStart$"),
    ("in ExecutorEnd", r"^(standard_)?ExecutorEnd$"),
    ("in GetCachedPlan", r"^GetCachedPlan$"),
    ("in stringToNode (e.g. CHECK constraints read back per statement)", r"^stringToNode$"),
    ("in XLogFlush (commit)", r"^XLogFlush$"),
]
# A sample in the kernel under the protocol code is a round trip's cost (socket send/recv, the
# context switches to and from pgbench): its own row. Other kernel time stays with its caller
# (WAL write/fsync with WAL, semaphore waits with locking); the "of which kernel" row totals it.
PROTOCOL, KERNEL_IO = BUCKETS[-1][0], "round trips in the kernel (socket I/O, context switches)"
compiled = [(n, re.compile(d) if d else None, re.compile(s) if s else None) for n, d, s in BUCKETS]
names = [b[0] for b in BUCKETS] + [KERNEL_IO, OTHER]
context = [(f, re.compile(p), t) for f, p, t in CONTEXT]
inclusive = [(l, re.compile(p)) for l, p in INCLUSIVE]
assert all(f in names and t in names for f, _, t in CONTEXT)
cache = {}

def bucket_of(sym, dso):
    key = (sym, dso)
    if key not in cache:
        cache[key] = None
        for n, d, s in compiled:
            if (d and d.search(dso)) or (s and s.search(sym)):
                cache[key] = n
                break
    return cache[key]

path, secs, reps, clients = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
order, tps, xacts = [], defaultdict(list), Counter()
buckets = defaultdict(Counter)
selfsym = defaultdict(Counter)
inside = Counter()
total = Counter()
cpu_ns = Counter()
kernel = Counter()
bucket_ns = defaultdict(Counter)
incl = defaultdict(Counter)
case = None
frames, period = [], 0
frame_re = re.compile(r"^\s+[0-9a-f]+ (.*) \((.*)\)$")

def flush():
    if case is None or not frames:
        return
    total[case] += 1
    cpu_ns[case] += period
    sym, dso = frames[0]
    short = dso.rsplit("/", 1)[-1]
    selfsym[case][f"{sym} ({short})"] += 1
    b = OTHER
    for s, d in frames:
        n = bucket_of(s, d)
        if n:
            b = n
            break
    for frm, pat, to in context:
        if b == frm and any(pat.search(s) for s, _ in frames):
            b = to
    for label, pat in inclusive:
        if any(pat.search(s) for s, _ in frames):
            incl[case][label] += 1
    if frames[0][1].startswith("[kernel"):
        kernel[case] += 1
        if b == PROTOCOL:
            b = KERNEL_IO
    buckets[case][b] += 1
    bucket_ns[case][b] += period
    if any(d.endswith("idempotency.so") or d.endswith("plpgsql.so") for _, d in frames):
        inside[case] += 1

with open(path, errors="replace") as f:
    for line in f:
        if line.startswith("@@case "):
            flush()
            frames = []
            _, case, t, n = line.split()
            if case not in order:
                order.append(case)
            tps[case].append(float(t))
            xacts[case] += int(n)
        elif not line.strip():
            flush()
            frames = []
        elif line[0] not in " \t" or not frame_re.match(line.rstrip("\n")):
            flush()
            frames = []
            fields = line.split()
            period = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
        else:
            m = frame_re.match(line.rstrip("\n"))
            frames.append((re.sub(r"\+0x[0-9a-f]+$", "", m.group(1)), m.group(2)))
    flush()

def pct(n, d):
    return f"{100.0 * n / d:.1f}" if d else "—"

print(f"Server backends' CPU samples, % per bucket (pgbench -M prepared, {clients} clients, "
      f"{reps} × {secs} s profiled per case):\n")
print("| bucket | " + " | ".join(order) + " |")
print("|---|" + "---|" * len(order))
print("| tps while profiled (mean of the runs) | " + " | ".join(f"{sum(tps[c]) / len(tps[c]):.0f}" for c in order) + " |")
print("| backend CPU µs per transaction | " + " | ".join(f"{cpu_ns[c] / 1000 / xacts[c]:.0f}" for c in order) + " |")
print("| samples | " + " | ".join(str(total[c]) for c in order) + " |")
for n in names:
    if any(buckets[c][n] for c in order):
        print(f"| {n} | " + " | ".join(pct(buckets[c][n], total[c]) for c in order) + " |")
print("| *of which in the kernel (all buckets)* | " + " | ".join(pct(kernel[c], total[c]) for c in order) + " |")
print("| *inside the extension's functions (inclusive: any frame in idempotency.so or plpgsql.so)* | "
      + " | ".join(pct(inside[c], total[c]) for c in order) + " |")
for label, _ in INCLUSIVE:
    print(f"| *{label} (inclusive)* | " + " | ".join(pct(incl[c][label], total[c]) for c in order) + " |")

print("\nThe same buckets in backend CPU µs per transaction (sampled CPU time ÷ transactions "
      "that ended while sampled):\n")
print("| bucket | " + " | ".join(order) + " |")
print("|---|" + "---|" * len(order))
print("| total | " + " | ".join(f"{cpu_ns[c] / 1000 / xacts[c]:.0f}" for c in order) + " |")
for n in names:
    if any(buckets[c][n] for c in order):
        print(f"| {n} | " + " | ".join(f"{bucket_ns[c][n] / 1000 / xacts[c]:.1f}" for c in order) + " |")
for c in order:
    print(f"\nTop 15 symbols (self time), {c}:\n")
    print("| % | symbol (library) |")
    print("|---|---|")
    for s, n in selfsym[c].most_common(15):
        print(f"| {pct(n, total[c])} | `{s}` |")
PY
