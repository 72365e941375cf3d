"""Instance name -> device.

``cpuN`` is the host-memory backend (N only tells instances apart). A GPU index
(``0``) or UUID (``GPU-...``) resolves through NVML, which reads the driver's
view without creating a CUDA context, so the daemon stays context-free and
``CUDA_VISIBLE_DEVICES`` (which renumbers devices) plays no part.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass

from wcached.errors import DeviceError, DeviceNotReady

_CPU_RE = re.compile(r"^cpu(\d+)$")
_INDEX_RE = re.compile(r"^\d+$")
_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]{8,}$")
# A GPU's UUID exactly as NVML spells one (lower-case hex, 8-4-4-4-12): the
# form a daemon names its socket after.
_NVML_UUID_RE = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Where the NVIDIA driver lists the GPUs it drives, one folder each, whose
# "information" file names the GPU's UUID.
DRIVER_GPUS = "/proc/driver/nvidia/gpus"


@dataclass(frozen=True)
class Device:
    kind: str  # "cpu" or "cuda"
    instance_id: str  # canonical: "cpu0" or "GPU-<uuid>"
    index: int  # cpu ordinal, or the NVML index
    name: str  # human description
    aliases: tuple[str, ...] = ()  # other names of the same instance ("0")
    memory_bytes: int = 0  # the GPU's memory (NVML); 0 for host memory

    @property
    def backend(self) -> str:
        return "host" if self.kind == "cpu" else "cuda"


def is_instance_name(name: str) -> bool:
    """Whether ``name`` could name an instance (cpuN, a GPU index, a GPU or
    MIG UUID), without asking NVML whether that device is there."""
    return bool(_CPU_RE.match(name) or _INDEX_RE.match(name) or _UUID_RE.match(name))


def resolve_instance(name: str, isolated: bool = False) -> Device:
    """Resolve an instance name as given on the command line or in a unit.

    ``isolated=True`` asks NVML in a short-lived child process: libnvidia-ml
    loads libcuda into whoever calls it, and the daemon keeps its own address
    space free of any CUDA library.
    """
    m = _CPU_RE.match(name)
    if m:
        return Device("cpu", name, int(m.group(1)), "host memory")
    if _INDEX_RE.match(name) or _UUID_RE.match(name):
        return _resolve_gpu_isolated(name) if isolated else _resolve_gpu(name)
    raise DeviceError(
        f"instance {name!r} is not a device: use cpuN (host memory), a GPU index such as 0, "
        "or a GPU UUID such as GPU-8d3c..."
    )


def _resolve_gpu(name: str) -> Device:
    try:
        import pynvml
    except ImportError:
        raise DeviceError(f"instance {name!r} is a GPU, but nvidia-ml-py (pynvml) is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        # At boot the unit may start before the driver is loaded: retried.
        raise DeviceNotReady(
            f"instance {name!r} is a GPU, but NVML could not start ({e}): "
            "is the NVIDIA driver installed and loaded?"
        ) from None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if _INDEX_RE.match(name):
            index = int(name)
            if index >= count:
                raise DeviceError(f"instance {name!r}: no GPU with index {index} ({count} present)")
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        else:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(name)
            except pynvml.NVMLError:
                raise DeviceError(f"instance {name!r}: no GPU with that UUID") from None
            index = pynvml.nvmlDeviceGetIndex(handle)
        uuid = nvml_text(pynvml.nvmlDeviceGetUUID(handle))
        model = nvml_text(pynvml.nvmlDeviceGetName(handle))
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    except pynvml.NVMLError as e:
        # A GPU mid-reset, a driver mid-reload: not usable now, retried (a
        # GPU fallen off the bus keeps failing, with this line each time).
        raise DeviceNotReady(f"instance {name!r}: NVML failed: {e}") from None
    finally:
        pynvml.nvmlShutdown()
    aliases = tuple(a for a in {name, str(index)} if a != uuid)
    return Device("cuda", uuid, index, model, aliases, memory)


def _resolve_gpu_isolated(name: str) -> Device:
    r = subprocess.run(
        [sys.executable, "-m", "wcached.device", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        message = lines[-1] if lines else f"resolving {name!r} failed ({r.returncode})"
        # The child's status says which kind (see main()).
        raise (DeviceNotReady if r.returncode == DeviceNotReady.exit_status else DeviceError)(message)
    raw = json.loads(r.stdout)
    raw["aliases"] = tuple(raw["aliases"])
    return Device(**raw)


def nvml_text(value: str | bytes) -> str:
    """NVML's strings: bytes from older nvidia-ml-py releases, str from newer."""
    return value.decode() if isinstance(value, bytes) else value


@functools.lru_cache(maxsize=64)
def instance_id_for(name: str) -> str:
    """Canonical id (socket file stem) of an instance name; cached, because
    clients call it on every attach and a GPU name costs an NVML start-up.

    A GPU's UUID spelled as NVML spells it, of a GPU the driver here lists,
    is its own id, with no NVML start-up (0.4 ms, on an engine's attach path:
    the vLLM plugin names its GPU so). Any other GPU name, and a UUID of no
    GPU here, is resolved through NVML, which says so (a device error, not a
    daemon to wait for)."""
    if _NVML_UUID_RE.fullmatch(name) and _driver_lists(name):
        return name
    return resolve_instance(name).instance_id


def _driver_lists(uuid: str) -> bool:
    """Whether the NVIDIA driver here lists the GPU ``uuid`` in its procfs
    (tens of microseconds); False where it does not, or where that cannot be
    read (a container without /proc/driver/nvidia): NVML answers then."""
    try:
        entries = list(os.scandir(DRIVER_GPUS))
    except OSError:
        return False
    for entry in entries:
        try:
            with open(os.path.join(entry.path, "information")) as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key.strip() == "GPU UUID" and value.strip() == uuid:
                        return True
        except OSError:
            continue
    return False


def main(argv: list[str] | None = None) -> int:
    """``python -m wcached.device NAME``: the resolved device as JSON."""
    args = sys.argv[1:] if argv is None else argv
    try:
        print(json.dumps(asdict(resolve_instance(args[0]))))
    except DeviceError as e:
        print(e, file=sys.stderr)
        return e.exit_status
    return 0


if __name__ == "__main__":
    sys.exit(main())
