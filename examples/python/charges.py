"""An idempotent POST /charges in plain Python (standard library HTTP server + psycopg 3), the
twin of examples/rust/src/charges.rs: the charge row and the stored response commit together.

    DATABASE_URL=postgresql://postgres@127.0.0.1:55415/postgres BIND=127.0.0.1:3000 \\
        python3 examples/python/charges.py
    curl -i -X POST localhost:3000/charges -H 'Idempotency-Key: k-1' -H 'X-User: u-1' -d '{"amount": 100}'

Answers: 201 and the charge; the stored 201 with Idempotent-Replayed: true for a retry; 409 +
Retry-After while another attempt holds the key; 422 when the key was used for another request;
400 without an Idempotency-Key or with a bad one, 401 without X-User; 503 when the store is down.
IDEM_SCHEMA names the schema idempotency is installed in (default public).
"""

from __future__ import annotations

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg

from idempotency_sql import KEY_INVALID, Answer, Idempotency, problem

SCHEMA = "CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL)"


def create_charge(user: str, body: dict):
    """The handler: runs inside the reservation's transaction."""

    def handler(conn: psycopg.Connection) -> Answer:
        amount = body.get("amount") if isinstance(body, dict) else None
        if not isinstance(amount, int) or amount <= 0:
            return Answer(422, {"error": "amount must be positive"})  # stored and replayed
        cid = conn.execute("INSERT INTO charges (user_id, amount) VALUES (%s, %s) RETURNING id", (user, amount)).fetchone()[0]
        return Answer(201, {"id": cid, "amount": amount}, {"Location": f"/charges/{cid}", "Content-Type": "application/json"})

    return handler


def make_server(url: str, bind: tuple[str, int], idem: Idempotency) -> ThreadingHTTPServer:
    class Charges(BaseHTTPRequestHandler):
        def do_POST(self):
            if self.path != "/charges":
                return self.answer(Answer(404, {"error": "not found"}))
            key = self.headers.get("Idempotency-Key")
            user = self.headers.get("X-User")
            if not key:
                return self.answer(problem(400, "urn:idempotency:problem:key-missing", "Idempotency key missing",
                                           "this request needs an Idempotency-Key header"))
            if not user:
                return self.answer(problem(401, "urn:idempotency:problem:user-missing", "No user", "no X-User header"))
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                return self.answer(problem(400, KEY_INVALID, "Body unreadable", "the body is not JSON"))
            request = {"method": "POST", "path": self.path, "body": body}  # what the fingerprint covers
            try:
                conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
            except psycopg.OperationalError as e:
                return self.answer(idem.unavailable(e))
            with conn:
                self.answer(idem.run(conn, "POST /charges", user, key, request, create_charge(user, body)))

        def answer(self, a: Answer):
            payload = json.dumps(a.body).encode()
            self.send_response(a.status)
            for name, value in a.headers.items():
                self.send_header(name, value)
            if "Content-Type" not in a.headers:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    return ThreadingHTTPServer(bind, Charges)


def main():
    url = os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("set DATABASE_URL to the database with idempotency installed")
    host, _, port = os.environ.get("BIND", "127.0.0.1:3000").rpartition(":")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    server = make_server(url, (host, int(port)), Idempotency(schema=os.environ.get("IDEM_SCHEMA", "public")))
    print(f"listening on http://{host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
