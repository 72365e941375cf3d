"""The vLLM loader: fill with vLLM's own model loading, in the loader worker.

The worker builds this instance's rank of the model exactly as an engine
worker would (joining a torch.distributed group with the other instances of
the model when tensor/pipeline parallel), so what it exports are the engine's
own parameters: fused QKV, tied weights, non-persistent buffers. Every unique
tensor is copied into segments with its strides; names that share a tensor
become aliases.

Post-processing (``process_weights_after_loading``): on CUDA the exported
tensors are post-processed and the engine re-runs the hooks in
already-processed mode. On CPU, vLLM's post-processing packs weights into
closures (oneDNN handles), not parameters, so nothing of it could be exported:
there the raw loaded weights are exported and the engine post-processes them
itself (``attrs["vllm.processed"] == "0"``).
"""

from __future__ import annotations

import socket
import time
from typing import Any

import xxhash

from wcached.config import ModelConfig
from wcached.errors import FillError
from wcached.keys import CacheKey
from wcached.loaders.layout import FilledModel, PhaseClock, alias_entries, fill_segments, plan_layout
from wcached.loaders.safetensors import DIGEST_ALGORITHM
from wcached.memory.base import MemoryBackend, ProgressFn, SegmentWriter
from wcached.protocol.messages import Manifest, SegmentInfo, TensorInfo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _span_bytes(t: Any) -> int:
    """Bytes from the tensor's first element to its last, strides included."""
    if t.numel() == 0:
        return 0
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return span * t.element_size()


def _rank(model: ModelConfig, instance: str) -> int:
    if instance in model.ranks:
        return model.ranks[instance]
    digits = "".join(ch for ch in instance if ch.isdigit())
    if instance.startswith("cpu") and digits:
        return int(digits)
    if model.tensor_parallel_size * model.pipeline_parallel_size == 1:
        return 0
    raise FillError(f"model {model.name!r}: no rank for instance {instance} (set model.ranks)")


def build_model(model: ModelConfig, instance: str, device_type: str):
    """vLLM config, then this rank's model loaded from disk (not post-processed)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.platforms import current_platform
    from vllm.utils.torch_utils import set_default_torch_dtype

    tp, pp = model.tensor_parallel_size, model.pipeline_parallel_size
    known = set(EngineArgs.__dataclass_fields__)
    unknown = sorted(set(model.engine_args) - known)
    if unknown:
        raise FillError(f"model {model.name!r}: unknown vLLM engine_args {unknown}")
    args = EngineArgs(
        model=model.path,
        dtype=model.dtype,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        skip_tokenizer_init=True,
        **model.engine_args,
    )
    vllm_config = args.create_engine_config()
    rank = _rank(model, instance)
    world = tp * pp
    if world > 1 and not model.rendezvous:
        raise FillError(f"model {model.name!r}: tensor/pipeline parallel needs model.rendezvous")
    init_method = model.rendezvous or f"tcp://127.0.0.1:{_free_port()}"
    local_rank = rank if device_type == "cpu" else 0
    init_distributed_environment(
        world_size=world,
        rank=rank,
        distributed_init_method=init_method,
        local_rank=local_rank,
        backend=current_platform.dist_backend,
    )
    model_config = vllm_config.model_config
    with set_current_vllm_config(vllm_config):
        ensure_model_parallel_initialized(tp, pp)
        loader = get_model_loader(vllm_config.load_config)
        target = torch.device(vllm_config.device_config.device)
        try:
            from vllm.v1.worker.workspace import init_workspace_manager

            init_workspace_manager(target)
        except ImportError:  # older vLLM
            pass
        with set_default_torch_dtype(model_config.dtype):
            with target:
                net = loader.create_model(vllm_config, model_config)
            loader.load_weights(net, model_config)
            processed = target.type != "cpu"
            if processed:
                from vllm.model_executor.model_loader.utils import process_weights_after_loading

                process_weights_after_loading(net, model_config, target)
    return vllm_config, net.eval(), processed, rank


class VllmLoader:
    def fill(
        self, model: ModelConfig, backend: MemoryBackend, instance: str, progress: ProgressFn
    ) -> FilledModel:
        from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank

        from wcached.integrations.vllm_keys import vllm_key_fields

        clock = PhaseClock()
        device_type = "cpu" if backend.name == "host" else "cuda"
        vllm_config, net, processed, _ = build_model(model, instance, device_type)
        clock.lap("vllm_load")

        unique: list[tuple[str, Any, str]] = []
        canonical: dict[int, str] = {}
        aliases: dict[str, str] = {}

        def add(name: str, t: Any, kind: str) -> None:
            if id(t) in canonical:
                aliases[name] = canonical[id(t)]
                return
            canonical[id(t)] = name
            unique.append((name, t, kind))

        for name, p in net.named_parameters(remove_duplicate=False):
            add(name, p, "param")
        # named_buffers includes non-persistent ones (rotary caches), which a
        # state_dict would miss.
        for name, b in net.named_buffers(remove_duplicate=False):
            add(name, b, "buffer")

        placements, seg_sizes = plan_layout(
            ((n, _span_bytes(t)) for n, t, _ in unique), model.segment_bytes, model.alignment
        )
        infos: list[TensorInfo] = []

        def copy(writers: list[SegmentWriter]) -> None:
            done = 0
            for (name, t, kind), p in zip(unique, placements, strict=True):
                digest = ""
                if p.nbytes:
                    hasher = xxhash.xxh3_128() if model.digest and device_type == "cpu" else None
                    writers[p.segment].copy_from_pointer(p.offset, t.data_ptr(), p.nbytes, hasher)
                    digest = hasher.hexdigest() if hasher is not None else ""
                infos.append(
                    TensorInfo(
                        name=name,
                        dtype=str(t.dtype).removeprefix("torch."),
                        shape=tuple(t.shape),
                        stride=tuple(t.stride()),
                        segment=p.segment,
                        offset=p.offset,
                        nbytes=p.nbytes,
                        kind=kind,
                        digest=digest,
                    )
                )
                done += p.nbytes
                progress(done)

        _, writers, fds = fill_segments(backend, model.name, seg_sizes, clock, copy)
        infos += alias_entries(infos, aliases)

        pp_group = get_pp_group()
        fields = vllm_key_fields(
            vllm_config.model_config,
            model.tensor_parallel_size,
            get_tensor_model_parallel_rank(),
            pp_group.world_size,
            pp_group.rank_in_group,
        )
        key = CacheKey(
            model=model.name,
            loader="vllm",
            fingerprint=fields["fingerprint"],
            dtype=fields["dtype"],
            tp_size=fields["tp_size"],
            tp_rank=fields["tp_rank"],
            pp_size=fields["pp_size"],
            pp_rank=fields["pp_rank"],
            extra={k[6:]: str(v) for k, v in fields.items() if k.startswith("extra.")},
        )
        attrs = {"vllm.processed": "1" if processed else "0"}
        if model.digest and device_type == "cpu":
            attrs["digest"] = DIGEST_ALGORITHM
        try:
            from vllm.model_executor.model_loader.weight_cache.utils import export_model_attrs

            attrs.update({f"vllm.attr.{k}": "1" if v else "0" for k, v in export_model_attrs(net).items()})
        except ImportError:
            pass
        manifest = Manifest(
            model=model.name,
            key=key,
            segments=[
                SegmentInfo(index=i, nbytes=w.nbytes, backend=backend.name, device=instance)
                for i, w in enumerate(writers)
            ],
            tensors=infos,
            total_bytes=sum(p.nbytes for p in placements),
            filled_at=time.time(),
            attrs=attrs,
        )
        return FilledModel(manifest, fds, clock.total(), clock.phases)
