"""The README's shell blocks are each run by a test, or say why not."""

from __future__ import annotations

from tests.helpers import REPO
from tests.packaging.readme_blocks import BLOCKS, block_for, commands, container_plan, shell_blocks

README = (REPO / "README.md").read_text()


def test_every_readme_block_is_run_or_says_why() -> None:
    unplaced = [text.splitlines()[0] for text in shell_blocks(README) if block_for(text) is None]
    assert not unplaced, f"README blocks no test runs (add them to readme_blocks.BLOCKS): {unplaced}"


def test_every_placed_block_is_still_in_the_readme() -> None:
    firsts = [text.splitlines()[0] for text in shell_blocks(README)]
    stale = [b.starts for b in BLOCKS if not any(f.startswith(b.starts) for f in firsts)]
    assert not stale, stale


def test_the_container_gets_every_command_of_its_blocks() -> None:
    plan = container_plan(REPO / "README.md")
    expected = {b.by for b in BLOCKS if b.where == "container"}
    assert set(plan["steps"]) == expected
    # The start block, with the GPU indexes as host-memory instances only.
    start = plan["steps"]["start"]
    assert start[0].startswith("systemctl enable --now wcached@cpu0 wcached@cpu1")
    assert any(c.startswith("wcached verify cpu0") for c in start)
    assert "[[model]]" in plan["config"]


def test_continuation_lines_are_one_command() -> None:
    assert commands("a \\\n    b\nc\n\n") == ["a     b", "c"]
