"""The idempotency SQL API from Python (psycopg 3), without a client library.

Two functions, one per flow, each ending with the HTTP answer a web handler would send, mapped
the way the Rust tower layer maps its outcomes:

    outcome / event                      answer
    created, handler succeeded           the handler's response (stored, SUCCESS)
    created, handler answered 4xx        the handler's response, committed with its writes as
      (except 408, 409, 425, 429)          FAILED (replayed as is)
    created, handler answered 5xx or     the handler's response; the business writes are undone
      408/409/425/429                    and the key released (idem_release), so a retry runs again
    created, handler raised              500 problem; writes undone, key released
    created, handler raised Permanent    its response, stored as FAILED; its writes undone
    a failure whose key another attempt  the failed attempt's own answer (above); nothing counted,
      took after the rollback              the other attempt's result stands
    replay                               the stored response + Idempotent-Replayed: true
    in_progress                          409 problem + Retry-After
    mismatch                             422 problem
    failed with a stored response        the stored response + Idempotent-Replayed: true
    failed without one (poisoned,        409 problem
      recovered after a crash)
    idem_complete answered false         409 problem + Retry-After (lease lost; writes undone)
    invalid key (22023 / 22004)          400 problem
    store unreachable                    503 problem + Retry-After

The request fingerprint is computed by the server (idem_fingerprint over the request as jsonb),
so Python never re-implements the canonical JSON rules. Stored responses have the shape the Rust
client's StoredResponse uses ({"status", "headers", "body"}), so a key written from Python
replays from Rust and the other way round. Set-Cookie and Authorization are never stored.

No subtransaction on any path. A failure of the in-transaction flow (a transient answer or
error, a Permanent) rolls the whole transaction back, which undoes the handler's writes and the
reservation with them; then one statement, committed on its own, reserves the key again (the
same request, never waiting) and, only when that answers created, releases it (counted towards
max_retries) or completes it FAILED with the Permanent's response. When another attempt took or
finished the key in between, nothing is counted and that attempt's result stands.

Connections must be in autocommit mode (psycopg.connect(url, autocommit=True)) and outside a
transaction: each flow opens its own with conn.transaction(), which would be a SAVEPOINT inside
one of yours (the flows refuse that). A handler that opens conn.transaction() itself takes a
savepoint of its own.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable, Optional

import psycopg
from psycopg import errors, sql

# The problem types of the Rust layer (client/src/layer/problem.rs), so clients branch alike.
IN_PROGRESS = "urn:idempotency:problem:in-progress"
LEASE_LOST = "urn:idempotency:problem:lease-lost"
MISMATCH = "urn:idempotency:problem:mismatch"
FAILED = "urn:idempotency:problem:failed"
KEY_INVALID = "urn:idempotency:problem:key-invalid"
STORE_UNAVAILABLE = "urn:idempotency:problem:store-unavailable"
HANDLER_FAILED = "urn:idempotency:problem:handler-failed"

UNSTORED_HEADERS = {"set-cookie", "authorization"}
# 40001 and 40P01 retry the whole transaction (the handler may run again; one run commits).
RETRIED = (errors.SerializationFailure, errors.DeadlockDetected)


@dataclass
class Answer:
    """An HTTP response: what the handler returns and what the flows answer."""

    status: int
    body: object = None
    headers: dict = field(default_factory=dict)

    @property
    def replayed(self) -> bool:
        return self.headers.get("Idempotent-Replayed") == "true"

    def stored(self) -> str:
        headers = [[k, v] for k, v in self.headers.items() if k.lower() not in UNSTORED_HEADERS]
        return json.dumps({"status": self.status, "headers": headers, "body": self.body})

    @staticmethod
    def replay(stored: dict) -> "Answer":
        headers = {k: v for k, v in stored.get("headers", [])}
        headers["Idempotent-Replayed"] = "true"
        return Answer(stored.get("status", 200), stored.get("body"), headers)


class Permanent(Exception):
    """Raised by a handler for a failure that must never run again (a declined card): stored
    as FAILED with this response and replayed to every retry."""

    def __init__(self, answer: Answer):
        super().__init__(f"permanent failure: {answer.status}")
        self.answer = answer


def verdict(status: int) -> str:
    """The Rust client's default HTTP policy: 'success', 'failure' (stored) or 'transient'."""
    if status in (408, 409, 425, 429):
        return "transient"
    if 200 <= status <= 399:
        return "success"
    if 400 <= status <= 499:
        return "failure"
    return "transient"


def problem(status: int, kind: str, title: str, detail: str, retry_after: Optional[int] = None) -> Answer:
    headers = {"Content-Type": "application/problem+json"}
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, retry_after))
    return Answer(status, {"type": kind, "title": title, "status": status, "detail": detail}, headers)


class Idempotency:
    """The statements of one schema (the extension's, or a portable install's)."""

    def __init__(self, schema: str = "public", retry_after: int = 1, max_retries: Optional[int] = None,
                 serialization_retries: int = 5):
        s = sql.Identifier(schema)
        scope = sql.SQL("operation => %(operation)s, user_id => %(user_id)s, key => %(key)s")
        reserve_call = sql.SQL(
            "{s}.idem_reserve({scope}, request_hash => {s}.idem_fingerprint(%(request)s::jsonb), "
            "lease => %(lease)s::interval, wait => %(wait)s)").format(s=s, scope=scope)
        self.reserve_sql = sql.SQL("SELECT outcome, token, response FROM {reserve}").format(reserve=reserve_call)
        self.complete_sql = sql.SQL(
            "SELECT {s}.idem_complete({scope}, token => %(token)s, response => %(response)s::jsonb, "
            "status => %(status)s)").format(s=s, scope=scope)
        self.release_sql = sql.SQL(
            "SELECT {s}.idem_release({scope}, token => %(token)s, max_retries => %(max_retries)s)"
        ).format(s=s, scope=scope)

        def again(then: str) -> sql.Composed:
            """The failure path's one statement: reserve again and, only when created, `then`."""
            return sql.SQL("SELECT r.outcome, CASE WHEN r.outcome = 'created' THEN {then} END AS answer "
                           "FROM {reserve} AS r").format(then=sql.SQL(then).format(s=s, scope=scope),
                                                         reserve=reserve_call)

        self.reserve_and_release_sql = again("{s}.idem_release({scope}, token => r.token, max_retries => %(max_retries)s)")
        self.reserve_and_fail_sql = again(
            "{s}.idem_complete({scope}, token => r.token, response => %(response)s::jsonb, status => 'FAILED')::text")
        self.heartbeat_sql = sql.SQL(
            "SELECT {s}.idem_heartbeat({scope}, token => %(token)s, lease => %(lease)s::interval)"
        ).format(s=s, scope=scope)
        self.retry_after = retry_after
        self.max_retries = max_retries
        self.serialization_retries = serialization_retries

    # -- the in-transaction flow ---------------------------------------------------------------

    def run(self, conn: psycopg.Connection, operation: str, user_id: str, key: str, request: object,
            handler: Callable[[psycopg.Connection], Answer], *, wait: bool = False,
            lease: Optional[timedelta] = None) -> Answer:
        """Reserve, run handler(conn), complete, in one transaction; no savepoint."""
        _outside_transaction(conn)
        scope = {"operation": operation, "user_id": user_id, "key": key}
        for attempt in range(self.serialization_retries + 1):
            try:
                return self._run_once(conn, scope, request, handler, wait, lease)
            except RETRIED:
                if attempt == self.serialization_retries:
                    raise
            except _Refused as r:
                return r.answer
            except psycopg.OperationalError as e:
                return self.unavailable(e)
        raise AssertionError("unreachable")

    def _run_once(self, conn, scope, request, handler, wait, lease) -> Answer:
        failure = None  # set when the attempt failed: its transaction is then rolled back whole
        with conn.transaction() as tx:  # BEGIN ... COMMIT (conn is in autocommit mode)
            reserved = self._reserve(conn, scope, request, wait, lease)
            if isinstance(reserved, Answer):
                return reserved  # the transaction wrote nothing
            try:
                answer = handler(conn)
            except (RETRIED + (psycopg.OperationalError,)):
                raise  # the whole transaction is retried / the store is unavailable
            except Exception as e:  # a Permanent, or any other error (transient)
                failure = e
                raise psycopg.Rollback(tx)
            if verdict(answer.status) == "transient":
                failure = answer
                raise psycopg.Rollback(tx)
            status = "SUCCESS" if verdict(answer.status) == "success" else "FAILED"
            if self._complete(conn, {**scope, "token": reserved}, answer, status):
                return answer
            # The key was lost (recovered, taken over): nothing of this attempt may commit.
            raise psycopg.Rollback(tx)
        # Reached only through psycopg.Rollback(tx), which ends the block quietly.
        if failure is None:
            return self._lease_lost()
        return self._record_failure(conn, scope, request, lease, failure)

    def _record_failure(self, conn, scope, request, lease, failure) -> Answer:
        """After the rollback (the handler's writes and the reservation undone): reserve the key
        again and release it (transient) or complete it FAILED (Permanent), in one statement.
        When the key could not be taken again, another attempt holds or finished it: nothing is
        counted, and this attempt answers its own result."""
        params = {**scope, "request": json.dumps(request), "lease": lease, "wait": False}
        if isinstance(failure, Permanent):
            self._again(conn, self.reserve_and_fail_sql, {**params, "response": failure.answer.stored()})
            return failure.answer
        _, released = self._again(conn, self.reserve_and_release_sql, {**params, "max_retries": self.max_retries})
        if released == "stale":
            return self._lease_lost()
        if isinstance(failure, Answer):
            return failure
        return problem(500, HANDLER_FAILED, "Handler failed", f"the handler raised {failure!r}")

    def _again(self, conn, statement, params):
        """(outcome, answer) of a failure path's statement, committed on its own (autocommit);
        answer is NULL unless the re-reservation answered created."""
        return conn.execute(statement, params).fetchone()

    # -- the two-phase flow --------------------------------------------------------------------

    def run_two_phase(self, conn: psycopg.Connection, operation: str, user_id: str, key: str, request: object,
                      call: Callable[[], Answer], record: Callable[[psycopg.Connection, Answer], None], *,
                      lease: timedelta = timedelta(seconds=60), heartbeat: bool = True) -> Answer:
        """Reserve and commit; call() outside the database while a thread heartbeats the lease;
        then, in a new transaction, record(conn, answer) and complete."""
        _outside_transaction(conn)
        scope = {"operation": operation, "user_id": user_id, "key": key}
        try:
            reserved = self._reserve(conn, scope, request, False, lease)  # autocommit: committed now
        except _Refused as r:
            return r.answer
        except psycopg.OperationalError as e:
            return self.unavailable(e)
        if isinstance(reserved, Answer):
            return reserved
        ids = {**scope, "token": reserved}
        beat = _Heartbeat(conn, self.heartbeat_sql, {**ids, "lease": lease}, lease) if heartbeat else None
        failure = None
        try:
            answer = call()
        except Exception as e:
            failure = e
        finally:
            if beat:
                beat.stop()
        if isinstance(failure, Permanent):
            return failure.answer if self._complete(conn, ids, failure.answer, "FAILED") else self._lease_lost()
        if failure is not None:  # transient: give the key back for a retry
            return self._release(conn, ids) or problem(500, HANDLER_FAILED, "Handler failed",
                                                       f"the call raised {failure!r}")
        if verdict(answer.status) == "transient":
            return self._release(conn, ids) or answer
        status = "SUCCESS" if verdict(answer.status) == "success" else "FAILED"
        # The outside effect happened: from here on the key is never released. The local
        # transaction is retried on 40001 / 40P01 / a lost connection.
        for attempt in range(self.serialization_retries + 1):
            try:
                with conn.transaction() as tx:
                    record(conn, answer)
                    if self._complete(conn, ids, answer, status):
                        return answer
                    raise psycopg.Rollback(tx)
                return self._lease_lost()  # rolled back: record's writes are undone
            except Exception as e:
                retried = isinstance(e, RETRIED + (psycopg.OperationalError,))
                if not retried or attempt == self.serialization_retries:
                    break
        # The local write cannot be recorded: keep the outside result in the key alone, so a
        # retry replays it and never calls out again; reconcile the local state from it.
        try:
            self._complete(conn, ids, answer, status)
        except psycopg.Error:
            pass
        return answer

    # -- the statements ------------------------------------------------------------------------

    def _reserve(self, conn, scope, request, wait, lease):
        """The token of a created reservation, or the final Answer of any other outcome."""
        try:
            row = conn.execute(self.reserve_sql, {**scope, "request": json.dumps(request), "wait": wait,
                                                  "lease": lease}).fetchone()
        except (errors.InvalidParameterValue, errors.NullValueNotAllowed) as e:
            # The server's key rules: 400 names the argument and the rule.
            raise _Refused(problem(400, KEY_INVALID, "Invalid idempotency key", e.diag.message_primary or str(e)))
        outcome, token, response = row
        if outcome == "created":
            return token
        if outcome == "replay":
            return Answer.replay(response or {})
        if outcome == "failed":
            if response is not None:
                return Answer.replay(response)
            return problem(409, FAILED, "Request failed", "an earlier attempt with this key failed for good")
        if outcome == "in_progress":
            return problem(409, IN_PROGRESS, "Request in progress", "another request with this key is being processed",
                           self.retry_after)
        if outcome == "mismatch":
            return problem(422, MISMATCH, "Idempotency key reused", "this key was used with a different request")
        raise RuntimeError(f"unexpected outcome {outcome!r} from idem_reserve")

    def _complete(self, conn, ids, answer: Answer, status: str) -> bool:
        return conn.execute(self.complete_sql, {**ids, "response": answer.stored(), "status": status}).fetchone()[0]

    def _release(self, conn, ids) -> Optional[Answer]:
        """Releases the key (or poisons it at max_retries); a lease-lost answer when stale."""
        released = conn.execute(self.release_sql, {**ids, "max_retries": self.max_retries}).fetchone()[0]
        return self._lease_lost() if released == "stale" else None

    def _lease_lost(self) -> Answer:
        return problem(409, LEASE_LOST, "Lease lost", "this attempt lost its hold on the key; retry", self.retry_after)

    def unavailable(self, e: Exception) -> Answer:
        return problem(503, STORE_UNAVAILABLE, "Idempotency store unavailable", str(e).strip(), self.retry_after)


def _outside_transaction(conn: psycopg.Connection) -> None:
    """The flows' rule for conn: autocommit and outside a transaction, so their transactions are
    not savepoints (a connection already lost passes: its first statement answers 503)."""
    busy = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR,
            psycopg.pq.TransactionStatus.ACTIVE)
    if not conn.autocommit or conn.info.transaction_status in busy:
        raise ValueError("conn must be in autocommit mode and outside a transaction: the flows open "
                         "their own, and one inside yours would be a SAVEPOINT")


class _Refused(Exception):
    def __init__(self, answer: Answer):
        super().__init__("refused")
        self.answer = answer


class _Heartbeat:
    """Extends the lease every third of it until stopped (or until the key is lost)."""

    def __init__(self, conn, statement, params, lease: timedelta):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(conn, statement, params, lease / 3), daemon=True)
        self._thread.start()

    def _beat(self, conn, statement, params, every: timedelta):
        while not self._stop.wait(every.total_seconds()):
            try:
                if not conn.execute(statement, params).fetchone()[0]:
                    return  # lost: the final idem_complete is fenced and will say so
            except psycopg.Error:
                continue  # tried again a third of a lease later

    def stop(self):
        self._stop.set()
        self._thread.join()
