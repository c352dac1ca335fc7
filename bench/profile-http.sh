#!/usr/bin/env bash
# CPU profiles of the HTTP service process (docs/performance.md, "Where a request through the
# layer spends its time"): the benchmark's HTTP rows (`target/release/bench --http`) run with
# `perf record -e cpu-clock --call-graph dwarf` attached to the service process while each side
# runs (the route without the layer, fresh keys, replays; 8 and 64 connections), then every
# sample is put in the bucket of its nearest frame, leaf first, that names a crate of BUCKETS
# below (the one place they are defined); a kernel leaf goes to the kernel bucket of the system
# call that entered it (socket reads, socket writes, epoll_wait).
#
#   bench/profile-http.sh [SECONDS=4]
#   bench/profile-http.sh --report      # the tables again, from the files of the last run
#
# Needs perf (linux-perf), the private cluster running (`cargo run -p xtask -- pg start`, IDEM_PG_PORT), the
# extension installed in its PG_CONFIG tree and `cargo build --release -p idempotency-bench`.
# IDEM_BENCH_HTTP_PORT as for the benchmark. Prints markdown: per route and connection count, the
# requests per second while profiled, the service's CPU per request and its split per bucket in
# µs per request. target/profile-http/ keeps the perf.data files (PROFILE_KEEP=0 deletes them).
# PROFILE_FREQ (default 499 Hz) and PROFILE_STACK (bytes of stack per sample, 16384) tune perf.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
secs=${1:-4}
out=$root/target/profile-http
command -v perf >/dev/null || { echo "profile-http.sh: perf is not installed (Debian: apt-get install linux-perf)" >&2; exit 1; }
[ "$secs" = --report ] || [ -x "$root/target/release/bench" ] || { echo "profile-http.sh: build first: cargo build --release -p idempotency-bench" >&2; exit 1; }
if [ "$secs" != --report ]; then
    rm -rf "$out"
    mkdir -p "$out"
    # --smoke: every side once, for SECONDS.
    IDEM_BENCH_PERF_DIR=$out IDEM_BENCH_SECONDS=$secs "$root/target/release/bench" --http --smoke >"$out/bench.log" 2>&1 ||
        { tail -20 "$out/bench.log" >&2; exit 1; }
    for f in "$out"/*.data; do
        perf script -i "$f" -F tid,ip,sym,dso 2>/dev/null >"${f%.data}.txt"
        [ "${PROFILE_KEEP:-1}" = 1 ] || rm -f "$f"
    done
fi
FREQ=${PROFILE_FREQ:-499} python3 - "$out" <<'PY'
import collections, glob, os, re, sys

# (bucket, pattern on a frame's symbol); the first bucket whose pattern matches the nearest
# frame wins.
BUCKETS = [
    ("allocator", r"^(malloc|free|realloc|calloc|cfree|_int_malloc|_int_free|_int_realloc|malloc_consolidate|__libc_malloc|__libc_free)"),
    ("fingerprint (sha2)", r"sha2::"),
    ("JSON (serde_json)", r"serde_json::"),
    ("tracing", r"tracing(_core)?::"),
    ("idempotency layer and client", r"idempotency_client::"),
    ("pool (deadpool)", r"deadpool"),
    ("tokio-postgres", r"tokio_postgres::|postgres_protocol::|postgres_types::"),
    ("outbound HTTP to the provider (reqwest)", r"reqwest::"),
    ("routing and extractors (axum, tower)", r"axum::|tower::|matchit::"),
    ("HTTP server (hyper)", r"hyper::|hyper_util::|httparse::|http::"),
    ("tokio runtime", r"tokio::"),
]
compiled = [(b, re.compile(p)) for b, p in BUCKETS]
freq = float(os.environ["FREQ"])

def bucket(frames):
    if not frames:
        return "other"
    if frames[0][1].startswith("[kernel"):
        # By the system call the user side made: parking the runtime or socket I/O.
        user = next((sym for sym, dso in frames if not dso.startswith("[kernel")), "")
        if "epoll_wait" in user:
            return "kernel: epoll_wait (parking, context switches)"
        if re.search(r"recv|read", user):
            return "kernel: socket reads"
        if re.search(r"send|write", user):
            return "kernel: socket writes"
        return "kernel: other"
    for sym, _ in frames:
        for b, p in compiled:
            if p.search(sym):
                return b
    return "other"

totals = collections.defaultdict(lambda: [0, 0, collections.Counter()])  # key -> requests, samples, buckets
for txt in sorted(glob.glob(os.path.join(sys.argv[1], "*.txt"))):
    name = os.path.basename(txt)[:-4]
    route, side, conns, _run = name.split("-")
    requests = int(open(txt[:-4] + ".requests").read())
    t = totals[(route, conns, side)]
    t[0] += requests
    frames = []
    with open(txt, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                if frames is not None:
                    t[1] += 1
                    t[2][bucket(frames)] += 1
                frames = None
                continue
            if not line.startswith("\t"):
                frames = []  # a sample's header (tid)
                continue
            parts = line.strip().split(None, 1)
            rest = parts[1] if len(parts) > 1 else ""
            m = re.match(r"(.*) \((.*)\)$", rest)
            sym, dso = (m.group(1), m.group(2)) if m else (rest, "")
            if frames is not None:
                frames.append((re.sub(r"\+0x[0-9a-f]+$", "", sym), dso))
    if frames:
        t[1] += 1
        t[2][bucket(frames)] += 1

names = [b for b, _ in BUCKETS] + ["kernel: " + k for k in ("socket reads", "socket writes", "epoll_wait (parking, context switches)", "other")] + ["other"]
for route in sorted({k[0] for k in totals}):
    for conns in sorted({k[1] for k in totals if k[0] == route}, key=int):
        sides = [s for s in ("plain", "fresh", "replay") if (route, conns, s) in totals]
        print(f"\n**{route}, {conns} connections** — service CPU per request, µs (share of its samples)\n")
        print("| bucket | " + " | ".join(sides) + " |")
        print("|---|" + "---|" * len(sides))
        us = {}
        for s in sides:
            req, samples, _ = totals[(route, conns, s)]
            us[s] = samples / freq / max(req, 1) * 1e6
        print("| **total** | " + " | ".join(f"**{us[s]:.0f}**" for s in sides) + " |")
        for b in names:
            cells = []
            for s in sides:
                req, samples, bk = totals[(route, conns, s)]
                n = bk.get(b, 0)
                cells.append(f"{n / freq / max(req, 1) * 1e6:.1f} ({100 * n / max(samples, 1):.0f} %)")
            if any(totals[(route, conns, s)][2].get(b, 0) for s in sides):
                print(f"| {b} | " + " | ".join(cells) + " |")
        print("| requests profiled | " + " | ".join(str(totals[(route, conns, s)][0]) for s in sides) + " |")
PY
