"""The manual pages in docs/ are what the code generates: the config
reference from the structs that parse the file, wcached(8) from the parser."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from wcached.cli.manpages import PAGES, config_reference, sections, undocumented

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_committed_page_is_the_generated_one(page: str) -> None:
    """Fails when the schema (or the parser) and the page disagree: run
    `make docs` and commit the result."""
    assert (REPO / "docs" / page).read_text() == PAGES[page](), f"docs/{page} is stale: run make docs"


def test_every_key_has_a_description() -> None:
    assert undocumented() == []


def test_every_key_of_every_table_is_in_the_reference() -> None:
    import msgspec

    text = config_reference()
    for heading, _, cls in sections():
        for f in msgspec.inspect.type_info(cls).fields:
            assert f"\n.B {f.name.replace('-', chr(92) + '-')}\n" in text, (heading, f.name)


def test_a_new_key_changes_the_reference(monkeypatch) -> None:
    """The reference follows the struct: a key added to [daemon] shows up
    with its type, default and comment."""
    import msgspec

    import wcached.config as config

    class DaemonConfig(config.DaemonConfig, frozen=True, kw_only=True):
        # Seconds between two sweeps of nothing at all.
        sweep_s: float = 2.5

    before = config_reference()
    monkeypatch.setattr(config, "DaemonConfig", DaemonConfig)
    after = config_reference()
    assert before != after
    assert ".B sweep_s\n(number; default 2.5)\n.br\nSeconds between two sweeps of nothing at all." in after
    assert msgspec.inspect.type_info(DaemonConfig)


def test_every_command_and_exit_status_is_in_wcached_8() -> None:
    from wcached import exits
    from wcached.cli import _parser
    from wcached.cli.manpages import _subcommands

    text = PAGES["wcached.8"]()
    for name, sub in _subcommands(_parser()):
        assert f".B wcached {name.replace('-', chr(92) + '-')}\n" in text, name
        for action in sub._actions:
            for opt in action.option_strings:
                if opt not in ("-h", "--help"):
                    assert opt.replace("-", "\\-") in text, (name, opt)
    for status in exits.statuses():
        assert f"\n.B {status}\n" in text


@pytest.mark.skipif(shutil.which("man") is None, reason="no man(1) here")
@pytest.mark.parametrize("page", sorted(PAGES))
def test_pages_render_without_warnings(page: str) -> None:
    r = subprocess.run(
        ["man", "--warnings", "-l", str(REPO / "docs" / page)],
        capture_output=True,
        text=True,
        env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "", r.stderr
    assert re.search(r"wcached", r.stdout)
