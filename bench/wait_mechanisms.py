"""Issue 44: what 50 duplicates waiting on one two-phase holder cost the server, per mechanism
(the figures of docs/performance.md, "Waiting for a holder"). Not part of the test command.

    python3 bench/wait_mechanisms.py 409,poll,poll100,proc,func,notify 3
    (IDEM_WAIT_DSN: a database with the extension and pg_stat_statements, on a server
    preloading pg_stat_statements; IDEM_WAIT_PGDATA: that server's data directory, read for the
    postmaster's pid; run on the server's machine, as a user who may read /proc of its processes)

Scenarios (each: a holder reserves the key, committed PROCESSING, "calls out" for 2 s with no
connection, then completes in autocommit; 50 duplicates arrive just after the reservation):
  409      each duplicate probes once (idem_reserve wait => false) and is answered at once
  poll     each duplicate polls with capped exponential backoff + jitter, each poll one autocommit
           idem_reserve(wait => false) on a connection taken from a pool of POOL and given back
  proc     each duplicate CALLs a PL/pgSQL procedure that polls server-side, COMMIT between polls
           (a backend per waiter for the whole wait)
  func     the same loop in a function (one statement: its snapshot held for the whole wait)
  notify   one LISTEN connection for the process; the holder's completion NOTIFYs; each waiter
           probes once at arrival and once when notified (pool of POOL)
Server CPU: time on CPU of the postmaster and its children (/proc/PID/schedstat), between just
before the holder reserves and the last answer; every connection is opened before and closed
after. A sampler (every 100 ms, one transaction ID each) reports how many waiter backends hold a
snapshot and its age in transaction IDs, i.e. in samples.

The completion's cost with a NOTIFY: bench/pgbench/fresh.sql against the same script with
`SELECT pg_notify('idem_wait', 'k' || :k);` before its COMMIT, pgbench -M prepared -c 8 -j 2,
interleaved.
"""
import asyncio, os, random, sys, time, uuid, json
import psycopg

DSN = os.environ.get("IDEM_WAIT_DSN", "dbname=bench")
PGDATA = os.environ["IDEM_WAIT_PGDATA"]
WAITERS = 50
OUTSIDE = 2.0
BOUND = 5.0
POOL = int(os.environ.get("POOL", "8"))


def postmaster_pid():
    with open(f"{PGDATA}/postmaster.pid") as f:
        return int(f.readline())


def stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()
    # fields[0] is state (field 3); utime is field 14 -> index 11
    return int(fields[1]), int(fields[11]), int(fields[12]), int(fields[13]), int(fields[14])


def oncpu(pid):
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def server_cpu():
    """Seconds on CPU (schedstat, ns precise) of the postmaster and its live children; every
    connection of a scenario is opened before and closed after the window."""
    pm = postmaster_pid()
    total = oncpu(pm)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ppid = stat(int(d))[0]
            if ppid == pm:
                total += oncpu(int(d))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return total / 1e9


class Pool:
    def __init__(self, conns):
        self.free = asyncio.Queue()
        for c in conns:
            self.free.put_nowait(c)
        self.busy = 0
        self.peak = 0
        self.busy_s = 0.0

    async def probe(self, sql, args):
        c = await self.free.get()
        self.busy += 1
        self.peak = max(self.peak, self.busy)
        t = time.monotonic()
        try:
            cur = await c.execute(sql, args)
            return await cur.fetchone()
        finally:
            self.busy_s += time.monotonic() - t
            self.busy -= 1
            self.free.put_nowait(c)


RESERVE = "SELECT outcome, response FROM idem_reserve(%s, 'u', %s, 'h', wait => false)"


async def connect(n):
    return [await psycopg.AsyncConnection.connect(DSN, autocommit=True) for _ in range(n)]


async def holder(conn, op, key, started):
    cur = await conn.execute("SELECT outcome, token FROM idem_reserve(%s, 'u', %s, 'h', lease => '60 s')", (op, key))
    outcome, token = await cur.fetchone()
    assert outcome == "created", outcome
    started.set()
    await asyncio.sleep(OUTSIDE)  # the outside call: no connection used
    return token


async def complete(conn, op, key, token, notify):
    global COMPLETE_MS
    t = time.monotonic()
    try:
        return await complete_(conn, op, key, token, notify)
    finally:
        COMPLETE_MS = round((time.monotonic() - t) * 1000, 2)


async def complete_(conn, op, key, token, notify):
    if notify:
        async with conn.transaction():
            await conn.execute("SELECT idem_complete(%s, 'u', %s, %s, '{\"status\": 201}')", (op, key, token))
            await conn.execute("SELECT pg_notify('idem_wait', %s)", (key,))
    else:
        await conn.execute("SELECT idem_complete(%s, 'u', %s, %s, '{\"status\": 201}')", (op, key, token))
    return time.monotonic()


async def waiter_409(pool, op, key):
    row = await pool.probe(RESERVE, (op, key))
    return row[0], time.monotonic(), 1


async def waiter_poll(pool, op, key, first, cap):
    deadline = time.monotonic() + BOUND
    delay = first
    polls = 0
    while True:
        row = await pool.probe(RESERVE, (op, key))
        polls += 1
        if row[0] != "in_progress" or time.monotonic() >= deadline:
            return row[0], time.monotonic(), polls
        # capped exponential backoff, "equal jitter": half fixed, half random
        sleep = min(delay, cap)
        sleep = sleep / 2 + random.uniform(0, sleep / 2)
        await asyncio.sleep(min(sleep, max(0.0, deadline - time.monotonic())))
        delay *= 2


async def waiter_call(conn, op, key, sql):
    cur = await conn.execute(sql, (op, key, f"{BOUND} s"))
    row = await cur.fetchone()
    return row[0], time.monotonic(), None


class Listener:
    def __init__(self, conn):
        self.conn = conn
        self.waiting = {}

    async def run(self):
        await self.conn.execute("LISTEN idem_wait")
        async for n in self.conn.notifies():
            for fut in self.waiting.pop(n.payload, []):
                if not fut.done():
                    fut.set_result(True)


async def waiter_notify(pool, listener, op, key):
    fut = asyncio.get_running_loop().create_future()
    listener.waiting.setdefault(key, []).append(fut)  # registered before the first probe
    row = await pool.probe(RESERVE, (op, key))
    polls = 1
    if row[0] == "in_progress":
        try:
            await asyncio.wait_for(fut, BOUND)
        except asyncio.TimeoutError:
            pass
        row = await pool.probe(RESERVE, (op, key))
        polls += 1
    return row[0], time.monotonic(), polls


async def xmin_sampler(mon, stop, out):
    """Samples how many backends of the waiters hold a snapshot (backend_xmin) while waiting."""
    while not stop.is_set():
        # txid_current(): one transaction ID per sample (every 100 ms), so a snapshot's age in
        # transaction IDs says how many samples it has been held.
        cur = await mon.execute(
            "SELECT count(*) FILTER (WHERE backend_xmin IS NOT NULL), coalesce(max(age(backend_xmin)), 0), txid_current() "
            "FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'idem-waiter'")
        out.append(await cur.fetchone())
        await asyncio.sleep(0.1)


async def scenario(name, run):
    op = f"bench.wait.{name}"
    key = f"k-{uuid.uuid4()}"
    hconn = (await connect(1))[0]
    mon = (await connect(1))[0]
    pool_conns, own = [], []
    listener = None
    if name in ("409", "poll", "poll100", "notify"):
        pool_conns = [await psycopg.AsyncConnection.connect(DSN, autocommit=True, application_name="idem-waiter") for _ in range(POOL)]
    if name in ("proc", "func"):
        own = [await psycopg.AsyncConnection.connect(DSN, autocommit=True, application_name="idem-waiter") for _ in range(WAITERS)]
    pool = Pool(pool_conns)
    tasks_bg = []
    if name == "notify":
        lconn = await psycopg.AsyncConnection.connect(DSN, autocommit=True)
        listener = Listener(lconn)
        tasks_bg.append(asyncio.create_task(listener.run()))
        await asyncio.sleep(0.1)
    await mon.execute("SELECT pg_stat_statements_reset()")
    await asyncio.sleep(0.2)
    cpu0 = server_cpu()
    t0 = time.monotonic()
    started = asyncio.Event()
    htask = asyncio.create_task(holder(hconn, op, key, started))
    await started.wait()
    if name == "409":
        ws = [waiter_409(pool, op, key) for _ in range(WAITERS)]
    elif name == "poll":
        ws = [waiter_poll(pool, op, key, 0.02, 0.25) for _ in range(WAITERS)]
    elif name == "poll100":
        ws = [waiter_poll(pool, op, key, 0.02, 0.1) for _ in range(WAITERS)]
    elif name == "proc":
        ws = [waiter_call(c, op, key, "CALL idem_bench_wait_proc(%s, 'u', %s, 'h', %s::interval, NULL)") for c in own]
    elif name == "func":
        ws = [waiter_call(c, op, key, "SELECT idem_bench_wait_func(%s, 'u', %s, 'h', %s::interval)") for c in own]
    elif name == "notify":
        ws = [waiter_notify(pool, listener, op, key) for _ in range(WAITERS)]
    stop = asyncio.Event()
    samples = []
    sampler = asyncio.create_task(xmin_sampler(mon, stop, samples))
    wtasks = [asyncio.create_task(w) for w in ws]
    token = await htask
    done_at = await complete(hconn, op, key, token, notify=(name == "notify"))
    results = await asyncio.gather(*wtasks)
    t1 = time.monotonic()
    cpu1 = server_cpu()
    stop.set()
    await sampler
    cur = await mon.execute(
        "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)::float8 FROM pg_stat_statements "
        "WHERE query NOT LIKE '%%pg_stat%%' AND toplevel")
    calls, exec_ms = await cur.fetchone()
    outcomes = {}
    for o, _, _ in results:
        outcomes[o] = outcomes.get(o, 0) + 1
    after = [at - done_at for o, at, _ in results if o == "replay"]
    polls = [p for _, _, p in results if p is not None]
    held_xmin = max((s[0] for s in samples), default=0)
    xmin_age = max((s[1] for s in samples), default=0)
    cur = await mon.execute("SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE query LIKE '%%idem_reserve%%' AND NOT toplevel")
    nested = (await cur.fetchone())[0]
    for t in tasks_bg:
        t.cancel()
    conns = 1 + len(pool_conns) + len(own) + (1 if listener else 0)
    for c in [hconn, mon] + pool_conns + own + ([listener.conn] if listener else []):
        await c.close()
    return {
        "scenario": name, "run": run, "outcomes": outcomes,
        "server_cpu_ms": round((cpu1 - cpu0) * 1000), "wall_s": round(t1 - t0, 2),
        "statements": calls, "exec_ms": round(exec_ms, 1),
        "probes": sum(polls) if polls else None,
        "connections": conns, "peak_pool_busy": pool.peak, "holder_complete_ms": COMPLETE_MS, "mean_pool_busy": round(pool.busy_s / (t1 - t0), 3),
        "waiters_holding_xmin_max": held_xmin, "xmin_age_max": xmin_age, "nested_reserve_calls": nested,
        "replay_after_complete_ms_mean": round(1000 * sum(after) / len(after)) if after else None,
        "replay_after_complete_ms_max": round(1000 * max(after)) if after else None,
    }


SETUP = """
CREATE OR REPLACE PROCEDURE idem_bench_wait_proc(op text, uid text, k text, h text, bound interval, INOUT outcome text)
LANGUAGE plpgsql AS $$
DECLARE deadline timestamptz := clock_timestamp() + bound; d float8 := 0.02;
BEGIN
  LOOP
    SELECT r.outcome INTO outcome FROM idem_reserve(op, uid, k, h) AS r;
    EXIT WHEN outcome <> 'in_progress' OR clock_timestamp() >= deadline;
    COMMIT;
    PERFORM pg_sleep(least(d, 0.25) * (0.5 + random() / 2));
    d := d * 2;
  END LOOP;
END $$;
CREATE OR REPLACE FUNCTION idem_bench_wait_func(op text, uid text, k text, h text, bound interval) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE deadline timestamptz := clock_timestamp() + bound; d float8 := 0.02; o text;
BEGIN
  LOOP
    SELECT r.outcome INTO o FROM idem_reserve(op, uid, k, h) AS r;
    EXIT WHEN o <> 'in_progress' OR clock_timestamp() >= deadline;
    PERFORM pg_sleep(least(d, 0.25) * (0.5 + random() / 2));
    d := d * 2;
  END LOOP;
  RETURN o;
END $$;
"""


async def main():
    names = sys.argv[1].split(",")
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    c = await psycopg.AsyncConnection.connect(DSN, autocommit=True)
    await c.execute(SETUP)
    await c.close()
    for r in range(runs):
        for n in names:  # interleaved
            print(json.dumps(await scenario(n, r)), flush=True)


asyncio.run(main())
