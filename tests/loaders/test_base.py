"""The loader contract: loaders are entry points, their options are the
``[[model]]`` table, their key function is theirs alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from wcached.config import load_config
from wcached.errors import ConfigError
from wcached.loaders.base import BUILTIN_LOADERS, loader_names, model_from_builtins
from wcached.loaders.safetensors import SafetensorsModel
from wcached.loaders.vllm import VllmModel

TOY = textwrap.dedent(
    """
    from wcached.keys import CacheKey
    from wcached.loaders.base import ModelConfig

    class ToyModel(ModelConfig, tag="toy", frozen=True, kw_only=True):
        colour: str = "red"

        def problems(self):
            return super().problems() + ([("colour", "no blue")] if self.colour == "blue" else [])

    class ToyLoader:
        name = "toy"
        options = ToyModel

        def key(self, model):
            return CacheKey(model=model.name, loader="toy", fingerprint=model.colour, dtype=model.dtype)

        def fill(self, model, backend, instance, progress):
            raise NotImplementedError

        def environment(self, model, python):
            return ""

    LOADER = ToyLoader()
    """
)


def _install_toy(site: Path) -> None:
    """A distribution that declares a loader in the wcached.loaders group."""
    (site / "toy_loader.py").write_text(TOY)
    info = site / "toy_loader-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-loader\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[wcached.loaders]\ntoy = toy_loader:LOADER\n")


def test_a_loader_of_another_distribution_is_found_and_validates_its_table(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install_toy(site)
    cfg = tmp_path / "wcached.toml"
    cfg.write_text('[[model]]\nname = "m"\npath = "p"\nloader = "toy"\ncolour = "green"\n')
    probe = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(site)!r})
        from wcached.config import load_config
        from wcached.errors import ConfigError
        from wcached.loaders.base import get_loader
        (m,) = load_config({str(cfg)!r}).model
        print(type(m).__name__, m.loader, m.colour, get_loader("toy").key(m).fingerprint)
        blue = '\\n[[model]]\\nname = "n"\\npath = "p"\\nloader = "toy"\\ncolour = "blue"\\n'
        open({str(cfg)!r}, "a").write(blue)
        try:
            load_config({str(cfg)!r})
        except ConfigError as e:
            print(e.key, e.problem)
        """
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["ToyModel toy green green", "model[1].colour no blue"]


def test_builtin_loaders_need_no_installed_metadata() -> None:
    assert set(BUILTIN_LOADERS) <= loader_names()


def test_a_table_sent_to_the_worker_comes_back_as_its_loaders_struct() -> None:
    import msgspec

    # As the config hands tables over: parsed (sizes as integers).
    v = VllmModel(name="m", path="/p", tensor_parallel_size=2, role="draft").parsed()
    raw = msgspec.to_builtins(v)
    assert raw["loader"] == "vllm"
    assert model_from_builtins(raw) == v
    s = SafetensorsModel(name="m", path="/p", aliases={"a": "b"}).parsed()
    assert model_from_builtins(msgspec.to_builtins(s)) == s
    # A table as an operator or an older daemon wrote it comes back parsed.
    assert model_from_builtins({**raw, "segment_size": "4GiB"}) == v


def test_a_key_of_another_loader_is_named_as_such(tmp_path: Path) -> None:
    cfg = tmp_path / "wcached.toml"
    cfg.write_text('[[model]]\nname = "m"\npath = "p"\nrole = "draft"\n')
    try:
        load_config(cfg)
    except ConfigError as e:
        assert e.key == "model[0].role"
        assert e.problem == 'unknown key for loader = "safetensors"; it is a key of loader = "vllm"'
    else:
        raise AssertionError("role is no key of the safetensors loader")


def test_hub_ids_stay_ids_and_paths_resolve_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "models" / "here").mkdir(parents=True)
    (tmp_path / "mnt").mkdir()  # a mount point whose checkpoint is not there yet
    cfg = tmp_path / "wcached.toml"
    cfg.write_text(
        '[[model]]\nname = "hub"\npath = "meta-llama/Llama-3.2-1B"\nloader = "vllm"\n'
        '[[model]]\nname = "local"\npath = "models/here"\nloader = "vllm"\n'
        '[[model]]\nname = "st"\npath = "org/name"\n'
        '[[model]]\nname = "later"\npath = "mnt/llama"\nloader = "vllm"\n'
    )
    hub, local, st, later = load_config(cfg).model
    assert later.path == str(tmp_path / "mnt" / "llama")
    assert hub.path == "meta-llama/Llama-3.2-1B"
    assert local.path == str(tmp_path / "models" / "here")
    assert st.path == str(tmp_path / "org" / "name")  # safetensors reads files only


# -- a table's own rules, at their edges --------------------------------------


def test_sizes_are_bytes_written_either_way_and_positive() -> None:
    from wcached.loaders.base import parse_size

    assert parse_size(1, "k") == 1
    assert parse_size("1", "k") == parse_size("1B", "k") == 1
    assert parse_size(" 4 GiB ", "k") == 4 << 30
    assert parse_size("4GB", "k") == 4 * 10**9
    assert parse_size("512MiB", "k") == 512 << 20
    for bad, problem in [
        (0, "must be a positive size, got 0"),
        (-1, "must be a positive size, got -1"),
        ("0GiB", "must be a positive size, got '0GiB'"),
        ("4 gigs", "not a size: '4 gigs' (write e.g. 4GiB or 512MiB)"),
        ("-1MiB", "not a size: '-1MiB' (write e.g. 4GiB or 512MiB)"),
    ]:
        with pytest.raises(ConfigError) as e:
            parse_size(bad, "segment_size")
        assert (e.value.key, e.value.problem) == ("segment_size", problem), bad


def test_a_parsed_table_has_its_size_in_bytes_so_both_spellings_are_one_setting() -> None:
    a = SafetensorsModel(name="m", path="/p", segment_size="4GiB").parsed()
    b = SafetensorsModel(name="m", path="/p", segment_size="4096MiB").parsed()
    assert a == b and a.segment_size == 4 << 30
    already = SafetensorsModel(name="m", path="/p", segment_size=4 << 30)
    assert already.parsed() == already and already.segment_bytes == 4 << 30


def test_auto_readers_are_one_per_core_within_the_backends_most(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    auto = SafetensorsModel(name="m", path="/p")
    for cores, most, readers in [(32, None, 16), (32, 8, 8), (4, None, 4), (1, None, 1), (None, None, 1)]:
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        got = auto.reader_count() if most is None else auto.reader_count(most)
        assert got == readers, (cores, most)
    assert SafetensorsModel(name="m", path="/p", read_threads=3).reader_count(2) == 3  # as written


def _problems(**kw) -> list[tuple[str, str]]:
    return SafetensorsModel(**{"name": "m", "path": "/p", **kw}).problems()


def test_each_setting_is_checked_at_its_edge_naming_its_key() -> None:
    assert _problems() == []
    for ok in ["Llama-3.1/8B:inst_a", "x" * 128, "A"]:
        assert _problems(name=ok) == [], ok
    for bad in ["", "x" * 129, "a b", "m\n", "é"]:
        assert _problems(name=bad) == [("name", f"invalid model name {bad!r}")], bad
    for ok in [1, 2, 4, 256, 2 << 20]:
        assert _problems(alignment=ok) == [], ok
    for bad in [0, -4, 3, 6, 12, 4 << 20]:
        assert _problems(alignment=bad) == [("alignment", f"must be a power of two <= 2MiB, got {bad}")], bad
    assert _problems(segment_size="lots") == [
        ("segment_size", "not a size: 'lots' (write e.g. 4GiB or 512MiB)")
    ]
    assert _problems(segment_size=0) == [("segment_size", "must be a positive size, got 0")]
    assert _problems(read_threads=1) == []
    assert _problems(read_threads=0) == [("read_threads", "must be >= 1")]
    assert _problems(fill_timeout_s=0.5) == []
    assert _problems(fill_timeout_s=0.0) == [("fill_timeout_s", "must be > 0")]
    assert _problems(fill_timeout_s=-1.0) == [("fill_timeout_s", "must be > 0")]


def test_a_table_without_its_loader_tag_is_the_default_loaders() -> None:
    m = model_from_builtins({"name": "m", "path": "/p", "segment_size": "1GiB"})
    assert type(m) is SafetensorsModel and m.segment_size == 1 << 30
