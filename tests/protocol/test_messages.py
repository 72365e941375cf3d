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
            msgspec.msgpack.encode({"type": "attach", "model": "m", "evil": 1}), type=Request
        )
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"type": "hello", "version": "1"}), type=Request)
    # A request type is not a reply and vice versa.
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode(Hello(version=1)), type=Reply)


def test_hello_and_replies_ignore_fields_a_later_release_adds() -> None:
    hello = {"type": "hello", "version": 3, "min_version": 2, "client": "c", "compression": "zstd"}
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(hello), type=Request) == Hello(
        version=3, min_version=2, client="c"
    )
    welcome = {"type": "welcome", "version": 2, "instance": "cpu0", "device": "d", "daemon_version": "9"}
    welcome |= {"pid": 1, "features": ["x"]}
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(welcome), type=Reply).version == 2
    raw = msgspec.to_builtins(Attached(manifest=MANIFEST, fd_count=1))
    raw["manifest"]["tensors"][0]["checksum"] = "abc"
    raw["manifest"]["key"]["epoch"] = 7
    raw["hint"] = "later"
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(raw), type=Reply) == Attached(
        manifest=MANIFEST, fd_count=1
    )


def test_a_hello_at_the_lowest_version_is_what_a_version_1_daemon_accepts() -> None:
    """Version-1 daemons decoded the hello strictly: the range's lower end
    must not appear on the wire when it is 1."""
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(Hello(version=1, client="c"))) == {
        "type": "hello",
        "version": 1,
        "client": "c",
    }


@pytest.mark.parametrize(
    ("client", "expect"),
    [((1, 1), 1), ((1, 2), 2), ((1, 3), 3), ((1, 9), 3), ((3, 9), 3), ((4, 9), None), ((2, 1), None)],
)
def test_daemon_picks_the_highest_version_both_speak(client: tuple[int, int], expect: int | None) -> None:
    from wcached.daemon.server import negotiate
    from wcached.errors import VersionMismatch

    hello = Hello(version=client[1], min_version=client[0])
    if expect is None:
        with pytest.raises(VersionMismatch, match=r"daemon speaks protocol 1\.\.3"):
            negotiate(hello)
    else:
        assert negotiate(hello) == expect
