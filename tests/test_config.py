from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wcached.config import AccessLists, instance_settings, load_config, parse_size
from wcached.errors import EX_CONFIG, ConfigError

GOOD = """
[daemon]
socket_dir = "run"
allowed_groups = ["wcache"]

[[model]]
name = "llama"
path = "models/llama"

[[model]]
name = "small"
path = "/srv/small"
dtype = "bfloat16"
segment_size = "512MiB"

[instance."cpu1"]
models = ["small"]
connection_timeout_s = 3.0
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "wcached.toml"
    p.write_text(text)
    return p


def test_good_config_resolves_relative_paths_and_instances(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, GOOD))
    assert cfg.daemon.socket_dir == str(tmp_path / "run")
    assert cfg.model[0].path == str(tmp_path / "models" / "llama")
    assert cfg.model[1].segment_bytes == 512 << 20
    assert 1 <= cfg.model[1].reader_count() <= 16  # "auto"
    s0 = instance_settings(cfg, "cpu0")
    assert [m.name for m in s0.models] == ["llama", "small"]
    assert s0.connection_timeout_s == 10.0
    s1 = instance_settings(cfg, "cpu1")
    assert [m.name for m in s1.models] == ["small"]
    assert s1.connection_timeout_s == 3.0
    assert s1.access.groups == ("wcache",)
    assert s1.socket_path == str(tmp_path / "run" / "cpu1.sock")


def test_instance_table_matches_gpu_alias(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, GOOD.replace('"cpu1"', '"0"')))
    s = instance_settings(cfg, "GPU-1234abcd-0000", ("0",))
    assert [m.name for m in s.models] == ["small"]


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ('[daemon]\nsocket_dri = "x"\n', "daemon.socket_dri", "unknown key"),
        ('[daemon]\nmax_clients = "many"\n', "daemon.max_clients", "Expected `int`"),
        ("[daemon]\nmax_clients = 0\n", "daemon.max_clients", ">= 1"),
        ('[[model]]\nname = "a"\n', "model[0].path", "required key is missing"),
        ('[[model]]\nname = "a"\npath = "p"\nloader = "gguf"\n', "model[0].loader", "unknown loader"),
        ('[[model]]\nname = "a"\npath = "p"\nalignment = 48\n', "model[0].alignment", "power of two"),
        ('[[model]]\nname = "a"\npath = "p"\ndtype = "int4"\n', "model[0].dtype", "expected one of 'auto'"),
        ('[[model]]\nname = "a"\npath = "p"\nsegment_size = "lots"\n', "model[0].segment_size", "not a size"),
        (
            '[[model]]\nname = "a"\npath = "p"\n[[model]]\nname = "a"\npath = "q"\n',
            "model[1].name",
            "duplicate",
        ),
        ('[instance."cpu0"]\nmodels = ["ghost"]\n', "instance.cpu0.models[0]", "ghost"),
        ('[instance."cpu0"]\ncolour = 1\n', "instance.cpu0.colour", "unknown key"),
        # A table no instance reads would silently not apply.
        ('[instance."gpu0"]\nmodels = []\n', "instance.gpu0", "not an instance name"),
        ('[[model]]\nname = "a"\npath = "p"\nextra_key = 1\n', "model[0].extra_key", "unknown key"),
        ("source = 'x'\n", "source", "unknown key"),
        ('[[model]]\nname = "a"\npath = "p"\nread_threads = "many"\n', "model[0].read_threads", "Invalid"),
        ('[[model]]\nname = "a"\npath = "p"\nread_threads = 0\n', "model[0].read_threads", ">= 1"),
        (
            '[[model]]\nname = "a"\npath = "p"\ntensor_parallel_size = 2\n',
            "model[0].tensor_parallel_size",
            'loader = "vllm"',
        ),
        (
            '[[model]]\nname = "a"\npath = "p"\nloader = "vllm"\nrendezvous = "localhost:1"\n',
            "model[0].rendezvous",
            "tcp://host:port",
        ),
        (
            '[[model]]\nname = "a"\npath = "p"\nloader = "vllm"\nrendezvous = "tcp://10.0.0.5:29555"\n',
            "model[0].rendezvous",
            "loopback",
        ),
        (
            '[[model]]\nname = "a"\npath = "p"\nloader = "vllm"\nrendezvous = "tcp://127.0.0.1:70000"\n',
            "model[0].rendezvous",
            "port must be 1..65535",
        ),
        (
            '[[model]]\nname = "a"\npath = "p"\nloader = "vllm"\ntensor_parallel_size = 2\n'
            'ranks = { "0" = 0, "1" = 2 }\n',
            "model[0].ranks.1",
            "outside 0..1",
        ),
        (
            '[[model]]\nname = "a"\npath = "p"\nloader = "vllm"\ntensor_parallel_size = 2\n'
            'ranks = { "0" = 1, "1" = 1 }\n',
            "model[0].ranks",
            "same rank",
        ),
        ("[daemon]\nmetrics_port = 65536\n", "daemon.metrics_port", "65536 is outside 1..65535"),
        ("[daemon]\nmetrics_port = -1\n", "daemon.metrics_port", "-1 is outside 1..65535"),
        ('[daemon]\nmetrics_port = "9400"\n', "daemon.metrics_port", "Expected `int`"),
        ('[daemon]\nmetrics_dir = "metrics"\n', "daemon.metrics_dir", "must be an absolute path"),
        ("[daemon]\nmetrics_dir = 1\n", "daemon.metrics_dir", "Expected `str`"),
        ('[instance."cpu1"]\nmetrics_port = 70000\n', "instance.cpu1.metrics_port", "70000 is outside"),
        ('[instance."0"]\nmetrics_port = -5\n', "instance.0.metrics_port", "-5 is outside"),
        ('[instance."cpu1"]\nmetrics_dir = "/x"\n', "instance.cpu1.metrics_dir", "unknown key"),
        # `model` written as a key, not as [[model]] tables.
        ('model = "llama"\n', "model", "must be an array of tables ([[model]])"),
        ("model = [1, 2]\n", "model[0]", "must be a table"),
    ],
)
def test_mistakes_name_file_and_key(tmp_path: Path, text: str, key: str, problem: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.key == key
    assert problem in e.value.problem
    assert str(path) in str(e.value)
    assert e.value.exit_status == EX_CONFIG


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(_write(tmp_path, "[daemon\n"))
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml")


def test_sizes() -> None:
    assert parse_size("4GiB", "k") == 4 << 30
    assert parse_size("2 MB", "k") == 2_000_000
    assert parse_size(4096, "k") == 4096
    for bad in ("0", "-1GiB", "1.5GiB", "GiB"):
        with pytest.raises(ConfigError):
            parse_size(bad, "k")


def test_shipped_default_config_is_valid() -> None:
    cfg = load_config(Path(__file__).resolve().parent.parent / "etc" / "wcache" / "wcached.toml")
    assert cfg.daemon.socket_dir == "/run/wcache"
    assert cfg.model


def test_socket_dir_too_long_for_a_unix_socket(tmp_path: Path) -> None:
    long_dir = "/run/" + "d" * 70
    cfg = tmp_path / "wcached.toml"
    cfg.write_text(f'[daemon]\nsocket_dir = "{long_dir}"\n')
    config = load_config(cfg)
    with pytest.raises(ConfigError) as e:
        instance_settings(config, "GPU-8d3c5a5e-0b7c-4b1e-9d2f-0123456789ab")
    assert e.value.key == "daemon.socket_dir" and "too long" in str(e.value) and str(cfg) in str(e.value)
    instance_settings(config, "cpu0")  # 81 bytes: fits
    # check-config catches it for the longest name an instance can have.
    r = subprocess.run(
        [sys.executable, "-m", "wcached", "check-config", "--config", str(cfg)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == EX_CONFIG and "daemon.socket_dir" in r.stderr and "too long" in r.stderr


METRICS = """
[daemon]
socket_dir = "/run/wcache"
metrics_dir = "/var/lib/prometheus/node-exporter"
metrics_port = 9400

[instance."cpu2"]
metrics_port = 9500

[instance."3"]
metrics_port = 0
"""


def test_metrics_keys_resolve_per_instance(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, METRICS))
    # The daemon's port plus the device index: one line for every device.
    s0 = instance_settings(cfg, "cpu0")
    assert (s0.metrics_port, s0.metrics_port_key) == (9400, "daemon.metrics_port")
    assert s0.metrics_dir == "/var/lib/prometheus/node-exporter"
    assert s0.metrics_path == "/var/lib/prometheus/node-exporter/wcached-cpu0.prom"
    assert instance_settings(cfg, "cpu1").metrics_port == 9401
    # A GPU by UUID: its index given (what serve does), or found among its names.
    uuid = "GPU-8d3c5a5e-0b7c-4b1e-9d2f-0123456789ab"
    assert instance_settings(cfg, uuid, (uuid,), index=5).metrics_port == 9405
    assert instance_settings(cfg, uuid, ("1",)).metrics_port == 9401
    gpu = instance_settings(cfg, uuid, ("2",))
    assert gpu.metrics_port == 9402
    assert gpu.metrics_path == f"/var/lib/prometheus/node-exporter/wcached-{uuid}.prom"
    # An instance's own port is taken exactly, and names its key.
    s2 = instance_settings(cfg, "cpu2")
    assert (s2.metrics_port, s2.metrics_port_key) == (9500, "instance.cpu2.metrics_port")
    # 0 in an instance table: no endpoint for that one (matched by its index alias).
    s3 = instance_settings(cfg, uuid, ("3",), index=3)
    assert (s3.metrics_port, s3.metrics_port_key) == (0, "instance.3.metrics_port")


def test_metrics_off_by_default(tmp_path: Path) -> None:
    s = instance_settings(load_config(_write(tmp_path, GOOD)), "cpu3")
    assert (s.metrics_port, s.metrics_dir, s.metrics_path) == (0, "", "")


def test_metrics_port_plus_index_over_65535_names_the_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "[daemon]\nmetrics_port = 65534\n")
    cfg = load_config(path)
    assert instance_settings(cfg, "cpu1").metrics_port == 65535
    with pytest.raises(ConfigError) as e:
        instance_settings(cfg, "cpu2")
    assert e.value.key == "daemon.metrics_port" and str(path) in str(e.value)
    assert "65534 + device index 2 of cpu2 = 65536 is over 65535" in e.value.problem


def test_two_tables_naming_one_device_are_a_config_error(tmp_path: Path) -> None:
    """A GPU's index and its UUID name one device: with a table under each,
    which applies is not the operator's guess to make."""
    uuid = "GPU-8d3c0a1e-0000-0000-0000-000000000000"
    cfg = load_config(
        _write(tmp_path, f'[instance."0"]\nmax_clients = 4\n[instance."{uuid}"]\nmax_clients = 8\n')
    )
    with pytest.raises(ConfigError, match="both name") as e:
        instance_settings(cfg, uuid, ("0",))
    assert e.value.key == "instance.0" and str(tmp_path / "wcached.toml") in str(e.value)
    assert e.value.problem == f"instance tables {uuid!r} and '0' both name {uuid}: keep one"


def _socket_dir_of_length(total: int, name: str, root: str = "/srv") -> str:
    """A directory under ``root`` whose ``<dir>/<name>`` is ``total`` bytes."""
    pad = total - len(root) - len("/") - len("/") - len(name)
    assert pad > 0, root
    return f"{root}/{'d' * pad}"


@pytest.mark.parametrize("instance", ["cpu0", "GPU-8d3c5a5e-0b7c-4b1e-9d2f-0123456789ab"])
def test_socket_path_of_exactly_107_bytes_is_accepted_and_108_is_refused(
    tmp_path: Path, instance: str
) -> None:
    """sun_path holds 107 bytes and a NUL: a socket path of 107 bytes is
    fine, one byte more is a config error naming the file and the key."""
    name = f"{instance}.sock"
    fits = _socket_dir_of_length(107, name)
    cfg = load_config(_write(tmp_path, f'[daemon]\nsocket_dir = "{fits}"\n'))
    assert len(instance_settings(cfg, instance).socket_path.encode()) == 107
    over = _socket_dir_of_length(108, name)
    path = _write(tmp_path, f'[daemon]\nsocket_dir = "{over}"\n')
    with pytest.raises(ConfigError) as e:
        instance_settings(load_config(path), instance)
    assert e.value.key == "daemon.socket_dir" and str(path) in str(e.value)
    assert "108 bytes" in e.value.problem and "allow 107" in e.value.problem
    assert e.value.exit_status == EX_CONFIG


def test_check_config_measures_the_longest_instance_name_to_the_byte(tmp_path: Path) -> None:
    """check-config passes a socket directory whose longest socket (a GPU
    UUID's) is 107 bytes and refuses one a byte longer, naming the key."""
    from wcached.config import LONGEST_SOCKET_NAME, check_socket_path

    fits = _socket_dir_of_length(107, LONGEST_SOCKET_NAME)
    check_socket_path(load_config(_write(tmp_path, f'[daemon]\nsocket_dir = "{fits}"\n')))
    over = _socket_dir_of_length(108, LONGEST_SOCKET_NAME)
    path = _write(tmp_path, f'[daemon]\nsocket_dir = "{over}"\n')
    r = subprocess.run(
        [sys.executable, "-m", "wcached", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == EX_CONFIG, r.stderr
    assert "daemon.socket_dir" in r.stderr and "too long" in r.stderr and str(path) in r.stderr


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[daemon]\nconnection_timeout_s = 0\n", "daemon.connection_timeout_s"),
        ("[daemon]\nconnection_timeout_s = 0.0\n", "daemon.connection_timeout_s"),
        ("[daemon]\nconnection_timeout_s = -1.5\n", "daemon.connection_timeout_s"),
        ("[daemon]\nmax_clients = -1\n", "daemon.max_clients"),
        ('[instance."cpu1"]\nconnection_timeout_s = 0\n', "instance.cpu1.connection_timeout_s"),
        ('[instance."cpu1"]\nconnection_timeout_s = -3\n', "instance.cpu1.connection_timeout_s"),
        ('[instance."cpu1"]\nmax_clients = 0\n', "instance.cpu1.max_clients"),
        ('[instance."cpu1"]\nmax_clients = -2\n', "instance.cpu1.max_clients"),
    ],
)
def test_a_timeout_or_client_limit_of_zero_or_less_is_a_config_error(
    tmp_path: Path, text: str, key: str
) -> None:
    """A connection timeout of 0 s (or less) or room for no client would make
    every engine's attach fail: refused up front, naming file and key."""
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.key == key and str(path) in str(e.value)
    assert e.value.problem == ("must be > 0" if key.endswith("timeout_s") else "must be >= 1")
    assert e.value.exit_status == EX_CONFIG


@pytest.mark.parametrize("table", ["[daemon]", '[instance."cpu1"]'], ids=["daemon", "instance"])
def test_the_smallest_positive_timeout_and_one_client_are_accepted(tmp_path: Path, table: str) -> None:
    """Just above the edge: a 1 ms connection timeout and a single client
    slot are legitimate settings, and are what the instance runs with."""
    cfg = load_config(_write(tmp_path, f"{table}\nconnection_timeout_s = 0.001\nmax_clients = 1\n"))
    s = instance_settings(cfg, "cpu1")
    assert (s.connection_timeout_s, s.max_clients) == (0.001, 1)


def test_serve_with_a_zero_connection_timeout_exits_78_naming_file_and_key(tmp_path: Path) -> None:
    """The unit must not restart-loop on connection_timeout_s = 0: serve
    exits 78 (not retried) and says which file and key."""
    path = _write(tmp_path, f'[daemon]\nsocket_dir = "{tmp_path / "run"}"\nconnection_timeout_s = 0\n')
    r = subprocess.run(
        [sys.executable, "-m", "wcached", "serve", "cpu0", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == EX_CONFIG, r.stderr
    assert str(path) in r.stderr and "daemon.connection_timeout_s" in r.stderr
    assert not (tmp_path / "run" / "cpu0.sock").exists()


def test_a_daemon_at_the_longest_accepted_socket_path_binds_and_serves(
    work: Path, sharded_ckpt: Path
) -> None:
    """The longest socket path the config accepts (107 bytes) is one the
    daemon can really bind, and engines can attach through it."""
    from tests.helpers import one_model_config, run_daemon
    from wcached.client import attach

    sdir = Path(_socket_dir_of_length(107, "cpu0.sock", str(work)))
    cfg = one_model_config(work, sharded_ckpt, sdir)
    with run_daemon(cfg) as d:
        assert len(d.socket_path.encode()) == 107
        with attach("default", "cpu0", socket_dir=str(sdir), timeout=10, keep_lease=False) as a:
            assert "embed.weight" in a.tensors


def _with_a_broken_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """A third-party loader whose plugin does not import."""
    import wcached.config

    real_names, real_options = wcached.config.loader_names(), wcached.config.options_for

    def options_for(name: str):
        if name == "broken":
            raise ImportError("No module named 'broken_loader'")
        return real_options(name)

    monkeypatch.setattr(wcached.config, "loader_names", lambda: real_names | {"broken"})
    monkeypatch.setattr(wcached.config, "options_for", options_for)


def test_a_loader_plugin_that_does_not_import_names_the_model_key_and_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_a_broken_loader(monkeypatch)
    path = _write(
        tmp_path, '[[model]]\nname = "a"\npath = "p"\n[[model]]\nname = "b"\npath = "p"\nloader = "broken"\n'
    )
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.key == "model[1].loader"
    assert e.value.problem == "loader 'broken' cannot be used: No module named 'broken_loader'"
    assert str(path) in str(e.value) and e.value.exit_status == EX_CONFIG


def test_an_unknown_key_still_names_the_loader_it_belongs_to_beside_a_broken_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_a_broken_loader(monkeypatch)
    path = _write(tmp_path, '[[model]]\nname = "a"\npath = "p"\ntensor_parallel_size = 2\n')
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.key == "model[0].tensor_parallel_size"
    assert e.value.problem == 'unknown key for loader = "safetensors"; it is a key of loader = "vllm"'


@pytest.mark.parametrize("port", [1, 65535])
def test_the_first_and_last_tcp_ports_are_accepted_for_metrics(tmp_path: Path, port: int) -> None:
    """0 turns the endpoint off; 1..65535 are ports, both ends included."""
    text = f'[daemon]\nmetrics_port = {port}\n[instance."cpu1"]\nmetrics_port = {port}\n'
    cfg = load_config(_write(tmp_path, text))
    assert instance_settings(cfg, "cpu0").metrics_port == port
    assert instance_settings(cfg, "cpu1").metrics_port == port


def test_hub_ids_are_kept_for_loaders_that_resolve_them_and_paths_resolved_otherwise(tmp_path: Path) -> None:
    """org/name is a hub id for a loader that accepts one (vllm) unless its
    first directory is there beside the config; anything else is a path."""
    (tmp_path / "local").mkdir()
    text = "".join(
        f'[[model]]\nname = "m{i}"\npath = "{path}"\nloader = "{loader}"\n'
        for i, (path, loader) in enumerate(
            [
                ("Qwen/Qwen3-0.6B", "vllm"),  # a hub id
                ("local/Qwen3-0.6B", "vllm"),  # its first directory is here: a path
                ("Qwen/Qwen3-0.6B", "safetensors"),  # this loader reads paths only
                (".cache/Qwen3-0.6B", "vllm"),  # a hidden directory: a path
                ("org/name/more", "vllm"),  # three parts: a path
                ("org-1/name_2.5", "vllm"),  # dots, dashes and underscores: a hub id
            ]
        )
    )
    cfg = load_config(_write(tmp_path, text))
    paths = [m.path for m in cfg.model]
    assert paths == [
        "Qwen/Qwen3-0.6B",
        str(tmp_path / "local" / "Qwen3-0.6B"),
        str(tmp_path / "Qwen" / "Qwen3-0.6B"),
        str(tmp_path / ".cache" / "Qwen3-0.6B"),
        str(tmp_path / "org" / "name" / "more"),
        "org-1/name_2.5",
    ]


@pytest.mark.parametrize(
    ("message", "key", "problem"),
    [
        # msgspec's own wording, with and without the place it failed.
        (
            "Expected `int`, got `str` - at `$.model[0].alignment`",
            "model[0].alignment",
            "Expected `int`, got `str`",
        ),
        ("Expected `int`, got `str`", None, "Expected `int`, got `str`"),
        ("Object contains unknown field `foo` - at `$.daemon`", "daemon.foo", "unknown key"),
        ("Object contains unknown field `foo`", "foo", "unknown key"),
        (
            "Object missing required field `path` - at `$.model[0]`",
            "model[0].path",
            "required key is missing",
        ),
        ("Object missing required field `path`", "path", "required key is missing"),
        ("Invalid enum value 'int4'", None, "Invalid enum value 'int4'"),
    ],
)
def test_msgspec_errors_become_the_key_and_problem_an_operator_reads(
    message: str, key: str | None, problem: str
) -> None:
    from wcached.config import _split_validation_error

    assert _split_validation_error(message) == (key, problem)


def test_a_bad_choice_names_the_choices_of_the_field_at_the_end_of_its_key() -> None:
    from wcached.config import _split_validation_error
    from wcached.loaders.safetensors import SafetensorsModel

    key, problem = _split_validation_error(
        "Invalid enum value 'int4' - at `$.model[0].dtype`", SafetensorsModel
    )
    assert key == "model[0].dtype"
    assert problem == "Invalid enum value 'int4'; expected one of 'auto', 'float16', 'bfloat16', 'float32'"


def test_an_instance_table_overrides_the_daemons_access_lists_and_the_rest_is_the_daemons(
    tmp_path: Path,
) -> None:
    """allowed_users and allowed_groups of an instance table replace the
    daemon's, even when empty; the worker's Python, the log level and the
    config file named in errors are the daemon's for every instance."""
    text = (
        '[daemon]\nallowed_users = ["alice"]\nallowed_groups = ["render"]\n'
        'worker_python = "/opt/engine/bin/python3"\nlog_level = "debug"\n'
        '[instance."cpu1"]\nallowed_users = ["bob"]\nallowed_groups = []\n'
    )
    path = _write(tmp_path, text)
    cfg = load_config(path)
    own = instance_settings(cfg, "cpu1")
    assert (own.access.users, own.access.groups) == (("bob",), ())
    default = instance_settings(cfg, "cpu0")
    assert (default.access.users, default.access.groups) == (("alice",), ("render",))
    for s in (own, default):
        assert (s.worker_python, s.log_level, s.source) == ("/opt/engine/bin/python3", "debug", str(path))
        assert s.worker_interpreter == "/opt/engine/bin/python3"
    assert instance_settings(load_config(_write(tmp_path, "")), "cpu0").worker_interpreter == sys.executable


def test_access_list_errors_name_the_key_the_list_came_from(tmp_path: Path) -> None:
    """An instance's table by whichever name it matched (a GPU's index beside
    its UUID) where it sets the list; the daemon's where it does not."""
    path = _write(
        tmp_path,
        '[daemon]\nallowed_users = ["alice"]\nallowed_groups = ["render"]\n'
        '[instance."0"]\nallowed_users = ["bob"]\n',
    )
    cfg = load_config(path)
    gpu = instance_settings(cfg, "GPU-0a1b2c3d-0000-0000-0000-000000000000", ("0",))
    assert gpu.access == AccessLists(
        ("bob",), ("render",), "instance.0.allowed_users", "daemon.allowed_groups"
    )
    other = instance_settings(cfg, "cpu1")
    assert other.access == AccessLists(("alice",), ("render",))  # [daemon]'s keys


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('source = "x"', "key 'source': unknown key"),
        ("model = 3", "key 'model': must be an array of tables ([[model]])"),
        ("model = [3]", "key 'model[0]': must be a table"),
        (
            '[[model]]\nname = "a"\npath = "/x"\nloader = "nope"',
            "key 'model[0].loader': unknown loader 'nope' (known: safetensors, vllm)",
        ),
        (
            '[[model]]\nname = "a"\npath = "/x"\ntensor_parallel_size = 2',
            "key 'model[0].tensor_parallel_size': unknown key for loader = \"safetensors\"; "
            'it is a key of loader = "vllm"',
        ),
        (
            '[[model]]\nname = "a"\npath = "/x"\nfingerprint = "bytes"',
            "key 'model[0].fingerprint': Invalid enum value 'bytes'; expected one of 'header', 'content'",
        ),
        (
            '[daemon]\nlog_level = "loud"',
            "key 'daemon.log_level': Invalid enum value 'loud'; "
            "expected one of 'debug', 'info', 'warning', 'error'",
        ),
        (
            '[instance."cpu0"]\nmodels = ["a"]\n[instance."cpu1"]\nmodels = [1]',
            "key 'instance.cpu1.models[0]': Expected `str`, got `int`",
        ),
        (
            '[instance."bad!"]\nmodels = ["a"]',
            "key 'instance.bad!': not an instance name: use cpuN, a GPU index such as 0, "
            "or a GPU UUID such as GPU-8d3c...",
        ),
    ],
)
def test_each_mistake_is_told_whole_with_its_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    """What an operator reads in the journal: the file, the key as written
    in TOML (the instance table by its name, a model by its index), what is
    wrong, and the choices where there are some."""
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}: {message}"


def test_a_bare_uuid_whose_index_is_not_known_takes_the_daemons_port_itself(tmp_path: Path) -> None:
    # Only NVML knows a bare UUID's index; without it the offset is 0, not a guess.
    cfg = load_config(_write(tmp_path, METRICS))
    uuid = "GPU-8d3c5a5e-0b7c-4b1e-9d2f-0123456789ab"
    assert instance_settings(cfg, uuid).metrics_port == 9400


def test_two_instance_tables_naming_one_device_name_the_file_and_the_second(tmp_path: Path) -> None:
    uuid = "GPU-8d3c5a5e-0b7c-4b1e-9d2f-0123456789ab"
    path = _write(tmp_path, f'[instance."{uuid}"]\nmodels = []\n[instance."0"]\nmodels = []\n')
    with pytest.raises(ConfigError) as e:
        instance_settings(load_config(path), uuid, ("0",))
    assert str(e.value) == (
        f"{path}: key 'instance.0': instance tables '{uuid}' and '0' both name {uuid}: keep one"
    )


def test_check_config_names_each_unknown_user_and_group_once_under_the_key_it_came_from(
    tmp_path: Path,
) -> None:
    """A [daemon] list that instances inherit is told once, under [daemon]; an
    instance's own list under its table; a bad user hides no bad group."""
    from wcached.cli.check_config import problems

    path = _write(
        tmp_path,
        '[daemon]\nallowed_users = ["no-such-user-a"]\nallowed_groups = ["no-such-group-a"]\n'
        '[instance."cpu1"]\nallowed_groups = ["root", "no-such-group-b"]\n'
        '[instance."cpu2"]\nallowed_users = ["root"]\n',
    )
    access = [p for p in problems(load_config(path)) if "no such" in p]
    assert access == [
        f"{path}: key 'daemon.allowed_users[0]': no such user 'no-such-user-a'",
        f"{path}: key 'daemon.allowed_groups[0]': no such group 'no-such-group-a'",
        f"{path}: key 'instance.cpu1.allowed_groups[1]': no such group 'no-such-group-b'",
    ]


def test_check_config_checks_the_lists_of_an_instance_whose_other_keys_are_wrong(tmp_path: Path) -> None:
    """An instance table whose metrics port overflows is one problem; an
    unknown user in its own list is another, told too."""
    from wcached.cli.check_config import problems

    path = _write(
        tmp_path,
        '[daemon]\nmetrics_port = 65535\n[instance."cpu3"]\nallowed_users = ["root", "no-such-user-c"]\n',
    )
    found = problems(load_config(path))
    assert f"{path}: key 'instance.cpu3.allowed_users[1]': no such user 'no-such-user-c'" in found
    port = f"{path}: key 'daemon.metrics_port': 65535 + device index 3"
    assert any(p.startswith(port) for p in found), found
