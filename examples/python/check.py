"""Checks of the Python example against a live database: every outcome of both flows, mapped to
HTTP, concurrent duplicates that execute once, and no SAVEPOINT on any in-transaction outcome, nor
any subtransaction inside the SQL calls (counted in transaction IDs).

    python3 examples/python/check.py DATABASE_URL [LABEL]

DATABASE_URL names a database with idempotency installed in schema public (the extension or the
portable install) and a superuser (the lease-lost check recovers a key with idem_recover_stuck),
on a server that preloads pg_stat_statements (shared_preload_libraries): the checks create that
extension in the database and turn its tracking on there (ALTER DATABASE .. SET
pg_stat_statements.track = 'all', reset at the end) to count the SAVEPOINTs the server ran.
The transaction ID counts assume nothing else writes on the server while they run (the test
command runs this file alone). The checks create and drop their own tables. Prints one line per check and ends with
`N passed, N failed`; exits non-zero on a failure.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import uuid
from datetime import timedelta

import psycopg
from psycopg import sql

from idempotency_sql import Answer, Idempotency, Permanent

URL = sys.argv[1] if len(sys.argv) > 1 else "postgresql://postgres@127.0.0.1:55415/postgres"
LABEL = sys.argv[2] if len(sys.argv) > 2 else "python"
THREADS = 16
DEADLINE = 30.0  # seconds, for every awaited condition

passed = 0
failed = 0


def connect() -> psycopg.Connection:
    return psycopg.connect(URL, autocommit=True)


admin = connect()
admin.execute("DROP TABLE IF EXISTS py_charges, py_card_charges")
admin.execute("CREATE TABLE py_charges (id bigserial PRIMARY KEY, k text NOT NULL, amount bigint NOT NULL)")
admin.execute("CREATE TABLE py_card_charges (id bigserial PRIMARY KEY, k text NOT NULL, network_ref text NOT NULL)")
idem = Idempotency(schema="public")

# Every connection opened from here on is tracked by pg_stat_statements, top-level statements
# and nested ones (a SAVEPOINT can only be top-level; 'all' leaves nothing out).
DATABASE = admin.execute("SELECT current_database()").fetchone()[0]
admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
admin.execute(sql.SQL("ALTER DATABASE {} SET pg_stat_statements.track = 'all'").format(sql.Identifier(DATABASE)))


def statements(pattern: str) -> int:
    """How often this database's backends ran a statement matching the regular expression
    (case-insensitive): the server's count, whatever the client sent."""
    return admin.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
        "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query ~* %s",
        (pattern,)).fetchone()[0]


SAVEPOINTS = r"^\s*(savepoint|release|rollback\s+to)\y"  # SAVEPOINT, RELEASE [SAVEPOINT], ROLLBACK TO
RESERVES = r"idem_reserve\("
savepoints_before = reserves_before = 0


def check(name):
    """Runs a check function; an AssertionError or any exception is a failure."""

    def wrap(fn):
        global passed, failed
        try:
            fn()
            passed += 1
            print(f"ok     {LABEL}: {name}")
        except Exception:
            failed += 1
            print(f"FAILED {LABEL}: {name}")
            print("       " + traceback.format_exc().replace("\n", "\n       "))
        return fn

    return wrap


def rows(table: str, key: str) -> int:
    return admin.execute(f"SELECT count(*) FROM {table} WHERE k = %s", (key,)).fetchone()[0]


def fresh() -> str:
    return f"k-{uuid.uuid4()}"


def charge(key: str, amount: int = 100, status: int = 201, calls: list | None = None):
    """The business handler: one insert into py_charges, then the given answer."""

    def handler(conn):
        if calls is not None:
            calls.append(1)
        cid = conn.execute("INSERT INTO py_charges (k, amount) VALUES (%s, %s) RETURNING id", (key, amount)).fetchone()[0]
        return Answer(status, {"id": cid, "amount": amount}, {"Location": f"/charges/{cid}", "Set-Cookie": "s=1"})

    return handler


def run(conn, key, handler, request=None, user="user-1", **kw) -> Answer:
    return idem.run(conn, "payments.create", user, key, request or {"amount": 100}, handler, **kw)


def expect(answer: Answer, status: int, replayed: bool | None = None, kind: str | None = None):
    assert answer.status == status, f"status {answer.status}, wanted {status}: {answer}"
    if replayed is not None:
        assert answer.replayed == replayed, f"replayed {answer.replayed}, wanted {replayed}: {answer}"
    if kind is not None:
        assert isinstance(answer.body, dict) and answer.body.get("type") == kind, f"problem {answer.body}, wanted {kind}"


conn = connect()


@check("pg_stat_statements counts the statements of this database: a SAVEPOINT taken on purpose is seen")
def _():
    global savepoints_before, reserves_before
    assert conn.execute("SHOW pg_stat_statements.track").fetchone()[0] == "all"
    before = statements(SAVEPOINTS)
    with connect() as c, c.transaction(), c.transaction():  # BEGIN, SAVEPOINT, RELEASE, COMMIT
        c.execute("SELECT 1")
    seen = statements(SAVEPOINTS) - before
    assert seen == 2, f"{seen} savepoint statements counted for a SAVEPOINT and its RELEASE, wanted 2"
    savepoints_before, reserves_before = statements(SAVEPOINTS), statements(RESERVES)


def xids_used(work) -> int:
    """Transaction IDs used by `work(c)` between a transaction before it and one after: its own,
    if it wrote, plus one for each subtransaction that wrote (an EXCEPTION block in PL/pgSQL
    leaves no SAVEPOINT text for pg_stat_statements to see)."""
    with connect() as c:
        before = c.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
        work(c)
        after = c.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
    return after - before - 1


@check("transaction IDs count subtransactions: a per-key EXCEPTION block around 3 inserts uses 4")
def _():
    used = xids_used(lambda c: c.execute(
        "DO $$ BEGIN FOR i IN 1..3 LOOP BEGIN INSERT INTO py_charges (k, amount) VALUES ('control', i); "
        "EXCEPTION WHEN lock_not_available THEN NULL; END; END LOOP; END $$"))
    assert used == 4, f"{used} transaction IDs, wanted 4 (the transaction and 3 subtransactions)"


@check("in-transaction: a fresh key's flow uses one transaction ID (no subtransaction in the SQL calls)")
def _():
    used = xids_used(lambda c: expect(run(c, fresh(), charge(fresh())), 201, replayed=False))
    assert used == 1, f"{used} transaction IDs for one in-transaction flow, wanted 1"


@check("200 reservations and completions in one transaction, and a 1,000-key batch, use one transaction ID each")
def _():
    def singles(c):
        prefix = fresh()
        with c.transaction():
            c.execute("CREATE TEMP TABLE got ON COMMIT DROP AS SELECT %s || g AS key, "
                      "(idem_reserve('py.xids', 'u', %s || g, 'h')).token FROM generate_series(1, 200) AS g",
                      (prefix, prefix))
            done = c.execute("SELECT count(*) FILTER (WHERE idem_complete('py.xids', 'u', key, token, '{}')) FROM got").fetchone()[0]
            assert done == 200, f"{done} of 200 completed"

    def batch(c):
        with c.transaction():
            n = c.execute("SELECT count(*) FROM idem_reserve_many('py.xids_many', 'u', "
                          "ARRAY(SELECT %s || g FROM generate_series(1, 1000) AS g), array_fill('h'::text, ARRAY[1000])) "
                          "WHERE outcome = 'created'", (fresh(),)).fetchone()[0]
            assert n == 1000, f"{n} created of 1000"

    for name, work in (("200 single calls", singles), ("a 1,000-key batch", batch)):
        used = xids_used(work)
        assert used == 1, f"{name}: {used} transaction IDs, wanted 1"


@check("in-transaction: a connection inside a transaction is refused (the flow's BEGIN would be a SAVEPOINT)")
def _():
    calls = []
    with connect() as c, c.transaction():
        try:
            run(c, fresh(), charge("x", calls=calls))
        except ValueError as e:
            assert "autocommit" in str(e) and "SAVEPOINT" in str(e), e
        else:
            raise AssertionError("run inside a transaction was not refused")
    assert not calls


@check("in-transaction: a fresh key runs, commits one business row and answers 201")
def _():
    key = fresh()
    a = run(conn, key, charge(key))
    expect(a, 201, replayed=False)
    assert rows("py_charges", key) == 1


@check("in-transaction: a duplicate replays the stored 201 (Idempotent-Replayed, no Set-Cookie) and runs nothing")
def _():
    key, calls = fresh(), []
    first = run(conn, key, charge(key, calls=calls))
    again = run(conn, key, charge(key, calls=calls))
    expect(again, 201, replayed=True)
    assert again.body == first.body and again.headers.get("Location") == first.headers["Location"]
    assert "Set-Cookie" not in again.headers
    assert len(calls) == 1 and rows("py_charges", key) == 1


@check("in-transaction: the same key with another payload answers 422 mismatch")
def _():
    key = fresh()
    run(conn, key, charge(key))
    expect(run(conn, key, charge(key), request={"amount": 999}), 422, kind="urn:idempotency:problem:mismatch")
    assert rows("py_charges", key) == 1


@check("in-transaction: an equal payload in another key order and spacing is the same request")
def _():
    key = fresh()
    run(conn, key, charge(key), request={"amount": 100, "currency": "EUR"})
    expect(run(conn, key, charge(key), request={"currency": "EUR", "amount": 100.0}), 201, replayed=True)


@check("in-transaction: keys are isolated per user (the same key for another user runs)")
def _():
    key = fresh()
    expect(run(conn, key, charge(key), user="user-a"), 201, replayed=False)
    expect(run(conn, key, charge(key), user="user-b"), 201, replayed=False)
    assert rows("py_charges", key) == 2


@check("in-transaction: a duplicate while the first attempt is uncommitted answers 409 in progress + Retry-After")
def _():
    key = fresh()
    inside, release = threading.Event(), threading.Event()
    result = {}

    def slow(c):
        a = charge(key)(c)
        inside.set()
        assert release.wait(DEADLINE), "the test never released the first attempt"
        return a

    def first():
        with connect() as c:
            result["first"] = run(c, key, slow)

    t = threading.Thread(target=first)
    t.start()
    try:
        assert inside.wait(DEADLINE), "the first attempt never reached its handler"
        with connect() as c:
            a = run(c, key, charge(key))
        expect(a, 409, kind="urn:idempotency:problem:in-progress")
        assert a.headers.get("Retry-After") == "1", a.headers
    finally:
        release.set()
        t.join(DEADLINE)
    expect(result["first"], 201, replayed=False)
    assert rows("py_charges", key) == 1


@check("in-transaction: with wait, a duplicate waits for the uncommitted first attempt and replays it")
def _():
    key = fresh()
    inside, release = threading.Event(), threading.Event()
    result = {}

    def slow(c):
        a = charge(key)(c)
        inside.set()
        assert release.wait(DEADLINE)
        return a

    def first():
        with connect() as c:
            result["first"] = run(c, key, slow)

    def second():
        with connect() as c:
            result["second"] = run(c, key, charge(key), wait=True)

    t1 = threading.Thread(target=first)
    t1.start()
    assert inside.wait(DEADLINE)
    t2 = threading.Thread(target=second)
    t2.start()
    # The waiter blocks on the first attempt's row lock: await that before letting it commit.
    deadline = time.monotonic() + DEADLINE
    while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()").fetchone()[0] < 1:
        assert time.monotonic() < deadline, "the second attempt never waited on the first"
        time.sleep(0.01)
    release.set()
    t1.join(DEADLINE)
    t2.join(DEADLINE)
    expect(result["first"], 201, replayed=False)
    expect(result["second"], 201, replayed=True)
    assert rows("py_charges", key) == 1


@check("in-transaction: a 4xx answer is a permanent failure: stored as FAILED with its writes, replayed to retries")
def _():
    key, calls = fresh(), []
    a = run(conn, key, charge(key, status=402, calls=calls))
    expect(a, 402, replayed=False)
    assert rows("py_charges", key) == 1, "an answered 4xx commits with its writes, as the Rust run does"
    assert admin.execute("SELECT status FROM idem_lookup('payments.create', 'user-1', %s)", (key,)).fetchone()[0] == "FAILED"
    again = run(conn, key, charge(key, calls=calls))
    expect(again, 402, replayed=True)
    assert len(calls) == 1


@check("in-transaction: a Permanent exception stores its response as FAILED; writes rolled back")
def _():
    key, calls = fresh(), []

    def declined(c):
        calls.append(1)
        charge(key)(c)
        raise Permanent(Answer(402, {"error": "card declined"}))

    expect(run(conn, key, declined), 402, replayed=False)
    again = run(conn, key, declined)
    expect(again, 402, replayed=True)
    assert again.body == {"error": "card declined"}
    assert len(calls) == 1 and rows("py_charges", key) == 0


@check("in-transaction: a 5xx answer is transient: writes rolled back, key released, the retry runs again")
def _():
    key, calls = fresh(), []
    expect(run(conn, key, charge(key, status=503, calls=calls)), 503, replayed=False)
    assert rows("py_charges", key) == 0
    expect(run(conn, key, charge(key, calls=calls)), 201, replayed=False)
    assert len(calls) == 2 and rows("py_charges", key) == 1


@check("in-transaction: a handler exception releases the key (500 handler-failed) and the retry runs")
def _():
    key, calls = fresh(), []

    def broken(c):
        calls.append(1)
        charge(key)(c)
        raise ValueError("boom")

    expect(run(conn, key, broken), 500, kind="urn:idempotency:problem:handler-failed")
    assert rows("py_charges", key) == 0
    expect(run(conn, key, charge(key, calls=calls)), 201, replayed=False)
    assert len(calls) == 2


@check("in-transaction: max_retries transient failures poison the key: then 409 failed, never run again")
def _():
    key, calls = fresh(), []
    poisoning = Idempotency(schema="public", max_retries=2)
    for _ in range(2):
        expect(poisoning.run(conn, "payments.create", "user-1", key, {"amount": 100}, charge(key, status=500, calls=calls)), 500)
    a = poisoning.run(conn, "payments.create", "user-1", key, {"amount": 100}, charge(key, calls=calls))
    expect(a, 409, kind="urn:idempotency:problem:failed")
    assert len(calls) == 2 and rows("py_charges", key) == 0


@check("in-transaction: idem_complete answering false (the key taken over) rolls everything back: 409 lease-lost")
def _():
    key, calls = fresh(), []

    def taken_over(c):
        charge(key, calls=calls)(c)
        # Stands in for a takeover: the record's token is no longer this attempt's (superuser).
        # The lookup first writes the record (the native hot path keeps a fresh one in memory).
        c.execute("SELECT FROM idem_lookup('payments.create', 'user-1', %s)", (key,))
        c.execute("UPDATE idem_records SET token = token + 1000000 WHERE key = %s", (key,))
        return Answer(201, {"id": 0})

    a = run(conn, key, taken_over)
    expect(a, 409, kind="urn:idempotency:problem:lease-lost")
    assert "Retry-After" in a.headers
    assert rows("py_charges", key) == 0, "a lost attempt's write must roll back"
    expect(run(conn, key, charge(key, calls=calls)), 201, replayed=False)
    assert len(calls) == 2


@check("in-transaction: a 40001 in the handler retries the whole transaction, uncounted: one row, 201")
def _():
    key, calls = fresh(), []

    def conflicted(c):
        calls.append(1)
        charge(key)(c)
        if len(calls) == 1:
            c.execute("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")
        return Answer(201, {"ok": True})

    expect(run(conn, key, conflicted), 201, replayed=False)
    assert len(calls) == 2 and rows("py_charges", key) == 1
    attempts = admin.execute("SELECT count(*) FROM idem_retries WHERE key = %s", (key,)).fetchone()[0]
    assert attempts == 0, "a serialization failure is not a failure of the key"


@check("in-transaction: an invalid key answers 400 (the server's rule) and runs nothing")
def _():
    calls = []
    expect(run(conn, "", charge("x", calls=calls)), 400, kind="urn:idempotency:problem:key-invalid")
    expect(run(conn, "a\x01b", charge("x", calls=calls)), 400, kind="urn:idempotency:problem:key-invalid")
    expect(run(conn, "k" * 256, charge("x", calls=calls)), 400, kind="urn:idempotency:problem:key-invalid")
    assert not calls


@check("in-transaction: a lost connection answers 503 store-unavailable + Retry-After, nothing ran")
def _():
    key, calls = fresh(), []
    c = connect()
    pid = c.info.backend_pid
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    a = run(c, key, charge(key, calls=calls))
    expect(a, 503, kind="urn:idempotency:problem:store-unavailable")
    assert "Retry-After" in a.headers and not calls
    c.close()


@check(f"in-transaction: {THREADS} threads, one key: exactly one execution, the others replay or 409")
def _():
    key, calls, lock = fresh(), [], threading.Lock()
    start = threading.Barrier(THREADS)
    answers = []

    def worker():
        with connect() as c:
            start.wait(DEADLINE)

            def handler(cc):
                with lock:
                    calls.append(1)
                return charge(key)(cc)

            a = run(c, key, handler)
            with lock:
                answers.append(a)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert len(answers) == THREADS, f"{len(answers)} of {THREADS} answered"
    assert rows("py_charges", key) == 1 and len(calls) == 1, f"{rows('py_charges', key)} rows, {len(calls)} runs"
    executed = [a for a in answers if a.status == 201 and not a.replayed]
    others = [a for a in answers if a.replayed or a.status == 409]
    assert len(executed) == 1 and len(others) == THREADS - 1, [(a.status, a.replayed) for a in answers]
    assert all(a.body == executed[0].body for a in answers if a.replayed)


@check(f"in-transaction: {THREADS} threads, one key, wait: one execution, every other thread replays it")
def _():
    key, lock = fresh(), threading.Lock()
    start = threading.Barrier(THREADS)
    answers = []

    def worker():
        with connect() as c:
            start.wait(DEADLINE)
            a = run(c, key, charge(key), wait=True)
            with lock:
                answers.append(a)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert rows("py_charges", key) == 1
    assert sorted((a.status, a.replayed) for a in answers) == [(201, False)] + [(201, True)] * (THREADS - 1), \
        [(a.status, a.replayed) for a in answers]


def race(failing, then_status: int):
    """A fails with `failing`; between its rollback and its re-reservation, B takes the key (gated
    there by a seam on the failure path's statement) and holds it uncommitted until A answered."""
    key = fresh()
    a_rolled_back, b_inside, b_go = threading.Event(), threading.Event(), threading.Event()
    result = {}

    class Racing(Idempotency):
        def _again(self, c, statement, params):
            a_rolled_back.set()
            assert b_inside.wait(DEADLINE), "the other attempt never took the key"
            return super()._again(c, statement, params)

    def b_handler(c):
        a = charge(key)(c)
        b_inside.set()
        assert b_go.wait(DEADLINE), "the test never let the other attempt finish"
        return a

    def attempt(name, flow, handler):
        with connect() as c:
            result[name] = flow.run(c, "payments.create", "user-1", key, {"amount": 100}, handler)

    a = threading.Thread(target=attempt, args=("a", Racing(schema="public"), failing(key)))
    a.start()
    b = None
    try:
        assert a_rolled_back.wait(DEADLINE), "the failing attempt never reached its failure path"
        b = threading.Thread(target=attempt, args=("b", idem, b_handler))
        b.start()
        a.join(DEADLINE)
        assert not a.is_alive(), "the failing attempt never answered"
    finally:
        b_go.set()
        a.join(DEADLINE)
        if b:
            b.join(DEADLINE)
    expect(result["a"], then_status, replayed=False)
    expect(result["b"], 201, replayed=False)
    counted = admin.execute("SELECT count(*) FROM idem_retries WHERE key = %s", (key,)).fetchone()[0]
    assert counted == 0, f"{counted} failures counted for a key the failed attempt could not take again"
    assert admin.execute("SELECT status FROM idem_lookup('payments.create', 'user-1', %s)", (key,)).fetchone()[0] == "SUCCESS"
    assert rows("py_charges", key) == 1, "only the other attempt's write commits"
    expect(run(conn, key, charge(key)), 201, replayed=True)


@check("in-transaction: a transient failure whose key another attempt took after the rollback is not counted; that attempt's 201 stands")
def _():
    race(lambda key: charge(key, status=503), 503)


@check("in-transaction: a Permanent failure whose key another attempt took after the rollback stores nothing; that attempt's 201 stands")
def _():
    def declined(key):
        def handler(c):
            charge(key)(c)
            raise Permanent(Answer(402, {"error": "card declined"}))
        return handler

    race(declined, 402)


@check("in-transaction: no check above took a SAVEPOINT (pg_stat_statements: every outcome, the threads included)")
def _():
    reserves = statements(RESERVES) - reserves_before
    savepoints = statements(SAVEPOINTS) - savepoints_before
    assert reserves >= 50, f"only {reserves} idem_reserve statements counted: is tracking on for the flows' connections?"
    assert savepoints == 0, f"{savepoints} SAVEPOINT / RELEASE / ROLLBACK TO statements ran during the in-transaction checks"


# -- two-phase -------------------------------------------------------------------------------


def card(key: str, calls: list, status: int = 201, ref: str = "ch_1"):
    """The outside call (a card network) and the local write of its result."""

    def call():
        calls.append(1)
        return Answer(status, {"network_ref": ref})

    def record(c, answer):
        c.execute("INSERT INTO py_card_charges (k, network_ref) VALUES (%s, %s)", (key, answer.body["network_ref"]))

    return call, record


def two_phase(c, key, call, record, **kw) -> Answer:
    return idem.run_two_phase(c, "card.charge", "user-1", key, {"amount": 100}, call, record, **kw)


@check("two-phase: a fresh key calls out once, records locally and completes; a duplicate replays")
def _():
    key, calls = fresh(), []
    expect(two_phase(conn, key, *card(key, calls)), 201, replayed=False)
    a = two_phase(conn, key, *card(key, calls))
    expect(a, 201, replayed=True)
    assert a.body == {"network_ref": "ch_1"}
    assert len(calls) == 1 and rows("py_card_charges", key) == 1


@check("two-phase: the reservation is committed before the call: a duplicate meanwhile gets 409")
def _():
    key, calls = fresh(), []
    seen = {}

    def call():
        calls.append(1)
        with connect() as other:
            seen["dup"] = two_phase(other, key, *card(key, calls))
        return Answer(201, {"network_ref": "ch_2"})

    _, record = card(key, calls)
    expect(two_phase(conn, key, call, record), 201, replayed=False)
    expect(seen["dup"], 409, kind="urn:idempotency:problem:in-progress")
    assert len(calls) == 1 and rows("py_card_charges", key) == 1


@check("two-phase: a call that raises releases the key (500); the retry calls out again")
def _():
    key, calls = fresh(), []

    def failing():
        calls.append(1)
        raise TimeoutError("card network timed out")

    _, record = card(key, calls)
    expect(two_phase(conn, key, failing, record), 500, kind="urn:idempotency:problem:handler-failed")
    expect(two_phase(conn, key, *card(key, calls)), 201, replayed=False)
    assert len(calls) == 2 and rows("py_card_charges", key) == 1


@check("two-phase: a 5xx from the call releases the key; a 4xx is stored as FAILED and replayed")
def _():
    key, calls = fresh(), []
    expect(two_phase(conn, key, *card(key, calls, status=502)), 502)
    assert rows("py_card_charges", key) == 0
    expect(two_phase(conn, key, *card(key, calls, status=402)), 402, replayed=False)
    expect(two_phase(conn, key, *card(key, calls)), 402, replayed=True)
    assert len(calls) == 2


@check("two-phase: a local write that fails keeps the outside result in the key: the retry replays it")
def _():
    key, calls = fresh(), []
    call, _ = card(key, calls)

    def broken_record(c, answer):
        raise ValueError("the local table is gone")

    expect(two_phase(conn, key, call, broken_record), 201, replayed=False)
    expect(two_phase(conn, key, *card(key, calls)), 201, replayed=True)
    assert len(calls) == 1, "the outside call must never run again"


@check("two-phase: the heartbeat extends the lease while the call runs")
def _():
    key, calls = fresh(), []

    def lease_end():
        return admin.execute("SELECT lease_expires_at FROM idem_lookup('card.charge', 'user-1', %s)", (key,)).fetchone()[0]

    def call():
        calls.append(1)
        first = lease_end()
        deadline = time.monotonic() + DEADLINE
        while lease_end() <= first:  # awaited: a beat moved the lease end forward
            assert time.monotonic() < deadline, "no heartbeat extended the lease"
            time.sleep(0.05)
        return Answer(201, {"network_ref": "ch_3"})

    _, record = card(key, calls)
    expect(two_phase(conn, key, call, record, lease=timedelta(seconds=1.5)), 201, replayed=False)
    assert rows("py_card_charges", key) == 1


@check("two-phase: a lease lost during the call (recovered) answers 409 lease-lost and rolls the local write back")
def _():
    key, calls = fresh(), []

    def call():
        calls.append(1)
        deadline = time.monotonic() + DEADLINE
        # No heartbeat: await the lease's expiry and its recovery by the operator function.
        while admin.execute(
                "SELECT idem_recover_stuck(batch_size => 1000, action => 'release') >= 0 AND "
                "NOT EXISTS (SELECT FROM idem_lookup('card.charge', 'user-1', %s))", (key,)).fetchone()[0] is False:
            assert time.monotonic() < deadline, "the key was never recovered"
            time.sleep(0.05)
        return Answer(201, {"network_ref": "ch_4"})

    _, record = card(key, calls)
    a = two_phase(conn, key, call, record, lease=timedelta(milliseconds=200), heartbeat=False)
    expect(a, 409, kind="urn:idempotency:problem:lease-lost")
    assert rows("py_card_charges", key) == 0, "a stale attempt's local write must roll back"


@check(f"two-phase: {THREADS} threads, one key: exactly one outside call and one local row")
def _():
    key, calls, lock = fresh(), [], threading.Lock()
    start = threading.Barrier(THREADS)
    answers = []

    def worker():
        with connect() as c:
            start.wait(DEADLINE)

            def call():
                with lock:
                    calls.append(1)
                return Answer(201, {"network_ref": "ch_5"})

            _, record = card(key, calls)
            a = two_phase(c, key, call, record)
            with lock:
                answers.append(a)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert len(answers) == THREADS
    assert len(calls) == 1 and rows("py_card_charges", key) == 1, f"{len(calls)} calls, {rows('py_card_charges', key)} rows"
    executed = [a for a in answers if a.status == 201 and not a.replayed]
    assert len(executed) == 1 and all(a.replayed or a.status == 409 for a in answers if a is not executed[0])


# -- the runnable HTTP example ---------------------------------------------------------------


@check("charges.py over HTTP: 201, the replayed 201, 422 for another body, 400 without a key, 401 without a user")
def _():
    import json
    import urllib.error
    import urllib.request

    import charges

    with connect() as c:
        c.execute(charges.SCHEMA)
    server = charges.make_server(URL, ("127.0.0.1", 0), idem)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/charges"
    user, key = f"user-{uuid.uuid4()}", fresh()

    def post(body, headers):
        req = urllib.request.Request(base, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=DEADLINE) as r:
                return r.status, dict(r.headers), json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), json.loads(e.read())

    try:
        both = {"Idempotency-Key": key, "X-User": user}
        status, headers, first = post({"amount": 100}, both)
        assert status == 201 and "Idempotent-Replayed" not in headers, (status, headers)
        status, headers, again = post({"amount": 100}, both)
        assert status == 201 and headers.get("Idempotent-Replayed") == "true" and again == first, (status, headers)
        assert post({"amount": 5}, both)[0] == 422
        assert post({"amount": 100}, {"X-User": user})[0] == 400
        assert post({"amount": 100}, {"Idempotency-Key": key})[0] == 401
        n = admin.execute("SELECT count(*) FROM charges WHERE user_id = %s", (user,)).fetchone()[0]
        assert n == 1, f"{n} charges"
    finally:
        server.shutdown()
        server.server_close()


conn.close()
admin.execute("DROP TABLE py_charges, py_card_charges")
admin.execute(sql.SQL("ALTER DATABASE {} RESET pg_stat_statements.track").format(sql.Identifier(DATABASE)))
admin.close()
print(f"{passed} passed, {failed} failed")
sys.exit(0 if failed == 0 else 1)
