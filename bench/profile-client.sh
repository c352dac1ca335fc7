#!/usr/bin/env bash
# Where the Rust client's own time goes (docs/performance.md, "Where a Rust client call spends its
# time"): the four cases of the benchmark's Rust rows, each on its own (`target/release/bench
# --rust-case CASE TASKS SECONDS`: raw-insert, run, raw-select, replay), with the client process
# and its pool's server backends measured, then profiled.
#
#   bench/profile-client.sh [SECONDS=8] [TASKS=8] [REPS=2]
#   bench/profile-client.sh --report     # the tables again, from the files of the last run
#
# Every case runs REPS times unprofiled (in order, then reversed): calls per second, and CPU per
# call of the client process and of the server (from /proc/PID/task/*/schedstat over the window:
# the bench reads its own and its backends'), which are the figures. Then once more with
# `perf record -e cpu-clock --call-graph dwarf` attached to the client process and its backends
# together, for the split only: a client sample goes to the bucket of its nearest frame, leaf
# first, that names a bucket of BUCKETS below (the one place they are defined; tokio::sync,
# futures, core, alloc, std and libc frames pass the sample on to their caller, so a semaphore
# wait inside the pool is the pool's); a kernel leaf goes to the kernel bucket of the system
# call that entered it. A bucket's µs per call is its share of the profiled samples times the
# unprofiled CPU per call (perf's own overhead does not inflate the figures). A last run per case
# under `perf trace -s` gives the system calls per call of the client and of its backends.
#
# Needs perf (linux-perf) and `cargo build --release -p idempotency-bench`; starts the private
# cluster (`cargo run -p xtask -- pg start`, IDEM_PG_PORT and PG_CONFIG honoured; the release build of the
# extension installed in that tree, as bench/profile.sh says: a tree nothing else reinstalls
# into while this runs) and leaves it running. Prints markdown. target/profile-client/ keeps the logs
# and the resolved call chains; PROFILE_KEEP=1 keeps the perf.data files too (tens of MB each).
# PROFILE_FREQ (default 499 Hz) and PROFILE_STACK (bytes of stack per sample, 16384) tune perf.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$root/target/profile-client
freq=${PROFILE_FREQ:-499} stack=${PROFILE_STACK:-16384}
cases=(raw-insert run raw-select replay)
die() { echo "profile-client.sh: $*" >&2; exit 1; }

run_case() { # run_case CASE TASKS SECONDS TAG PROFILE(0|1): one bench process, perf on it if asked
    local case=$1 tasks=$2 secs=$3 tag=$4 profile=$5 log=$out/$1.$4.log pid=
    # A profiled process runs 3 s longer than perf samples it: perf ends its `sleep` early (and
    # exits non-zero) when the processes it samples exit first. Such a shorter profile is kept:
    # only its shares are used.
    # The running count of calls (a file rewritten every 50 ms) only where it is read: the
    # rewriting costs the client about 1 % of its CPU.
    local counted=()
    [ "$profile" != 2 ] || counted=(env "IDEM_BENCH_CALLS_FILE=$out/calls")
    "${counted[@]}" "$root/target/release/bench" --rust-case "$case" "$tasks" "$((secs + (profile > 0) * 3))" >"$log" 2>&1 &
    local bench=$!
    for _ in $(seq 1 600); do
        grep -q '^ready ' "$log" && break
        kill -0 "$bench" 2>/dev/null || break
        sleep 0.1
    done
    grep -q '^ready ' "$log" || { wait "$bench" || true; tail -20 "$log" >&2; die "$case: the bench did not start"; }
    if [ "$profile" = 2 ]; then
        read -r _ pid backends < <(grep '^ready ' "$log")
        # The calls are read by perf's workload, which starts once the tracing does and ends
        # before it stops, so the count covers no more than the traced window.
        perf trace -s -p "$pid,$backends" -o "$out/$case.$tag.trace" -- \
            sh -c 'c0=$(cat "$1"); sleep "$2"; echo $(($(cat "$1") - c0)) >"$3"' _ "$out/calls" "$secs" "$out/$case.$tag.calls" \
            2>/dev/null || [ -s "$out/$case.$tag.calls" ] || die "$case: perf trace failed"
    elif [ "$profile" = 1 ]; then
        read -r _ pid backends < <(grep '^ready ' "$log")
        perf record -q -e cpu-clock -F "$freq" --call-graph "dwarf,$stack" -p "$pid,$backends" \
            -o "$out/$case.$tag.data" -- sleep "$secs" 2>"$out/$case.$tag.perf.log" ||
            [ -s "$out/$case.$tag.data" ] || { cat "$out/$case.$tag.perf.log" >&2; die "$case: perf record failed"; }
    fi
    wait "$bench" || { tail -20 "$log" >&2; die "$case: the bench failed"; }
    grep -q '^result ' "$log" || die "$case: no result line in $log"
}

if [ "${1:-}" != --report ]; then
    secs=${1:-8} tasks=${2:-8} reps=${3:-2}
    command -v perf >/dev/null || die "perf is not installed (Debian: apt-get install linux-perf)"
    [ -x "$root/target/release/bench" ] || die "build first: cargo build --release -p idempotency-bench"
    (cd "$root" && cargo run -q -p xtask -- pg start) >/dev/null
    rm -rf "$out"
    mkdir -p "$out"
    echo "$tasks" >"$out/tasks"
    for rep in $(seq 1 "$reps"); do
        order=("${cases[@]}")
        [ $((rep % 2)) = 1 ] || mapfile -t order < <(printf '%s\n' "${cases[@]}" | tac)
        for c in "${order[@]}"; do
            echo "[profile-client] rep $rep/$reps: $c (measured)" >&2
            run_case "$c" "$tasks" "$secs" "m$rep" 0
        done
    done
    for c in "${cases[@]}"; do
        echo "[profile-client] $c (profiled)" >&2
        run_case "$c" "$tasks" "$secs" p 1
        perf script -i "$out/$c.p.data" --no-inline -F pid,ip,sym,dso 2>/dev/null >"$out/$c.p.txt"
        [ "${PROFILE_KEEP:-0}" = 1 ] || rm -f "$out/$c.p.data"
        echo "[profile-client] $c (system calls counted)" >&2
        run_case "$c" "$tasks" "$secs" t 2
    done
fi

python3 - "$out" "${cases[@]}" <<'PY'
import collections, glob, os, re, sys

out, cases = sys.argv[1], sys.argv[2:]
# THE BUCKETS of the client process: (bucket, pattern on a frame's symbol, leading "<" and
# "core::ptr::drop_in_place<" stripped); the first pattern that matches the nearest frame wins.
BUCKETS = [
    ("tracing spans", r"^tracing(_core)?::"),
    ("fingerprint (sha2)", r"^(sha2::|idempotency_core::fingerprint|idempotency_core::Fingerprint)"),
    ("key validation (idempotency_core)", r"^idempotency_core::"),
    ("response JSON (serde_json, StoredResponse)", r"^(serde_json::|serde::|idempotency_client::response::)"),
    ("statement cache (prepare_cached)", r"^deadpool_postgres::.*(prepare_cached|StatementCache)"),
    ("pool get / recycle (deadpool)", r"^deadpool"),
    ("our flow (idempotency_client, the rest)", r"^idempotency_client::"),
    ("benchmark loop (bench::client)", r"^bench::"),
    ("tokio-postgres (encode, decode, connection task)", r"^(tokio_postgres::|postgres_protocol::|postgres_types::|tokio_util::|bytes::)"),
    ("tokio runtime (scheduler, I/O driver, timers)", r"^(tokio::(runtime|io|net|time|task|util|park|loom)|mio::)"),
]
KERNEL = ["kernel: socket I/O syscalls", "kernel: parking and waking (epoll, futex)", "kernel: other"]
OTHER = "other (no named frame)"
NAMES = [b for b, _ in BUCKETS] + KERNEL + [OTHER]
compiled = [(b, re.compile(p)) for b, p in BUCKETS]
strip = re.compile(r"^(<|&|core::ptr::drop_in_place<|mut )+")
alloc = re.compile(r"^(malloc|free|realloc|calloc|cfree|_int_malloc|_int_free|_int_realloc|malloc_consolidate|__libc_malloc|__libc_free)")
cache = {}

def frame_bucket(sym):
    if sym not in cache:
        s = strip.sub("", sym)
        cache[sym] = next((b for b, p in compiled if p.search(s)), None)
    return cache[sym]

def bucket(frames):
    if frames[0][1].startswith("[kernel"):
        user = next((sym for sym, dso in frames if not dso.startswith("[kernel")), "")
        if re.search(r"epoll|futex|syscall|sched_yield|pthread_cond|park", user):
            return KERNEL[1]
        if re.search(r"recv|read|send|write", user):
            return KERNEL[0]
        return KERNEL[2]
    return next((b for b in (frame_bucket(s) for s, _ in frames) if b), OTHER)

def result(case):
    r = collections.Counter()
    for f in sorted(glob.glob(os.path.join(out, f"{case}.m*.log"))):
        line = next(l for l in open(f) if l.startswith("result "))
        for kv in line.split()[1:]:
            k, v = kv.split("=")
            r[k] += float(v)
    return r

def samples(case):
    client = collections.Counter()
    server = collections.Counter()
    inclusive = collections.Counter()
    pid = open(os.path.join(out, f"{case}.p.log")).read().split("ready ", 1)[1].split()[0]
    frames, who = [], None
    def flush():
        if not frames:
            return
        if who == pid:
            client[bucket(frames)] += 1
            client["total"] += 1
            if any(alloc.search(s) for s, _ in frames):
                inclusive["allocator"] += 1
            if any(strip.sub("", s).startswith("tracing") for s, _ in frames):
                inclusive["tracing"] += 1
        else:
            server["total"] += 1
            if frames[0][1].startswith("[kernel"):
                server["kernel"] += 1
            elif any(d.endswith("idempotency.so") for _, d in frames):
                server["ext"] += 1
    with open(os.path.join(out, f"{case}.p.txt"), errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                flush()
                frames = []
            elif not line.startswith("\t"):
                flush()
                frames, who = [], line.split()[0]
            else:
                parts = line.strip().split(None, 1)
                rest = parts[1] if len(parts) > 1 else ""
                m = re.match(r"(.*) \((.*)\)$", rest)
                sym, dso = (m.group(1), m.group(2)) if m else (rest, "")
                frames.append((re.sub(r"\+0x[0-9a-f]+$", "", sym), dso))
    flush()
    return client, server, inclusive

tasks = open(os.path.join(out, "tasks")).read().strip()
R = {c: result(c) for c in cases}
S = {c: samples(c) for c in cases}
def per_call(c, k):
    return R[c][k] / 1000 / R[c]["calls"]
tps = {c: R[c]["calls"] / R[c]["seconds"] for c in cases}
client_us = {c: per_call(c, "client_cpu_ns") for c in cases}
back_us = {c: per_call(c, "backends_cpu_ns") for c in cases}
server_us = {c: per_call(c, "server_cpu_ns") for c in cases}
cores = os.cpu_count()

print(f"\n**{tasks} tasks, {cores} cores** — per call (measured without perf; sums of {len(glob.glob(os.path.join(out, cases[0] + '.m*.log')))} windows per case)\n")
print("| | " + " | ".join(cases) + " |")
print("|---|" + "---|" * len(cases))
print("| calls per second | " + " | ".join(f"{tps[c]:.0f}" for c in cases) + " |")
print("| wall-clock per call, µs (tasks ÷ calls per second) | " + " | ".join(f"{int(tasks) / tps[c] * 1e6:.0f}" for c in cases) + " |")
print("| client process CPU, µs | " + " | ".join(f"**{client_us[c]:.1f}**" for c in cases) + " |")
print("| server CPU (the pool's backends), µs | " + " | ".join(f"**{back_us[c]:.1f}**" for c in cases) + " |")
print("| server CPU (every server process), µs | " + " | ".join(f"{server_us[c]:.1f}" for c in cases) + " |")
print("| client + server CPU, µs | " + " | ".join(f"{client_us[c] + server_us[c]:.1f}" for c in cases) + " |")
print(f"| cores busy with this case (of {cores}) | " + " | ".join(f"{(client_us[c] + server_us[c]) * tps[c] / 1e6:.2f}" for c in cases) + " |")
print("| server samples inside idempotency.so (inclusive), % | " + " | ".join(f"{100 * S[c][1]['ext'] / max(S[c][1]['total'], 1):.0f}" for c in cases) + " |")
print("| server samples in the kernel, % | " + " | ".join(f"{100 * S[c][1]['kernel'] / max(S[c][1]['total'], 1):.0f}" for c in cases) + " |")

print(f"\n**Client process CPU per call, µs, by bucket** (share of the profiled client samples × the measured CPU per call)\n")
print("| bucket | " + " | ".join(cases) + " |")
print("|---|" + "---|" * len(cases))
cell = lambda c, n: f"{n / max(S[c][0]['total'], 1) * client_us[c]:.1f}"
print("| **total** | " + " | ".join(f"**{client_us[c]:.1f}**" for c in cases) + " |")
for b in NAMES:
    if any(S[c][0].get(b) for c in cases):
        print(f"| {b} | " + " | ".join(cell(c, S[c][0].get(b, 0)) for c in cases) + " |")
print("| *of which under malloc/free (inclusive)* | " + " | ".join(cell(c, S[c][2]["allocator"]) for c in cases) + " |")
print("| *of which under a tracing frame (inclusive)* | " + " | ".join(cell(c, S[c][2]["tracing"]) for c in cases) + " |")
print("| client samples | " + " | ".join(str(S[c][0]["total"]) for c in cases) + " |")

def syscalls(case):
    """System calls per call in the traced window (perf trace -s): client threads, backends."""
    n = int(open(os.path.join(out, f"{case}.t.calls")).read())
    sums = {"client": collections.Counter(), "server": collections.Counter()}
    side = None
    for line in open(os.path.join(out, f"{case}.t.trace"), errors="replace"):
        m = re.match(r"^ (\S.*) \((\d+)\), \d+ events", line)
        if m:
            side = "server" if m.group(1).startswith("postgres") else "client"
            continue
        f = line.split()
        if side and len(f) >= 3 and f[1].isdigit() and re.match(r"^[a-z_0-9]+$", f[0]):
            sums[side][f[0]] += int(f[1])
    return {k: {c: v / max(n, 1) for c, v in s.items()} for k, s in sums.items()}

if all(os.path.exists(os.path.join(out, f"{c}.t.trace")) for c in cases):
    Y = {c: syscalls(c) for c in cases}
    print("\n**System calls per call** (perf trace -s over a window of its own; client threads and the pool's backends)\n")
    print("| | " + " | ".join(cases) + " |")
    print("|---|" + "---|" * len(cases))
    for side in ("client", "server"):
        names = sorted({k for c in cases for k in Y[c][side]}, key=lambda k: -max(Y[c][side].get(k, 0) for c in cases))
        for k in names:
            if max(Y[c][side].get(k, 0) for c in cases) >= 0.05:
                print(f"| {side}: {k} | " + " | ".join(f"{Y[c][side].get(k, 0):.2f}" for c in cases) + " |")

print("\n**Bounds** (when the cases keep the cores busy, calls per second ≈ cores ÷ CPU per call)\n")
for ours, base, label in (("run", "raw-insert", "run / raw transaction"), ("replay", "raw-select", "replay / raw SELECT")):
    if ours in R and base in R:
        bound = (client_us[base] + server_us[base]) / (client_us[ours] + server_us[ours])
        print(f"- {label}: measured {tps[ours] / tps[base]:.2f}; CPU bound (client + server per call, base ÷ ours) {bound:.2f}; "
              f"with our client costing what the raw client costs, {(client_us[base] + server_us[base]) / (client_us[base] + server_us[ours]):.2f}; "
              f"with no client CPU at all on either side, {server_us[base] / server_us[ours]:.2f}")
PY
