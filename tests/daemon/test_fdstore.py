"""The fd store's own rules, apart from systemd: what the daemon takes from
LISTEN_FDS, how stored names and records read back, and what it sends to
systemd within the store's budget. (The store through a real systemd is in
tests/packaging.)"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap

import msgspec
import pytest

from tests.helpers import fds_opened_since, open_fds
from wcached.daemon import fdstore
from wcached.daemon.fdstore import (
    FORMAT,
    FdStore,
    NotKept,
    StoredEntry,
    StoredModel,
    fd_name,
    group_by_model,
    parse_fd_name,
    read_record,
    write_record,
)
from wcached.keys import CacheKey
from wcached.loaders.checkpoint import FileStamp
from wcached.memory.host import REQUIRED_SEALS
from wcached.protocol.messages import Manifest, SegmentInfo

# -- LISTEN_FDS --------------------------------------------------------------

# In a process of its own: the passed fds must be numbered from 3.
_LISTEN = textwrap.dedent(
    """
    import fcntl, json, os, sys
    from wcached.daemon.fdstore import listen_fds
    case = json.loads(sys.argv[1])
    high = []
    for fd in range(3, 3 + case["fds"]):
        r, w = os.pipe()
        os.write(w, bytes([fd]))  # which fd it is, to read back
        high.append(fcntl.fcntl(r, fcntl.F_DUPFD, 100))
        os.close(r); os.close(w)
    for fd, h in enumerate(high, 3):
        os.dup2(h, fd)  # inheritable, as systemd passes them
        os.close(h)
    for fd in case.get("closed", []):
        os.close(fd)
    env = {k: v.replace("$PID", str(os.getpid())) for k, v in case["env"].items()}
    if case.get("environ"):
        os.environ.update(env)
        found = listen_fds()
        left = sorted(k for k in os.environ if k.startswith("LISTEN_"))
    else:
        found = listen_fds(env)
        left = sorted(env)
    print(json.dumps({
        "found": [[name, fd, os.read(fd, 1)[0], not os.get_inheritable(fd)] for name, fd in found],
        "left": left,
    }))
    """
)


def _listen(fds: int, env: dict[str, str], **case) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _LISTEN, json.dumps({"fds": fds, "env": env, **case})],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")},
    )
    return json.loads(out.stdout)


def _ours(count: str, names: str | None = None) -> dict[str, str]:
    env = {"LISTEN_PID": "$PID", "LISTEN_FDS": count}
    if names is not None:
        env["LISTEN_FDNAMES"] = names
    return env


ALL_GONE: list[str] = []


def test_passed_fds_come_with_their_names_close_on_exec_and_the_variables_go() -> None:
    got = _listen(3, _ours("3", "wcache1/m/manifest:wcache1/m/seg0:wcache1/m/seg1"))
    assert got == {
        "found": [
            ["wcache1/m/manifest", 3, 3, True],
            ["wcache1/m/seg0", 4, 4, True],
            ["wcache1/m/seg1", 5, 5, True],
        ],
        "left": ALL_GONE,
    }


def test_passed_fds_are_read_from_the_process_environment_by_default() -> None:
    got = _listen(2, _ours("2", "a:b"), environ=True)
    assert got == {"found": [["a", 3, 3, True], ["b", 4, 4, True]], "left": ALL_GONE}


def test_fds_without_names_are_unknown_as_sd_listen_fds_with_names_says() -> None:
    assert _listen(2, _ours("2", "a"))["found"] == [["a", 3, 3, True], ["unknown", 4, 4, True]]
    assert _listen(2, _ours("2"))["found"] == [["unknown", 3, 3, True], ["unknown", 4, 4, True]]


def test_one_passed_fd_is_taken() -> None:
    assert _listen(1, _ours("1", "a"))["found"] == [["a", 3, 3, True]]


def test_an_fd_closed_before_it_was_read_is_skipped_not_the_end() -> None:
    got = _listen(3, _ours("3", "a:b:c"), closed=[4])
    assert got["found"] == [["a", 3, 3, True], ["c", 5, 5, True]]


@pytest.mark.parametrize(
    "env",
    [
        {"LISTEN_PID": "1", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "a:b"},  # another process's
        {"LISTEN_PID": "$PID", "LISTEN_FDS": "0", "LISTEN_FDNAMES": ""},
        {"LISTEN_PID": "$PID", "LISTEN_FDS": "two", "LISTEN_FDNAMES": "a:b"},
        {"LISTEN_PID": "x", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "a:b"},
        {"LISTEN_FDS": "2", "LISTEN_FDNAMES": "a:b"},
    ],
    ids=["another-pid", "none", "bad-count", "bad-pid", "no-pid"],
)
def test_fds_not_passed_to_this_process_are_not_taken_and_the_variables_still_go(env) -> None:
    got = _listen(2, env)
    assert got == {"found": [], "left": ALL_GONE}


# -- names and records ------------------------------------------------------


@pytest.mark.parametrize("model", ["m", "org/llama:3.1_8b-it", "a b%c"])
def test_a_stored_name_gives_back_its_model_and_part(model: str) -> None:
    name = fd_name(model, "seg3")
    assert ":" not in name and name.count("/") == 2
    assert parse_fd_name(name) == (model, "seg3")


def test_a_stored_name_keeps_the_common_characters_of_model_names_as_they_are() -> None:
    assert fd_name("org/llama:3.1_8b-it", "manifest") == "wcache1/org%2Fllama%3A3.1_8b-it/manifest"


@pytest.mark.parametrize("name", ["other/m/seg0", "wcache1/m", "wcache1/m/seg0/x", "unknown"])
def test_names_of_others_are_not_ours(name: str) -> None:
    assert parse_fd_name(name) is None


def _record(model: str = "m", segments: int = 1) -> StoredModel:
    key = CacheKey(model=model, loader="safetensors", fingerprint="f", dtype="auto")
    manifest = Manifest(
        model=model,
        key=key,
        segments=[SegmentInfo(index=i, nbytes=4096, backend="host", device="cpu0") for i in range(segments)],
        tensors=[],
        total_bytes=4096 * segments,
        filled_at=1.0,
    )
    return StoredModel(
        format=FORMAT,
        daemon_version="0",
        instance="cpu0",
        config={"name": model},
        environment="",
        checkpoint=[FileStamp("/m/a.safetensors", 1, 2, 3, 4)],
        manifest=manifest,
        fill_seconds=1.5,
        phases={"read": 1.0},
        read_bytes=4096,
    )


def _memfd(data: bytes, size: int | None = None) -> int:
    fd = os.memfd_create("test-record", os.MFD_CLOEXEC)
    os.write(fd, data)
    if size is not None:
        os.ftruncate(fd, size)
    return fd


def test_a_record_reads_back_as_written_from_a_sealed_memfd() -> None:
    record = _record()
    fd = write_record(record)
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & (REQUIRED_SEALS | fcntl.F_SEAL_SEAL) == REQUIRED_SEALS | fcntl.F_SEAL_SEAL
        assert read_record(fd) == record
    finally:
        os.close(fd)


def test_a_record_that_cannot_be_sealed_leaves_no_fd(monkeypatch) -> None:
    before = open_fds()

    def refuse(*args):
        raise OSError("no seals here")

    monkeypatch.setattr(fdstore.fcntl, "fcntl", refuse)
    with pytest.raises(OSError, match="no seals here"):
        write_record(_record())
    assert fds_opened_since(before) == {}


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\xc1", r"^unreadable record: "),
        (msgspec.msgpack.encode([1, 2]), r"^unreadable record: "),
        (
            msgspec.msgpack.encode({"format": FORMAT + 1}),
            rf"^record format {FORMAT + 1}, this daemon reads {FORMAT}$",
        ),
        (msgspec.msgpack.encode({"flavour": 1}), rf"^record format None, this daemon reads {FORMAT}$"),
        (msgspec.msgpack.encode({"format": FORMAT, "manifest": 3}), r"^unreadable record: "),
    ],
    ids=["not-msgpack", "not-a-table", "another-format", "no-format", "wrong-fields"],
)
def test_a_record_that_is_not_usable_says_why(data: bytes, error: str) -> None:
    fd = _memfd(data)
    try:
        with pytest.raises(ValueError, match=error):
            read_record(fd)
    finally:
        os.close(fd)


def test_a_record_of_over_a_gibibyte_is_refused_unread() -> None:
    fd = _memfd(b"", size=(1 << 30) + 1)  # sparse: no memory is used
    try:
        with pytest.raises(ValueError, match=rf"^record of {(1 << 30) + 1} bytes$"):
            read_record(fd)
    finally:
        os.close(fd)


# -- what the store handed back, by model ------------------------------------


def test_stored_fds_are_grouped_by_model_and_the_rest_closed() -> None:
    names = [
        "wcache1/a/manifest",
        "other/x/seg0",  # not ours
        "wcache1/a/seg1",
        "wcache1/a/segx",  # not a part we make
        "wcache1/a/bad2",  # digits, but not after "seg"
        "wcache1/b/seg0",
        "other/x/seg0",  # the same unknown name again
        "wcache1/a/seg0",
        "wcache1/a/seg1",  # held twice
        "wcache1/b/manifest",
    ]
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in names]
    entries, unknown = group_by_model(list(zip(names, fds, strict=True)))
    try:
        assert unknown == ["other/x/seg0", "wcache1/a/segx", "wcache1/a/bad2"]
        assert sorted(entries) == ["a", "b"]
        a, b = entries["a"], entries["b"]
        assert (a.model, a.record_fd, a.segment_fds, a.duplicated) == (
            "a",
            fds[0],
            {1: fds[2], 0: fds[7]},
            "wcache1/a/seg1",
        )
        assert a.names == ["wcache1/a/manifest", "wcache1/a/seg1", "wcache1/a/seg0"]
        assert (b.model, b.record_fd, b.segment_fds, b.names) == (
            "b",
            fds[9],
            {0: fds[5]},
            ["wcache1/b/seg0", "wcache1/b/manifest"],
        )
        kept = {fds[i] for i in (0, 2, 5, 7, 9)}
        for fd in set(fds) - kept:
            with pytest.raises(OSError):
                os.fstat(fd)
    finally:
        for e in entries.values():
            e.close()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_stored_entry_closes_once_whatever_is_asked_again() -> None:
    before = open_fds()
    entry = StoredEntry("m", record_fd=os.open("/dev/null", os.O_RDONLY))
    entry.segment_fds = {0: os.open("/dev/null", os.O_RDONLY)}
    entry.close_record()
    assert entry.record_fd is None
    entry.close_record()
    entry.close()
    assert (entry.record_fd, entry.segment_fds) == (None, {})
    assert fds_opened_since(before) == {}
    entry.close()
    entry.close_record()
    assert fds_opened_since(before) == {}


# -- what is sent to systemd, within the budget -------------------------------


class FakeNotifier:
    """What the store sends to systemd, and which sends it refuses."""

    enabled = True

    def __init__(self, refuse: tuple[str, ...] = ()):
        self.sent: list[tuple[tuple[str, ...], int, object]] = []
        self.refuse = refuse

    def notify(self, *fields: str, fds=(), wait=False) -> bool:
        self.sent.append((fields, len(fds), wait))
        return not any(f"FDNAME={r}" in fields for r in self.refuse)


def test_a_model_is_stored_record_first_each_send_waited_for(monkeypatch) -> None:
    monkeypatch.delenv("FDSTORE", raising=False)
    notifier = FakeNotifier()
    store = FdStore(notifier, limit=3)  # type: ignore[arg-type]
    segs = [os.open("/dev/null", os.O_RDONLY) for _ in range(2)]
    before = open_fds()
    store.store(_record(segments=2), segs)
    assert notifier.sent == [
        (("FDSTORE=1", "FDNAME=wcache1/m/manifest"), 1, True),
        (("FDSTORE=1", "FDNAME=wcache1/m/seg0"), 1, True),
        (("FDSTORE=1", "FDNAME=wcache1/m/seg1"), 1, True),
    ]
    assert store.holds("m") and store.used == 3
    assert fds_opened_since(before) == {}  # the record's memfd is systemd's now, not ours
    # Stored again (a refill): the old entries leave first, waited for too.
    notifier.sent.clear()
    store.store(_record(segments=2), segs)
    assert notifier.sent[:3] == [
        (("FDSTOREREMOVE=1", "FDNAME=wcache1/m/manifest"), 0, True),
        (("FDSTOREREMOVE=1", "FDNAME=wcache1/m/seg0"), 0, True),
        (("FDSTOREREMOVE=1", "FDNAME=wcache1/m/seg1"), 0, True),
    ]
    assert store.used == 3
    for fd in segs:
        os.close(fd)


def test_a_model_that_does_not_fit_the_budget_is_not_stored_and_the_fix_is_named(monkeypatch) -> None:
    monkeypatch.delenv("FDSTORE", raising=False)
    notifier = FakeNotifier()
    store = FdStore(notifier, limit=2)  # type: ignore[arg-type]
    with pytest.raises(NotKept) as e:
        store.store(_record(segments=2), [0, 1])
    assert str(e.value) == (
        "it needs 3 fds in systemd's fd store (2 segments and a record), and 2 of the 2 the unit "
        'allows (FileDescriptorStoreMax=) are free; fix: segment_size = "1MiB" or larger for this '
        "model, or a drop-in with a larger FileDescriptorStoreMax= (systemctl edit wcached@<instance>)"
    )
    assert notifier.sent == [] and store.used == 0


def test_a_send_systemd_refuses_takes_back_what_was_sent(monkeypatch) -> None:
    monkeypatch.delenv("FDSTORE", raising=False)
    notifier = FakeNotifier(refuse=("wcache1/m/seg1",))
    store = FdStore(notifier, limit=10)  # type: ignore[arg-type]
    before = open_fds()
    segs = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]
    with pytest.raises(
        NotKept, match=r"^systemd's notify socket did not take wcache1/m/seg1 \(see the lines above\)$"
    ):
        store.store(_record(segments=3), segs)
    assert notifier.sent[3:] == [
        (("FDSTOREREMOVE=1", "FDNAME=wcache1/m/manifest"), 0, True),
        (("FDSTOREREMOVE=1", "FDNAME=wcache1/m/seg0"), 0, True),
    ]
    assert not store.holds("m") and store.used == 0
    for fd in segs:
        os.close(fd)
    assert fds_opened_since(before) == {}


def test_names_whose_removal_did_not_reach_systemd_stay_counted(monkeypatch) -> None:
    monkeypatch.delenv("FDSTORE", raising=False)
    notifier = FakeNotifier()
    store = FdStore(notifier, limit=10)  # type: ignore[arg-type]
    store.adopt("m", ["wcache1/m/manifest", "wcache1/m/seg0"])
    store.remove_model("unknown-model")
    assert notifier.sent == []
    notifier.refuse = ("wcache1/m/seg0",)
    store.remove_model("m")
    assert store.holds("m") and store.used == 1
    notifier.refuse = ()
    store.remove_model("m")
    assert not store.holds("m") and store.used == 0


@pytest.mark.parametrize(
    ("told", "limit", "expect"),
    [
        ("7", None, (7, "$FDSTORE")),
        (None, None, (4096, "FileDescriptorStoreMax=")),
        ("7", 5, (5, "FileDescriptorStoreMax=")),
        (None, 5, (5, "FileDescriptorStoreMax=")),
    ],
)
def test_the_budget_says_where_it_came_from(monkeypatch, told, limit, expect) -> None:
    if told is None:
        monkeypatch.delenv("FDSTORE", raising=False)
    else:
        monkeypatch.setenv("FDSTORE", told)
    store = FdStore(FakeNotifier(), limit=limit)  # type: ignore[arg-type]
    assert (store.limit, store.limit_source) == expect


@pytest.mark.parametrize(
    ("total", "free", "size"),
    [
        (64 << 30, 9, "8GiB"),  # 8 segments of exactly 8 GiB
        ((64 << 30) + 1, 9, "16GiB"),
        (100 << 20, 3, "64MiB"),  # 50 MiB a segment, rounded up to a power of two
        (3 << 20, 1, "4MiB"),  # no room beside the record: one segment
        (3 << 20, 0, "4MiB"),
        (10, 5, "1MiB"),  # never below a MiB
        (1 << 30, 2, "1GiB"),
    ],
)
def test_the_budget_fix_names_a_segment_size_that_fits(total: int, free: int, size: str) -> None:
    assert fdstore._budget_fix(total, free) == (
        f'fix: segment_size = "{size}" or larger for this model, or a drop-in with a larger '
        "FileDescriptorStoreMax= (systemctl edit wcached@<instance>)"
    )
