from __future__ import annotations

import msgspec
import pytest

from wcached.keys import CacheKey
from wcached.protocol.messages import (
    Attach,
    Attached,
    ErrorReply,
    Hello,
    Manifest,
    Mismatch,
    Release,
    Released,
    Reply,
    Request,
    SegmentInfo,
    StatusRequest,
    TensorInfo,
    Welcome,
)

KEY = CacheKey(model="m", loader="safetensors", fingerprint="ab" * 32, dtype="auto", extra={"arch": "Llama"})
MANIFEST = Manifest(
    model="m",
    key=KEY,
    segments=[SegmentInfo(index=0, nbytes=4096, backend="host", device="cpu0")],
    tensors=[
        TensorInfo(name="w", dtype="bfloat16", shape=(2, 3), stride=(3, 1), segment=0, offset=0, nbytes=12),
        TensorInfo(
            name="t",
            dtype="bfloat16",
            shape=(2, 3),
            stride=(3, 1),
            segment=0,
            offset=0,
            nbytes=12,
            alias_of="w",
        ),
    ],
    total_bytes=12,
    filled_at=1.5,
)


@pytest.mark.parametrize(
    ("msg", "union"),
    [
        (Hello(version=1, client="x"), Request),
        (Attach(model="m", expect={"dtype": "auto", "tp_rank": 0}), Request),
        (StatusRequest(), Request),
        (Release(model="m"), Request),
        (Welcome(version=1, instance="cpu0", device="host memory", daemon_version="0.1.0", pid=3), Reply),
        (Attached(manifest=MANIFEST, fd_count=1), Reply),
        (Mismatch(model="m", fields=["dtype"], message="x"), Reply),
        (Released(model="m", attached_clients=2), Reply),
        (ErrorReply(code="bad_request", message="no"), Reply),
    ],
)
def test_round_trip(msg: object, union: object) -> None:
    raw = msgspec.msgpack.encode(msg)
    assert msgspec.msgpack.decode(raw, type=union) == msg


def test_unknown_tag_and_field_are_rejected() -> None:
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'shutdown'"):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"type": "shutdown"}), type=Request)
    with pytest.raises(msgspec.ValidationError, match="unknown field `evil`"):
        msgspec.msgpack.decode(
            msgspec.msgpack.encode({"type": "hello", "version": 1, "evil": 1}), type=Request
        )
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"type": "hello", "version": "1"}), type=Request)
    # A request type is not a reply and vice versa.
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode(Hello(version=1)), type=Reply)
