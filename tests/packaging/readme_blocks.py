"""Every shell block of the README, and where a test runs it as printed.

The booted Debian 13 runs the package's blocks (check ``readme_as_printed``
in in_container.py) line by line, each line in a new shell. The only edits
are those a machine without a GPU forces, listed here beside the block:
instance ``0`` becomes ``cpu0``. A block this table does not name fails
``test_every_readme_block_is_run_or_says_why``, so a new command in the
README is run by a test or says why it cannot be.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# No GPU in the container: the GPU indexes of the README become host-memory
# instances (the rest of each command is as printed).
CPU_FOR_GPU = (("wcached@0", "wcached@cpu0"), ("wcached@1", "wcached@cpu1"), ("verify 0", "verify cpu0"))


@dataclass(frozen=True)
class Block:
    starts: str  # the block's first line, as printed
    where: str  # "container", "host" or "nowhere"
    by: str  # the step in the container, the host test, or why nowhere
    replace: tuple[tuple[str, str], ...] = field(default=())


BLOCKS = (
    Block("apt install ./wcached_", "container", "install"),
    Block(
        "echo 'WCACHED_PYTHON=/opt/vllm/bin/python3'",
        "nowhere",
        "needs PyPI (cuda-bindings, nvidia-ml-py) and a GPU; no machine here has both "
        "(the vLLM steps set WCACHED_PYTHON the same way)",
    ),
    Block("/opt/vllm/bin/pip install /usr/share/wcached/", "container", "engine_venv"),
    Block("wcached check-config --user wcache", "container", "check_config"),
    Block("systemctl enable --now wcached@0 wcached@1", "container", "start", CPU_FOR_GPU),
    Block("vllm serve /var/lib/wcache/models/llama-8b", "container", "vllm_serve"),
    Block(
        ".venv/bin/python - <<'EOF'", "host", "tests/cli/test_demo.py::test_demo_serves_and_stops_on_ctrl_c"
    ),
    Block("make run", "host", "tests/cli/test_demo.py (make run's module); make test is what CI runs"),
)


def shell_blocks(readme: str) -> list[str]:
    """The README's fenced ``sh`` blocks, in order."""
    return [m.group(1) for m in re.finditer(r"^```sh\n(.*?)^```", readme, re.S | re.M)]


def toml_block(readme: str) -> str:
    """The README's configuration, as an operator copies it."""
    (block,) = re.findall(r"^```toml\n(.*?)^```", readme, re.S | re.M)
    return block


def block_for(text: str) -> Block | None:
    first = text.splitlines()[0]
    matches = [b for b in BLOCKS if first.startswith(b.starts)]
    return matches[0] if len(matches) == 1 else None


def commands(text: str) -> list[str]:
    """A block's commands: a line each, continuation lines joined."""
    out: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.endswith("\\"):
            pending += line[:-1]  # as bash reads a backslash-newline
            continue
        out.append(pending + line)
        pending = ""
    return [c for c in out if c.strip()]


def container_plan(readme_path: Path) -> dict:
    """What the container runs: each block's commands by step, and the config."""
    readme = readme_path.read_text()
    steps = {}
    for text in shell_blocks(readme):
        block = block_for(text)
        if block is None or block.where != "container":
            continue
        cmds = commands(text)
        for old, new in block.replace:
            cmds = [c.replace(old, new) for c in cmds]
        steps[block.by] = cmds
    return {"steps": steps, "config": toml_block(readme)}
