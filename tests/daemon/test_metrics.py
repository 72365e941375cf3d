"""Prometheus metrics of real daemons: the textfile, the loopback endpoint,
and the numbers in both against what the test did."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Daemon, start_daemon, tied_model_config, wait_ready
from wcached import __version__
from wcached.client import attach
from wcached.client.connection import DaemonConnection
from wcached.errors import EX_CONFIG, BadRequest, KeyMismatch, UnknownModel
from wcached.protocol.messages import Attach

ATTACH_RESULTS = ("ok", "mismatch", "unknown_model", "released", "bad_request", "timeout", "error")
ERROR_CODES = (
    "busy",
    "permission_denied",
    "protocol",
    "frame_too_large",
    "version_mismatch",
    "bad_request",
    "unknown_model",
    "released",
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, key
            out[key] = s.value
    return out


def _value(samples: Samples, name: str, instance: str, **labels: str) -> float:
    key = (name, tuple(sorted({"instance": instance, "gpu_uuid": "", **labels}.items())))
    return samples[key]


def _series(samples: Samples, name: str, instance: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of ``name`` for ``instance``, by its other labels."""
    out = {}
    for (n, labels), v in samples.items():
        d = dict(labels)
        if n == name and d.pop("instance") == instance:
            assert d.pop("gpu_uuid") == ""  # host memory: no GPU
            out[tuple(sorted(d.items()))] = v
    return out


def _attaches(samples: Samples, instance: str) -> dict[tuple[str, str], float]:
    return {
        (dict(k)["model"], dict(k)["result"]): v
        for k, v in _series(samples, "wcached_attaches_total", instance).items()
    }


def _errors(samples: Samples, instance: str) -> dict[str, float]:
    return {dict(k)["code"]: v for k, v in _series(samples, "wcached_errors_total", instance).items()}


def _zero_attaches(**counts: float) -> dict[tuple[str, str], float]:
    out = {(model, result): 0.0 for model in ("default", "") for result in ATTACH_RESULTS}
    for key, n in counts.items():
        model, result = key.split("__")
        out[(model, result)] = n
    return out


def _scrape(port: int, host: str = "127.0.0.1") -> str:
    # No proxy from the environment: the request must reach this host's port.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{host}:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def _textfile(d: Path, instance: str) -> str:
    return (d / f"wcached-{instance}.prom").read_text()


def _until(read: Callable[[], Samples], done: Callable[[Samples], bool], timeout: float = 10) -> Samples:
    """The metrics once ``done`` holds (the textfile follows changes within
    about a second); the last ones read otherwise, for the asserts to show."""
    deadline = time.monotonic() + timeout
    while True:
        samples = read()
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def _free_port_pair() -> int:
    """A port P with P + 1 free as well (two instances: base + index)."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two adjacent free ports")


def _config(work: Path, ckpt: Path, **daemon: object) -> Path:
    return tied_model_config(work, ckpt, "64KiB", connection_timeout_s=2.0, **daemon)


def _up(cfg: Path, *instances: str, **kw: object) -> list[Daemon]:
    daemons = [start_daemon(cfg, i, **kw) for i in instances]
    try:
        for d in daemons:
            wait_ready(d, 60)
    except BaseException:
        for d in daemons:
            d.stop(signal.SIGKILL)
            d.notify.close()
        raise
    return daemons


def _down(daemons: list[Daemon]) -> None:
    for d in daemons:
        if d.proc.poll() is None:
            d.stop(signal.SIGKILL)
        d.notify.close()


def test_textfile_and_endpoint_count_what_clients_did(work: Path, sharded_ckpt: Path) -> None:
    metrics_dir = work / "metrics"
    metrics_dir.mkdir()
    port = _free_port_pair()
    cfg = _config(work, sharded_ckpt, metrics_dir=str(metrics_dir), metrics_port=port)
    daemons = _up(cfg, "cpu0", "cpu1")
    d0 = daemons[0]
    held = []
    try:
        # Written before READY: at once what was filled, nothing counted yet.
        first = _samples(_textfile(metrics_dir, "cpu0"))
        assert "_created" not in _textfile(metrics_dir, "cpu0")  # no timestamp series per counter
        ref = attach("default", "cpu0", socket_dir=d0.socket_dir, keep_lease=False)
        held.append(ref)
        m = ref.manifest
        assert _value(first, "wcached_up", "cpu0") == 1
        assert _value(first, "wcached_build_info", "cpu0", version=__version__) == 1
        assert _value(first, "wcached_model_resident_bytes", "cpu0", model="default") == m.total_bytes
        assert _value(first, "wcached_model_tensors", "cpu0", model="default") == len(m.tensors)
        assert _value(first, "wcached_model_segments", "cpu0", model="default") == len(m.segments) > 1
        assert _value(first, "wcached_model_ready", "cpu0", model="default") == 1
        assert _value(first, "wcached_leases", "cpu0", model="default") == 0
        assert _value(first, "wcached_fill_read_bytes_total", "cpu0", model="default") == m.total_bytes
        assert _value(first, "wcached_restores_total", "cpu0", model="default") == 0
        assert _value(first, "wcached_fill_seconds", "cpu0", model="default") > 0
        reading = _value(first, "wcached_fill_reading_seconds", "cpu0", model="default")
        assert 0 < reading < _value(first, "wcached_fill_seconds", "cpu0", model="default")
        assert _attaches(first, "cpu0") == _zero_attaches()
        assert _errors(first, "cpu0") == dict.fromkeys(ERROR_CODES, 0.0)

        # cpu0: two leases (ref and one more), a mismatch, an unknown model,
        # a bad request, a status query (no lease); cpu1: nothing.
        held.append(attach("default", "cpu0", socket_dir=d0.socket_dir, keep_lease=False))
        with pytest.raises(KeyMismatch):
            attach("default", "cpu0", socket_dir=d0.socket_dir, expect={"dtype": "float16"})
        with pytest.raises(UnknownModel):
            attach("ghost-of-a-model", "cpu0", socket_dir=d0.socket_dir)
        with DaemonConnection(d0.socket_path) as conn:
            with pytest.raises(BadRequest):
                conn.request(Attach(model="default", expect={"colour": "blue"}))
            assert len(conn.status().clients) == 2

        expected = _zero_attaches(
            default__ok=2, default__mismatch=1, default__bad_request=1, __unknown_model=1
        )
        errors = {**dict.fromkeys(ERROR_CODES, 0.0), "unknown_model": 1.0, "bad_request": 1.0}

        def settled(s: Samples) -> bool:
            return _attaches(s, "cpu0") == expected and _errors(s, "cpu0") == errors

        text = _until(lambda: _samples(_textfile(metrics_dir, "cpu0")), settled)
        # A connection that never sends a request holds up no scrape.
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)
        http = _samples(_scrape(port))
        silent.close()
        for samples in (text, http):
            assert _attaches(samples, "cpu0") == expected
            assert _errors(samples, "cpu0") == errors
            assert _value(samples, "wcached_leases", "cpu0", model="default") == 2
            assert _value(samples, "wcached_up", "cpu0") == 1
            # The client's name for an unknown model is in no label.
            assert not any("ghost" in repr(key) for key in samples)
            # The first file's gauges still hold.
            for name in ("wcached_model_resident_bytes", "wcached_fill_read_bytes_total"):
                assert _value(samples, name, "cpu0", model="default") == m.total_bytes
        # Each endpoint and file is its instance's only.
        assert {dict(k)["instance"] for _, k in http} == {"cpu0"}

        # cpu1 on the base port + 1, its own registry: nothing counted there.
        for samples in (_samples(_scrape(port + 1)), _samples(_textfile(metrics_dir, "cpu1"))):
            assert {dict(k)["instance"] for _, k in samples} == {"cpu1"}
            assert _attaches(samples, "cpu1") == _zero_attaches()
            assert _errors(samples, "cpu1") == dict.fromkeys(ERROR_CODES, 0.0)
            assert _value(samples, "wcached_leases", "cpu1", model="default") == 0
            assert _value(samples, "wcached_model_resident_bytes", "cpu1", model="default") == m.total_bytes

        # A lease ends; then the model is released: the daemon holds nothing.
        held.pop().close()
        r = subprocess.run(
            [sys.executable, "-m", "wcached", "release", "cpu0", "--model", "default", "--config", str(cfg)],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr

        def released(s: Samples) -> bool:
            return _value(s, "wcached_model_ready", "cpu0", model="default") == 0

        text = _until(lambda: _samples(_textfile(metrics_dir, "cpu0")), released)
        for samples in (text, _samples(_scrape(port))):
            assert _value(samples, "wcached_model_ready", "cpu0", model="default") == 0
            assert _value(samples, "wcached_model_resident_bytes", "cpu0", model="default") == 0
            assert _value(samples, "wcached_leases", "cpu0", model="default") == 1
            assert _value(samples, "wcached_model_tensors", "cpu0", model="default") == len(m.tensors)
        # cpu1 still serves its own.
        cpu1 = _samples(_textfile(metrics_dir, "cpu1"))
        assert _value(cpu1, "wcached_model_ready", "cpu1", model="default") == 1

        # A clean stop takes the file along: a stale one would say "up".
        for d in daemons:
            assert d.stop() == 0
        assert sorted(os.listdir(metrics_dir)) == []
        with pytest.raises(OSError):
            _scrape(port)
    finally:
        for a in held:
            a.close()
        _down(daemons)


def _other_address() -> str | None:
    """An IPv4 address of this host other than loopback, if it has one."""
    found = set()
    try:
        found |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except OSError:
        pass
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=10).stdout
        found |= {word.split("/")[0] for line in out.splitlines() for word in line.split()[3:4]}
    except (OSError, subprocess.SubprocessError):
        pass
    others = sorted(a for a in found if not a.startswith("127."))
    return others[0] if others else None


def _listening_addresses(port: int) -> list[str]:
    """The local addresses of the sockets listening on ``port`` (the kernel's
    own table: true on hosts with only loopback too)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.append(address)
    return found


def test_endpoint_listens_on_loopback_only(work: Path, sharded_ckpt: Path) -> None:
    port = _free_port_pair()
    (d,) = _up(_config(work, sharded_ckpt, metrics_port=port), "cpu0")
    try:
        assert _value(_samples(_scrape(port)), "wcached_up", "cpu0") == 1
        # 127.0.0.1, little-endian hex, and nothing else.
        assert _listening_addresses(port) == ["0100007F"]
        other = _other_address()
        if other is not None:
            with pytest.raises(ConnectionRefusedError), socket.create_connection((other, port), timeout=5):
                pass
        assert d.stop() == 0
    finally:
        _down([d])


def test_silent_scrapers_cannot_pile_up_threads_and_are_cut_off(work: Path, sharded_ckpt: Path) -> None:
    """A local user opening connections without end gets MAX_SCRAPES served at
    a time and each cut off at the request deadline; the daemon's threads stay
    bounded and scrapes work again afterwards."""
    from wcached.daemon.metrics import MAX_SCRAPES, REQUEST_DEADLINE_S

    port = _free_port_pair()
    (d,) = _up(_config(work, sharded_ckpt, metrics_port=port), "cpu0")
    silent: list[socket.socket] = []
    try:
        threads_before = len(os.listdir(f"/proc/{d.proc.pid}/task"))
        for _ in range(60):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"G")  # a request begun and never finished
            silent.append(s)
        time.sleep(0.5)
        threads = len(os.listdir(f"/proc/{d.proc.pid}/task"))
        # A thread and a deadline timer per served scrape, at most.
        assert threads - threads_before <= 2 * MAX_SCRAPES, (threads_before, threads)
        started = time.monotonic()
        for s in silent[:MAX_SCRAPES]:
            s.settimeout(REQUEST_DEADLINE_S + 5)
            assert s.recv(1) == b""  # closed by the daemon, unanswered
        assert time.monotonic() - started < REQUEST_DEADLINE_S + 5
        # Their slots come back as their threads end (a moment after the cut).
        deadline = time.monotonic() + 5
        while True:
            try:
                assert _value(_samples(_scrape(port)), "wcached_up", "cpu0") == 1
                break
            except (ConnectionError, http.client.HTTPException):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert d.stop() == 0
    finally:
        for s in silent:
            s.close()
        _down([d])


@pytest.mark.parametrize("where", ["daemon", "instance"])
def test_port_in_use_exits_78_naming_the_key_before_filling(work: Path, where: str) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    # A checkpoint that is not there: a fill would end in 69, not 78.
    missing = work / "not-there"
    if where == "daemon":
        # cpu1: the base port + 1 is the one taken.
        cfg = _config(work, missing, metrics_port=port - 1)
        instance, key = "cpu1", "daemon.metrics_port"
    else:
        cfg = _config(work, missing, metrics_port=port + 1000 if port < 60000 else port - 1000)
        cfg.write_text(cfg.read_text() + f'\n[instance."cpu0"]\nmetrics_port = {port}\n')
        instance, key = "cpu0", "instance.cpu0.metrics_port"
    try:
        d = start_daemon(cfg, instance)
        rc = d.proc.wait(30)
        log = d.log()
        d.notify.close()
    finally:
        taken.close()
    assert rc == EX_CONFIG, log
    assert key in log and f"127.0.0.1:{port} is already in use" in log and str(cfg) in log, log
    assert "loader worker" not in log and "does not exist" not in log, log
    assert not any(msg.startswith("READY=1") for msg in d.notify.messages)


def test_metrics_dir_that_cannot_be_written_exits_78_before_filling(work: Path) -> None:
    cfg = _config(work, work / "not-there", metrics_dir=str(work / "no-such-dir"))
    d = start_daemon(cfg)
    rc = d.proc.wait(30)
    log = d.log()
    d.notify.close()
    assert rc == EX_CONFIG, log
    assert "daemon.metrics_dir" in log and str(work / "no-such-dir") in log, log
    assert "does not exist or is not a directory" in log and "loader worker" not in log, log


def test_restored_model_counts_a_restore_and_no_bytes_read(work: Path, sharded_ckpt: Path) -> None:
    metrics_dir = work / "metrics"
    metrics_dir.mkdir()
    cfg = _config(work, sharded_ckpt, metrics_dir=str(metrics_dir))
    (first,) = _up(cfg, "cpu0")
    try:
        with DaemonConnection(first.socket_path) as conn:
            (filled,) = conn.status().models
        before = _samples(_textfile(metrics_dir, "cpu0"))
        assert _value(before, "wcached_restores_total", "cpu0", model="default") == 0
        assert _value(before, "wcached_fill_read_bytes_total", "cpu0", model="default") == filled.bytes
        first.notify.drain()
        first.stop(signal.SIGKILL)  # no cleanup: its file stays, saying up
        first.notify.close(keep_store=True)
        assert _value(_samples(_textfile(metrics_dir, "cpu0")), "wcached_up", "cpu0") == 1
        second = start_daemon(cfg, store_from=first.notify)
    except BaseException:
        _down([first])
        raise
    try:
        wait_ready(second, 60)
        assert "restored default from the fd store" in second.log()
        after = _samples(_textfile(metrics_dir, "cpu0"))
        assert _value(after, "wcached_restores_total", "cpu0", model="default") == 1
        assert _value(after, "wcached_fill_read_bytes_total", "cpu0", model="default") == 0
        assert _value(after, "wcached_model_resident_bytes", "cpu0", model="default") == filled.bytes
        assert _value(after, "wcached_fill_seconds", "cpu0", model="default") == pytest.approx(
            filled.fill_seconds
        )
        assert second.stop() == 0
        assert not (metrics_dir / "wcached-cpu0.prom").exists()
    finally:
        _down([second])


def test_textfile_is_readable_by_others_under_the_units_umask(work: Path, sharded_ckpt: Path) -> None:
    """node-exporter runs as another user, and the unit has UMask=0027."""
    metrics_dir = work / "metrics"
    metrics_dir.mkdir()
    cfg = _config(work, sharded_ckpt, metrics_dir=str(metrics_dir))
    old = os.umask(0o027)  # inherited by the daemon
    try:
        d = start_daemon(cfg)
    finally:
        os.umask(old)
    try:
        wait_ready(d, 60)
        prom = metrics_dir / "wcached-cpu0.prom"
        assert prom.stat().st_mode & 0o777 == 0o644
        assert [p.name for p in metrics_dir.iterdir()] == [prom.name]  # no temporary left behind
        assert _value(_samples(prom.read_text()), "wcached_up", "cpu0") == 1
    finally:
        _down([d])


def test_metrics_off_imports_no_prometheus_client() -> None:
    """Off by default, and then free: a restored restart pays no import."""
    code = (
        "import sys, wcached.daemon.service, wcached.daemon.server\n"
        "assert not {'prometheus_client', 'wsgiref.simple_server'} & set(sys.modules), sorted(sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_textfile_left_by_a_killed_daemon_is_gone_while_the_next_one_fills(
    work: Path, sharded_ckpt: Path
) -> None:
    """A daemon killed with SIGKILL leaves its file saying it is up; the next
    start removes it before filling, so no dashboard shows an instance up
    (with the dead one's numbers) while it is still filling, and writes its
    own once it serves."""
    started, go = work / "worker-started", work / "worker-go"
    wrapper = work / "gated-python"
    wrapper.write_text(
        f'#!/bin/sh\ntouch {started}\nwhile [ ! -e {go} ]; do sleep 0.02; done\nexec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    go.touch()
    metrics_dir = work / "metrics"
    metrics_dir.mkdir()
    prom = metrics_dir / "wcached-cpu0.prom"
    cfg = _config(work, sharded_ckpt, metrics_dir=str(metrics_dir), worker_python=str(wrapper))
    (first,) = _up(cfg, "cpu0")
    with attach("default", "cpu0", socket_dir=first.socket_dir, keep_lease=False):
        pass
    _until(
        lambda: _samples(prom.read_text()),
        lambda s: _attaches(s, "cpu0")[("default", "ok")] == 1,
    )
    _down([first])  # SIGKILL: no cleanup
    stale = prom.read_text()
    assert _value(_samples(stale), "wcached_up", "cpu0") == 1
    assert _attaches(_samples(stale), "cpu0")[("default", "ok")] == 1
    go.unlink()
    started.unlink()
    second = start_daemon(cfg)
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert second.proc.poll() is None and time.monotonic() < deadline, second.log()
            time.sleep(0.02)
        # Filling (the worker waits for its go): the dead daemon's file is gone.
        assert not prom.exists(), prom.read_text()
        go.touch()
        wait_ready(second, 60)
        now = _samples(prom.read_text())
        assert _value(now, "wcached_up", "cpu0") == 1
        assert _attaches(now, "cpu0") == _zero_attaches()
    finally:
        _down([second])


def test_a_reader_of_the_textfile_never_sees_half_a_rewrite(work: Path, sharded_ckpt: Path) -> None:
    """node-exporter may read the file at any moment: every read, however
    it falls against the daemon's rewrites, is a whole exposition, and a
    reader that opened the file before a rewrite goes on reading the whole
    file it opened (a rewrite is a new file renamed into place)."""
    import threading

    metrics_dir = work / "metrics"
    metrics_dir.mkdir()
    prom = metrics_dir / "wcached-cpu0.prom"
    cfg = _config(work, sharded_ckpt, metrics_dir=str(metrics_dir))
    (d,) = _up(cfg, "cpu0")
    stop = threading.Event()
    attached = 0

    def attach_often() -> None:
        nonlocal attached
        while not stop.is_set():
            with attach("default", "cpu0", socket_dir=d.socket_dir, keep_lease=False):
                attached += 1
            time.sleep(0.02)

    held = open(prom, "rb")
    try:
        first = held.read()
        assert _value(_samples(first.decode()), "wcached_up", "cpu0") == 1
        t = threading.Thread(target=attach_often)
        t.start()
        reads, seen = 0, set()
        try:
            # Reads for 3 s, and on until several rewrites fell within them
            # (a loaded machine attaches less often), for at most 60 s.
            start = time.monotonic()
            while time.monotonic() < start + 3 or not (attached > 5 and len(seen) >= 3):
                assert time.monotonic() < start + 60, (attached, sorted(seen), reads)
                text = prom.read_text()
                reads += 1
                assert text.endswith("\n"), text[-200:]
                samples = _samples(text)
                assert _value(samples, "wcached_up", "cpu0") == 1, text
                seen.add(_attaches(samples, "cpu0")[("default", "ok")])
        finally:
            stop.set()
            t.join(30)
        # Several rewrites fell within the reads.
        assert attached > 5 and len(seen) >= 3, (attached, sorted(seen), reads)
        held.seek(0)
        assert held.read() == first
        assert os.fstat(held.fileno()).st_nlink == 0  # replaced, not written over
    finally:
        held.close()
        _down([d])


# -- the registry, the textfile and the endpoint, in this process ----------------


def _status(state: str = "serving", models=(), clients=()):
    from wcached.protocol.messages import StatusReply

    return StatusReply(
        instance="cpu7",
        device="host memory",
        backend="host",
        state=state,
        pid=1,
        daemon_version=__version__,
        uptime_s=1.0,
        models=list(models),
        clients=list(clients),
    )


def _model(name: str, **fields):
    from wcached.keys import CacheKey
    from wcached.protocol.messages import ModelStatus

    values = dict(
        state="ready",
        loader="safetensors",
        bytes=1000,
        tensors=3,
        segments=2,
        filled_at=0.0,
        fill_seconds=2.5,
    )
    values.update(fields)
    key = CacheKey(model=name, loader="safetensors", fingerprint="f", dtype="auto")
    return ModelStatus(name=name, key=key, **values)


def _client(*models: str):
    from wcached.protocol.messages import ClientStatus

    return ClientStatus(pid=2, uid=0, gid=0, client="engine", models=list(models), connected_s=1.0)


def _by_model(samples: Samples, name: str) -> dict[str, float]:
    return {dict(k)["model"]: v for k, v in _series(samples, name, "cpu7").items()}


def test_every_counter_series_is_there_at_zero_and_client_names_never_become_labels() -> None:
    """Attach series for every configured model (and '' for any other name)
    by every result, error series for every code, all at 0 before anything
    happened; a model or result the instance does not know counts as ''
    and "error"; an error code not foreseen gets its series when first sent."""
    from wcached.daemon.metrics import Metrics

    m = Metrics("cpu7", "", ["b", "a"])
    samples = _samples(m.exposition().decode())
    attaches = _series(samples, "wcached_attaches_total", "cpu7")
    expected = {(("model", mo), ("result", r)) for mo in ("a", "b", "") for r in ATTACH_RESULTS}
    assert set(attaches) == expected and set(attaches.values()) == {0.0}
    errors = _series(samples, "wcached_errors_total", "cpu7")
    assert errors == {(("code", c),): 0.0 for c in ERROR_CODES}
    assert not any(name.endswith("_created") for name, _ in samples)
    m.count_attach("a", "ok")
    m.count_attach("a", "ok")
    m.count_attach("someone's secret model", "ok")
    m.count_attach("b", "no such result")
    m.count_error("busy")
    m.count_error("brand_new")
    m.count_error("brand_new")
    samples = _samples(m.exposition().decode())
    attaches = _series(samples, "wcached_attaches_total", "cpu7")
    counted = {k: v for k, v in attaches.items() if v}
    assert counted == {
        (("model", "a"), ("result", "ok")): 2.0,
        (("model", ""), ("result", "ok")): 1.0,
        (("model", "b"), ("result", "error")): 1.0,
    }
    assert len(attaches) == len(expected)
    errors = _series(samples, "wcached_errors_total", "cpu7")
    assert {k: v for k, v in errors.items() if v} == {(("code", "busy"),): 1.0, (("code", "brand_new"),): 2.0}


def test_an_instance_is_down_until_it_serves_and_says_its_release() -> None:
    from wcached.daemon.metrics import Metrics

    m = Metrics("cpu7", "", ["a"])
    samples = _samples(m.exposition().decode())
    assert _value(samples, "wcached_build_info", "cpu7", version=__version__) == 1.0
    assert _value(samples, "wcached_up", "cpu7") == 0.0
    assert not _series(samples, "wcached_model_ready", "cpu7")  # no status: no model gauges
    for state, up in (("starting", 0.0), ("filling", 0.0), ("serving", 1.0)):
        m.watch(lambda state=state: _status(state))
        assert _value(_samples(m.exposition().decode()), "wcached_up", "cpu7") == up, state


def test_model_gauges_are_read_from_the_status_when_scraped() -> None:
    """Resident bytes and ready only while held; leases by the clients that
    map each model; the fill's seconds, its reading seconds where it timed
    them, the bytes it read (the checkpoint's where counted, else the
    model's; none for a restored model) and restores."""
    from wcached.daemon.metrics import Metrics

    m = Metrics("cpu7", "", ["held", "gone", "restored", "untimed"])
    models = [
        _model("held", phases={"read": 4.0, "copy": 1.0}, read_bytes=8000),
        _model("gone", state="released", bytes=500),
        _model("restored", origin="restored", phases={"read": 3.0}, read_bytes=7000),
        _model("untimed", bytes=1234),
    ]
    clients = [_client("held"), _client("held", "gone"), _client()]
    m.watch(lambda: _status(models=models, clients=clients))
    s = _samples(m.exposition().decode())
    names = ("held", "gone", "restored", "untimed")
    expected = {
        "wcached_model_resident_bytes": (1000, 0, 1000, 1234),
        "wcached_model_ready": (1, 0, 1, 1),
        "wcached_model_tensors": (3, 3, 3, 3),
        "wcached_model_segments": (2, 2, 2, 2),
        "wcached_leases": (2, 1, 0, 0),
        "wcached_fill_seconds": (2.5, 2.5, 2.5, 2.5),
        "wcached_fill_read_bytes_total": (8000, 500, 0, 1234),
        "wcached_restores_total": (0, 0, 1, 0),
    }
    for name, values in expected.items():
        assert _by_model(s, name) == dict(zip(names, values, strict=True)), name
    assert _by_model(s, "wcached_fill_reading_seconds") == {"held": 4.0}


def test_a_gpu_instance_labels_its_uuid_and_host_memory_none() -> None:
    from wcached.daemon.metrics import Metrics
    from wcached.device import Device

    gpu = Metrics.for_device(Device("cuda", "GPU-1234", 0, "H200"), ["a"])
    assert (gpu.instance_id, gpu.gpu_uuid) == ("GPU-1234", "GPU-1234")
    host = Metrics.for_device(Device("cpu", "cpu3", 3, "host memory"), ["a"])
    assert (host.instance_id, host.gpu_uuid) == ("cpu3", "")
    text = gpu.exposition().decode()
    assert 'wcached_up{gpu_uuid="GPU-1234",instance="GPU-1234"} 0.0' in text


def test_metrics_are_made_only_where_the_instance_exports_them() -> None:
    from types import SimpleNamespace

    from wcached.daemon.metrics import Metrics, NoMetrics, metrics_for
    from wcached.device import Device

    device = Device("cpu", "cpu0", 0, "host memory")
    models = [SimpleNamespace(name="a"), SimpleNamespace(name="b")]
    off = metrics_for(SimpleNamespace(metrics_dir="", metrics_port=0, models=models), device)
    assert type(off) is NoMetrics
    for where in ({"metrics_dir": "/x", "metrics_port": 0}, {"metrics_dir": "", "metrics_port": 9400}):
        on = metrics_for(SimpleNamespace(models=models, **where), device)
        assert isinstance(on, Metrics), where
        on.count_attach("b", "ok")
        attaches = _series(_samples(on.exposition().decode()), "wcached_attaches_total", "cpu0")
        assert attaches[(("model", "b"), ("result", "ok"))] == 1.0


def test_the_textfile_is_replaced_whole_readable_by_others_and_leaves_nothing_beside_it(
    work: Path, monkeypatch
) -> None:
    from wcached.daemon.metrics import TEXTFILE_MODE, Metrics, remove_textfile

    m = Metrics("cpu7", "", ["a"])
    path = work / "wcached-cpu7.prom"
    path.write_text("stale\n")
    old = os.umask(0o077)
    try:
        m.write_textfile(str(path))
    finally:
        os.umask(old)
    assert path.read_bytes() == m.exposition()
    assert path.stat().st_mode & 0o777 == TEXTFILE_MODE
    # Written beside it and renamed there (a rename within one directory is
    # atomic; across file systems it is no rename at all).
    renames = []
    real_replace = os.replace

    def recording(src, dst):
        renames.append((os.path.dirname(src), os.path.basename(src), dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording)
    m.write_textfile(str(path))
    monkeypatch.undo()
    ((where, name, dst),) = renames
    assert (where, dst) == (str(work), str(path))
    assert not name.endswith(".prom")  # the textfile collector reads *.prom only
    assert sorted(p.name for p in work.iterdir()) == [path.name]
    # A name without a directory is written in the current one.
    monkeypatch.chdir(work)
    m.write_textfile("here.prom")
    assert (work / "here.prom").read_bytes() == m.exposition()
    # A rename that fails leaves the old file and no temporary.
    before = path.read_bytes()

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError) as e:
        m.write_textfile(str(path))
    assert e.value.errno == 28
    # Nor does an unlink that fails as well hide why the write failed.
    real_unlink = os.unlink

    def unlink_fails(p):
        real_unlink(p)
        raise FileNotFoundError(p)

    monkeypatch.setattr(os, "unlink", unlink_fails)
    with pytest.raises(OSError) as e:
        m.write_textfile(str(path))
    assert e.value.errno == 28
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in work.iterdir()) == ["here.prom", path.name]
    remove_textfile(str(path))
    remove_textfile(str(path))  # gone already: nothing to do
    assert not path.exists()


def test_a_metrics_dir_that_cannot_be_written_is_a_config_error_naming_key_and_fix(
    work: Path, monkeypatch
) -> None:
    from wcached.daemon.metrics import check_metrics_dir
    from wcached.errors import ConfigError

    check_metrics_dir(str(work), "/etc/wcache/wcached.toml")
    missing = work / "nope"
    with pytest.raises(ConfigError) as e:
        check_metrics_dir(str(missing), "/etc/wcache/wcached.toml")
    assert str(e.value) == (
        f"/etc/wcache/wcached.toml: key 'daemon.metrics_dir': {missing} does not exist or is not a directory"
    )
    (work / "file").write_text("")
    with pytest.raises(ConfigError) as e:
        check_metrics_dir(str(work / "file"), "")
    assert str(e.value).startswith("<config>: key 'daemon.metrics_dir': ")
    asked = []

    def no_write(path, mode):
        asked.append(mode)
        return False

    monkeypatch.setattr(os, "access", no_write)
    with pytest.raises(ConfigError) as e:
        check_metrics_dir(str(work), "w.toml")
    assert str(e.value) == (
        f"w.toml: key 'daemon.metrics_dir': {work} is not writable by uid {os.geteuid()} (under the unit, "
        f"which sees a read-only file system, add a drop-in with ReadWritePaths={work})"
    )
    assert asked == [os.W_OK | os.X_OK]


def test_the_endpoint_answers_once_started_and_a_port_it_cannot_take_is_a_config_error(
    monkeypatch,
) -> None:
    import errno as errno_
    import wsgiref.simple_server

    from wcached.daemon.metrics import Metrics, MetricsEndpoint
    from wcached.errors import ConfigError

    m = Metrics("cpu7", "", ["a"])
    ep = MetricsEndpoint(0, m, "c.toml", "daemon.metrics_port")
    port = ep.port
    assert ep._httpd.server_address == ("127.0.0.1", port) and port > 0
    ep.start()
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert _value(_samples(body.decode()), "wcached_up", "cpu7") == 0.0
        with pytest.raises(ConfigError) as e:
            MetricsEndpoint(port, m, "c.toml", "daemon.metrics_port")
        assert str(e.value) == (
            f"c.toml: key 'daemon.metrics_port': 127.0.0.1:{port} is already in use "
            "(another instance or service listens there)"
        )
    finally:
        ep.close()
    ep.close()  # a second close does nothing (and does not wait for a server gone)
    MetricsEndpoint(0, m, "", "daemon.metrics_port").close()  # closed unstarted

    def unreachable(*args, **kwargs):
        raise OSError(errno_.EADDRNOTAVAIL, "Cannot assign requested address")

    monkeypatch.setattr(wsgiref.simple_server, "make_server", unreachable)
    with pytest.raises(ConfigError) as e:
        MetricsEndpoint(9400, m, "", "daemon.metrics_port")
    assert str(e.value) == (
        "<config>: key 'daemon.metrics_port': cannot listen on 127.0.0.1:9400: "
        "Cannot assign requested address"
    )


def test_a_scrape_that_never_finishes_its_request_is_cut_off_at_the_deadline(monkeypatch) -> None:
    import wcached.daemon.metrics as metrics

    monkeypatch.setattr(metrics, "REQUEST_DEADLINE_S", 0.5)
    ep = metrics.MetricsEndpoint(0, metrics.Metrics("cpu7", "", []), "", "daemon.metrics_port")
    ep.start()
    try:
        with socket.create_connection(("127.0.0.1", ep.port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
            started = time.monotonic()
            assert s.recv(1) == b""  # closed by the server
            assert 0.3 < time.monotonic() - started < 5
    finally:
        ep.close()


def test_the_documented_metrics_are_the_exported_ones() -> None:
    """docs/operations.md's table names every series the registry exports,
    with its type and labels (instance and gpu_uuid on all), and nothing else."""
    import re

    from wcached.daemon.metrics import Metrics

    documented: dict[str, tuple[str, frozenset[str]]] = {}
    table = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    for row in re.findall(r"^\| (`wcached_.*?) \| (\w+) \|", table, re.M):
        for name, labels in re.findall(r"`(wcached_\w+)(?:\{([^}]*)\})?`", row[0]):
            documented[name] = (row[1], frozenset(filter(None, labels.split(","))))
    m = Metrics("cpu7", "", ["m"])
    m.watch(lambda: _status(models=[_model("m", phases={"read": 1.0}, read_bytes=10)]))
    exported: dict[str, tuple[str, frozenset[str]]] = {}
    for family in text_string_to_metric_families(m.exposition().decode()):
        for s in family.samples:
            assert {"instance", "gpu_uuid"} <= set(s.labels), s
            exported[s.name] = (family.type, frozenset(s.labels) - {"instance", "gpu_uuid"})
    assert len(documented) >= 13
    assert exported == documented


def test_an_endpoint_never_closed_does_not_keep_its_process_alive(work: Path) -> None:
    """A daemon that ends without closing the endpoint (an exception on the
    way out) still exits: the serving thread does not hold it."""
    code = (
        "from wcached.daemon.metrics import Metrics, MetricsEndpoint\n"
        "MetricsEndpoint(0, Metrics('cpu7', '', []), '', 'daemon.metrics_port').start()\n"
        "print('started', flush=True)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, "started\n"), r.stderr
