"""Checks of the gRPC example through a client that is not tonic: Python's grpcio, against the
example's service behind the idempotency layer on every route (with tonic's health and
reflection services beside it), in both modes.

    python3 examples/python/grpc_check.py OUT_DIR IN_TX TWO_PHASE IN_TX_SMALL TWO_PHASE_SMALL

OUT_DIR is where the stubs are generated from examples/rust/proto/charges.proto (grpc_tools's
protoc; nothing generated is committed). The four addresses (host:port) serve the layer
in-transaction and two-phase, then the same with a response limit of 4 bytes, so that every
answer is over it. tests/tests/grpc_conformance.rs starts them and runs this file. Needs
grpcio and grpcio-tools (scripts/setup.sh installs them). Prints one line per check and ends
with `N passed, N failed`; exits non-zero on a failure.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import grpc
from grpc_tools import protoc

OUT_DIR, IN_TX, TWO_PHASE, IN_TX_SMALL, TWO_PHASE_SMALL = sys.argv[1:6]
PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "rust", "proto")
os.makedirs(OUT_DIR, exist_ok=True)
generated = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={OUT_DIR}", f"--grpc_python_out={OUT_DIR}", "charges.proto"])
if generated != 0:
    sys.exit(f"grpc_tools.protoc failed on {PROTO_DIR}/charges.proto: {generated}")
sys.path.insert(0, OUT_DIR)

import charges_pb2  # noqa: E402  (generated above)
import charges_pb2_grpc  # noqa: E402

RUN = f"{os.getpid()}-{time.time_ns()}"
FAIL_DETAILS = b"\x08\x05\x12\x0bdetails\x00\xff"  # the example's grpc-status-details-bin
PROBLEM = "urn:idempotency:problem:"

passed = 0
failed = 0


def check(name):
    def wrap(fn):
        global passed, failed
        try:
            fn()
            print(f"ok     grpcio: {name}")
            passed += 1
        except Exception:  # noqa: BLE001 - every failure is reported, then counted
            print(f"FAILED grpcio: {name}")
            for line in traceback.format_exc().splitlines():
                print(f"  {line}")
            failed += 1
        return fn

    return wrap


def stub(addr: str, compression=None):
    channel = grpc.insecure_channel(addr, compression=compression)
    return charges_pb2_grpc.ChargesStub(channel)


def create(s, key: str, user: str, compression=None, **fields):
    """The call's (message or None, code, details, initial metadata, trailing metadata)."""
    metadata = (("idempotency-key", key), ("x-user", user))
    try:
        message, call = s.Create.with_call(charges_pb2.CreateCharge(**fields), metadata=metadata, compression=compression, timeout=30)
        return message, grpc.StatusCode.OK, "", dict(call.initial_metadata()), dict(call.trailing_metadata())
    except grpc.RpcError as e:
        return None, e.code(), e.details(), dict(e.initial_metadata() or ()), dict(e.trailing_metadata() or ())


def replayed(answer) -> bool:
    # A trailers-only answer (the layer's own statuses) has one metadata frame, which grpcio
    # reports as trailing metadata.
    return (answer[3].get("idempotent-replayed") or answer[4].get("idempotent-replayed")) == "true"


def user(name: str) -> str:
    return f"py-grpc-{name}-{RUN}"


MODES = (("in_transaction", IN_TX), ("two_phase", TWO_PHASE))

# docs/rust-client.md's table, for the codes the issue names and two remembered ones.
RULES = (
    (grpc.StatusCode.CANCELLED, False),
    (grpc.StatusCode.DEADLINE_EXCEEDED, False),
    (grpc.StatusCode.UNKNOWN, False),
    (grpc.StatusCode.INTERNAL, False),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, False),
    (grpc.StatusCode.ABORTED, False),
    (grpc.StatusCode.UNAVAILABLE, False),
    (grpc.StatusCode.NOT_FOUND, True),
    (grpc.StatusCode.INVALID_ARGUMENT, True),
    (grpc.StatusCode.PERMISSION_DENIED, True),
)

for mode, addr in MODES:

    @check(f"{mode}: a retry replays the stored message")
    def _():
        s, u = stub(addr), user(f"replay-{mode}")
        first = create(s, "k-1", u, amount=5)
        again = create(s, "k-1", u, amount=5)
        assert first[1] == grpc.StatusCode.OK and not replayed(first), first
        assert again[1] == grpc.StatusCode.OK and replayed(again), again
        assert again[0] == first[0], (first, again)

    @check(f"{mode}: request compression (gzip, deflate) is the same request as none")
    def _():
        s, u = stub(addr), user(f"compress-{mode}")
        first = create(s, "k-1", u, compression=grpc.Compression.Gzip, amount=6, request_id="z" * 500)
        assert first[1] == grpc.StatusCode.OK and not replayed(first), first
        for compression in (None, grpc.Compression.Gzip, grpc.Compression.Deflate):
            again = create(s, "k-1", u, compression=compression, amount=6, request_id="z" * 500)
            assert again[1] == grpc.StatusCode.OK and replayed(again), (compression, again)
            assert again[0] == first[0], (compression, first, again)

    @check(f"{mode}: a channel that compresses everything gets decodable replays")
    def _():
        s, u = stub(addr, compression=grpc.Compression.Gzip), user(f"channel-gzip-{mode}")
        first = create(s, "k-1", u, amount=8)
        again = create(stub(addr), "k-1", u, amount=8)
        assert first[1] == grpc.StatusCode.OK and again[1] == grpc.StatusCode.OK and replayed(again), (first, again)
        assert again[0] == first[0]

    @check(f"{mode}: every code's rule (the first call returns it, the retry replays or runs afresh)")
    def _():
        s = stub(addr)
        for code, remembered in RULES:
            u = user(f"code{code.value[0]}-{mode}")
            first = create(s, "k-1", u, amount=1, fail_code=code.value[0])
            assert (first[1], first[2], replayed(first)) == (code, "failed after the write", False), (code, first)
            again = create(s, "k-1", u, amount=1, fail_code=code.value[0])
            assert again[1] == code, (code, again)
            assert replayed(again) == remembered, (code, remembered, again)

    @check(f"{mode}: a trailers-only error's ascii and -bin metadata and details replay intact")
    def _():
        s, u = stub(addr), user(f"metadata-{mode}")
        for attempt in range(2):
            answer = create(s, "k-1", u, amount=1, fail_code=grpc.StatusCode.NOT_FOUND.value[0], fail_metadata=True)
            trailing = answer[4]
            assert answer[1] == grpc.StatusCode.NOT_FOUND, answer
            assert trailing.get("x-reason") == "card-declined", (attempt, trailing)
            assert trailing.get("x-trace-bin") == bytes([0, 159, 255]), (attempt, trailing)
            assert trailing.get("grpc-status-details-bin") == FAIL_DETAILS, (attempt, trailing)
            assert replayed(answer) == (attempt == 1), (attempt, answer)

    @check(f"{mode}: the layer's own answers are gRPC statuses (mismatch, no key)")
    def _():
        s, u = stub(addr), user(f"own-{mode}")
        assert create(s, "k-1", u, amount=2)[1] == grpc.StatusCode.OK
        mismatch = create(s, "k-1", u, amount=3)
        assert mismatch[1] == grpc.StatusCode.INVALID_ARGUMENT, mismatch
        assert mismatch[3].get("idempotency-problem", mismatch[4].get("idempotency-problem")) == PROBLEM + "mismatch", mismatch
        try:
            s.Create(charges_pb2.CreateCharge(amount=2), metadata=(("x-user", u),), timeout=30)
            raise AssertionError("answered without a key")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e

for mode, addr in (("in_transaction", IN_TX_SMALL), ("two_phase", TWO_PHASE_SMALL)):

    @check(f"{mode}: an answer over the response limit is RESOURCE_EXHAUSTED, on the retry too")
    def _():
        s, u = stub(addr), user(f"limit-{mode}")
        for attempt in range(2):
            answer = create(s, "k-1", u, amount=3)
            problem = answer[3].get("idempotency-problem", answer[4].get("idempotency-problem"))
            assert (answer[1], problem) == (grpc.StatusCode.RESOURCE_EXHAUSTED, PROBLEM + "response-too-large"), (attempt, answer)
            assert replayed(answer) == (attempt == 1 and mode == "two_phase"), (attempt, answer)


def identity(b: bytes) -> bytes:
    return b


@check("health (a unary call, no key) passes the layer installed on every route")
def _():
    channel = grpc.insecure_channel(IN_TX)
    health = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=identity, response_deserializer=identity)
    # HealthCheckRequest{} is empty; HealthCheckResponse{status: SERVING} is field 1 = 1.
    assert health(b"", timeout=30) == b"\x08\x01"


@check("reflection (a streaming call, no key) passes the layer installed on every route")
def _():
    channel = grpc.insecure_channel(IN_TX)
    reflect = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", request_serializer=identity, response_deserializer=identity
    )
    # ServerReflectionRequest{list_services: ""}: field 7, an empty string.
    answers = reflect(iter([b"\x3a\x00"]), timeout=30)
    first = next(answers)
    assert b"grpc.health.v1.Health" in first, first


print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
