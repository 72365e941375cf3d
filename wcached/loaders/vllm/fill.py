"""The vLLM loader: fill with vLLM's own model loading, in the loader worker.

The worker builds this instance's rank of the model exactly as an engine
worker would (joining a torch.distributed group with the other instances of
the model when tensor/pipeline parallel), through vLLM's own ``load_model``,
so what it exports are the engine's own parameters: fused QKV, tied weights,
non-persistent buffers, quantized layers.

Which form it exports (``attrs["vllm.form"]``), so that no post-processing
step ever runs twice over the weights:

- ``processed``: after ``process_weights_after_loading``; the engine re-runs
  the hooks under vLLM's ``weights_already_processed`` (releases that have it,
  on GPUs).
- ``loaded``: loaded but not post-processed; the engine post-processes once.
  Used on CPU (vLLM packs CPU weights into oneDNN handles kept in closures,
  which no process can share) and with releases that have no
  already-processed mode (vLLM 0.26/0.27). Layers that vLLM processed while
  loading (online quantization processes each layer as soon as it is loaded)
  are listed in ``attrs["vllm.processed_modules"]`` so that the engine marks
  them done instead of processing them again.

Memory: on a GPU, vLLM builds the model in an arena of exportable chunks
(:mod:`wcached.memory.cuda_arena`): the chunks are the segments, and the fill
needs the weights once. Elsewhere (the host, ``build_in_place = false``, what
torch placed outside the arena) each storage (tied weights and views share
one) is copied into the segment being filled and then freed with
``untyped_storage().resize_(0)``, segment by segment: the weights once plus
one segment, not twice.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from wcached import tensor_digest
from wcached.errors import FillError, FillMisconfigured, UnservableModel, WcacheError
from wcached.keys import CacheKey
from wcached.loaders.checkpoint import Checkpoint
from wcached.loaders.layout import (
    READ,
    FilledModel,
    PhaseClock,
    alias_entries,
    fill_segments_in_order,
    plan_layout,
)
from wcached.loaders.vllm import VllmModel
from wcached.loaders.vllm.key import PROCESSED_GUARD, vllm_cache_key
from wcached.memory.base import MemoryBackend, ProgressFn, SegmentWriter
from wcached.protocol.messages import Manifest, SegmentInfo, TensorInfo
from wcached.protocol.wire import close_fds

log = logging.getLogger("wcached.worker")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What the operator's environment set: theirs wins over ours.
_OPERATOR_ENV = frozenset(os.environ)


def _set_env(name: str, value: str) -> None:
    """Set for this model's fill (a worker fills every model of its
    instance in turn, so a value must not carry over from the last one)."""
    if name not in _OPERATOR_ENV:
        os.environ[name] = value


def _is_loopback(init_method: str) -> bool:
    host = init_method.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def span_bytes(t: Any) -> int:
    """Bytes from the tensor's first element to its last, strides included."""
    if t.numel() == 0:
        return 0
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return span * t.element_size()


def has_preprocessed_mode() -> bool:
    """Whether this vLLM can re-run post-processing over processed weights."""
    try:
        from vllm.model_executor.utils import weights_already_processed  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def _without_post_processing() -> Iterator[None]:
    """vLLM's ``load_model`` with its final ``process_weights_after_loading``
    left out (the engine runs it once, over the attached weights)."""
    from vllm.model_executor.model_loader import base_loader

    if not hasattr(base_loader, "process_weights_after_loading"):
        raise FillMisconfigured(
            "this vLLM's BaseModelLoader.load_model does not call process_weights_after_loading "
            "where wcached can leave it out; the loaded form cannot be exported"
        )
    original = base_loader.process_weights_after_loading
    base_loader.process_weights_after_loading = lambda *args, **kwargs: None
    try:
        yield
    finally:
        base_loader.process_weights_after_loading = original


@contextlib.contextmanager
def _timed_weights(loader: Any, clock: PhaseClock | None) -> Iterator[None]:
    """The phases of vLLM's model load: ``vllm_construct`` up to its
    ``load_weights`` (the model built, its parameters allocated), ``read``
    for the weights read from the checkpoint into them; what follows is the
    caller's next lap (post-processing). A loader that loads its weights
    another way leaves the whole load to the caller's lap."""
    if clock is None or not callable(getattr(loader, "load_weights", None)):
        yield
        return
    load_weights = loader.load_weights

    def timed(*args: Any, **kwargs: Any) -> Any:
        clock.lap("vllm_construct")
        try:
            return load_weights(*args, **kwargs)
        finally:
            clock.lap(READ)

    loader.load_weights = timed
    try:
        yield
    finally:
        del loader.load_weights  # the class's own again


@dataclass
class BuiltModel:
    vllm_config: Any
    net: Any
    form: str  # "processed" or "loaded"
    rank: int
    key: CacheKey
    processed_modules: list[str] = field(default_factory=list)


def build_model(
    model: VllmModel,
    instance: str,
    device_type: str,
    allocating: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    clock: PhaseClock | None = None,
) -> BuiltModel:
    """vLLM config, then this rank's model loaded by vLLM's own loader.
    ``allocating`` is entered around the loading alone (the model's
    construction, its weights and their post-processing), not around vLLM's
    set-up: its process group and workspaces are not the model's."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.platforms import current_platform

    tp, pp = model.tensor_parallel_size, model.pipeline_parallel_size
    known = set(EngineArgs.__dataclass_fields__)
    unknown = sorted(set(model.engine_args) - known)
    if unknown:
        raise FillMisconfigured(f"model {model.name!r}: unknown vLLM engine_args {unknown}")
    extra: dict[str, Any] = dict(model.engine_args)
    if model.role == "draft":
        # Built as vLLM builds a speculative draft (its runner type).
        extra.setdefault("runner", "draft")
    if tp * pp > 1:
        # Each instance's worker is one rank and sees one GPU; an explicit
        # backend keeps vLLM from asking for all of them in this process
        # (nothing is launched: the worker joins the ranks itself).
        extra.setdefault("distributed_executor_backend", "mp")
        # vLLM's custom all-reduce maps every rank's GPU into each process;
        # a fill runs no collective kernels, and each worker sees one GPU.
        extra.setdefault("disable_custom_all_reduce", True)
        _set_env("VLLM_ALLREDUCE_USE_SYMM_MEM", "0")
    args = EngineArgs(
        model=model.path,
        dtype=model.dtype,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        skip_tokenizer_init=True,
        **extra,
    )
    vllm_config = args.create_engine_config()
    rank = model.rank_of(instance)
    world = tp * pp
    if world > 1 and not model.rendezvous:
        raise FillMisconfigured(f"model {model.name!r}: tensor/pipeline parallel needs model.rendezvous")
    init_method = model.rendezvous or f"tcp://127.0.0.1:{_free_port()}"
    if world > 1 and _is_loopback(init_method):
        # The ranks are instances on this host: gloo and NCCL talk over
        # loopback, not over whatever interface the host name resolves to
        # (which the unit's IPAddressDeny= blocks, and which may not resolve).
        _set_env("GLOO_SOCKET_IFNAME", "lo")
        _set_env("NCCL_SOCKET_IFNAME", "lo")
    # vLLM's CPU communicator names its shared-memory group by this (its CPU
    # executor sets it in an engine); the same on every rank of the fill.
    _set_env("VLLM_DIST_IDENT", f"wcached-{model.name}-{init_method.rsplit(':', 1)[-1]}")
    # On a GPU the worker sees only its own device (CUDA_VISIBLE_DEVICES is
    # the instance's UUID), so every rank builds on its local device 0.
    local_rank = rank if device_type == "cpu" else 0
    if device_type != "cpu":
        torch.cuda.set_device(0)
    # An engine worker sets this from its config before joining its group.
    from vllm.distributed import parallel_state

    if hasattr(parallel_state, "set_custom_all_reduce"):
        parallel_state.set_custom_all_reduce(not vllm_config.parallel_config.disable_custom_all_reduce)
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
        # Before any weight is loaded: post-processing may rewrite the
        # checkpoint's quantization config, which the key hashes.
        key = vllm_cache_key(model.name, vllm_config, model_config, model.role)
        loader = get_model_loader(vllm_config.load_config)
        try:
            from vllm.v1.worker.workspace import init_workspace_manager

            init_workspace_manager(torch.device(vllm_config.device_config.device))
        except ImportError:  # older vLLM
            pass
        form = "loaded"
        if clock is not None:
            clock.lap("vllm_setup")
        if device_type == "cpu":
            # vLLM's load_model empties an accelerator cache that a CPU host
            # does not have; the engine's CPU worker creates and loads the
            # model in these two steps too.
            with _timed_weights(loader, clock):
                net = _create_and_load(loader, vllm_config, model_config)
        else:
            with allocating(), _without_post_processing(), _timed_weights(loader, clock):
                net = loader.load_model(vllm_config=vllm_config, model_config=model_config)
            # Processed here only where the engine can re-run every layer's
            # hooks in vLLM's already-processed mode (a quant method without
            # supports_pre_processed_weights would refuse it); otherwise the
            # engine post-processes the loaded form once.
            if has_preprocessed_mode() and all(
                getattr(m.quant_method, "supports_pre_processed_weights", False)
                for _, m in net.named_modules()
                if getattr(m, "quant_method", None) is not None
            ):
                from vllm.model_executor.model_loader.utils import process_weights_after_loading
                from vllm.utils.torch_utils import set_default_torch_dtype

                target = torch.device(vllm_config.device_config.device)
                with allocating(), set_default_torch_dtype(model_config.dtype):
                    process_weights_after_loading(net, model_config, target)
                form = "processed"
    processed = [name for name, m in net.named_modules() if getattr(m, PROCESSED_GUARD, False)]
    if form == "loaded":
        refuse_post_processed(model.name, model_config.quantization, net, set(processed))
    return BuiltModel(vllm_config, net.eval(), form, rank, key, processed)


# Quant methods whose post-processing leaves the weights it is given alone
# (the KV-cache methods adjust scales, which are buffers and copied).
TAKES_LOADED_FORM = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod", "UnquantizedFusedMoEMethod")


def refuse_post_processed(name: str, quantization: str | None, net: Any, processed: set[str]) -> None:
    """The loaded form is post-processed by each engine: a quant method that
    rewrites its weights then (repacking, transposing) would leave every
    engine a full copy of its own beside the daemon's, or write into
    read-only pages. Refused at fill, naming the method, rather than filled
    for engines that cannot use it. Layers processed while loading (online
    quantization) are already in their final form and marked done."""
    try:
        from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod
    except ImportError:
        BaseKVCacheMethod = ()
    for layer, module in net.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or layer in processed or isinstance(method, BaseKVCacheMethod):
            continue
        if type(method).__name__ in TAKES_LOADED_FORM:
            continue
        raise UnservableModel(
            f"model {name!r}: quantization {quantization!r} ({type(method).__name__}, layer {layer}) "
            "post-processes its weights in each engine, and this vLLM cannot take them back already "
            'processed; serve this model from disk, or quantize it online (quantization = "fp8" '
            "over an unquantized checkpoint)"
        )


def _create_and_load(loader: Any, vllm_config: Any, model_config: Any) -> Any:
    import torch
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_default_torch_dtype(model_config.dtype):
        with torch.device(vllm_config.device_config.device):
            create = getattr(loader, "create_model", None)
            if create is not None:
                net = create(vllm_config, model_config)
            else:  # vLLM 0.26/0.27
                from vllm.model_executor.model_loader.utils import initialize_model

                net = initialize_model(vllm_config=vllm_config, model_config=model_config)
        loader.load_weights(net, model_config)
    return net


@dataclass
class _Storage:
    """One storage's byte span and the tensors that view it."""

    start: int  # address of the first byte any of its tensors uses
    nbytes: int
    storage: Any
    members: list[tuple[str, Any, str]] = field(default_factory=list)


def group_by_storage(tensors: list[tuple[str, Any, str]], alignment: int = 256) -> list[_Storage]:
    """Tensors grouped by the storage they view, in first-seen order; a
    storage is copied once, however many tensors (views, ties) share it."""
    by_storage: dict[int, _Storage] = {}
    empty: list[_Storage] = []
    for name, t, kind in tensors:
        n = span_bytes(t)
        if n == 0:
            empty.append(_Storage(0, 0, None, [(name, t, kind)]))
            continue
        storage = t.untyped_storage()
        key = storage.data_ptr()
        ptr = t.data_ptr()
        group = by_storage.get(key)
        if group is None:
            group = by_storage[key] = _Storage(ptr, n, storage, [])
        end = max(group.start + group.nbytes, ptr + n)
        # The span starts at a multiple of `alignment` from the storage's
        # base, so every member keeps its alignment (and element size
        # multiple) when the span lands at an aligned segment offset.
        start = min(group.start, ptr)
        group.start = key + (start - key) // alignment * alignment
        group.nbytes = end - group.start
        group.members.append((name, t, kind))
    return list(by_storage.values()) + empty


def _forget_shared_modules() -> None:
    """vLLM shares rotary-embedding modules between models of the same shape
    (``get_rope`` caches them by parameters): a previous fill in this worker
    copied and freed their buffers, so the next model must build its own."""
    try:
        from vllm.model_executor.layers.rotary_embedding import _ROPE_DICT
    except ImportError:
        return
    _ROPE_DICT.clear()


def _check_alive(group: _Storage) -> None:
    """A storage freed by an earlier copy (shared with another model through
    a cache this worker does not know of) would be read past its end."""
    storage = group.storage
    if storage is not None and group.start + group.nbytes > storage.data_ptr() + storage.nbytes():
        name = group.members[0][0]
        raise FillError(f"tensor {name} has lost its memory (shared with a model filled before it?)")


def _free(storage: Any) -> None:
    # Dropping references is not enough: vLLM keeps some (FSDP2's
    # free_storage does the same).
    with contextlib.suppress(RuntimeError):  # not resizable (from_blob): cannot be freed here
        storage.resize_(0)


def fill(model: VllmModel, backend: MemoryBackend, instance: str, progress: ProgressFn) -> FilledModel:
    """This instance's rank of ``model``, loaded by vLLM: on a GPU built in
    exportable chunks (:mod:`wcached.memory.cuda_arena`), else copied into
    segments; what torch placed outside the chunks is copied too."""
    import torch

    clock = PhaseClock()
    device_type = _device_type(backend)
    if device_type != "cpu":
        # This model's peak, not the last one's (measurement only).
        with contextlib.suppress(RuntimeError):
            torch.cuda.reset_peak_memory_stats()
    peak = _PeakMemory(backend)
    _forget_shared_modules()
    arena = _open_arena(model, backend) if device_type != "cpu" else None
    built = build_model(
        model, instance, device_type, arena.allocating if arena else contextlib.nullcontext, clock
    )
    net = built.net
    peak.sample()
    if device_type != "cpu":
        # vLLM's transient peak while loading (quantizing, say).
        peak.include(torch.cuda.max_memory_allocated())
    # After the weights' reading: vLLM's post-processing (all of its load
    # where its loader read the weights another way).
    clock.lap("vllm_post" if READ in clock.phases else "vllm_load")

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

    storages = group_by_storage(unique, model.alignment)
    # Host bytes are hashed by the CPU, GPU bytes on the GPU (no copy back).
    algorithm = (tensor_digest.HOST if device_type == "cpu" else tensor_digest.DEVICE) if model.digest else ""
    if device_type != "cpu":
        torch.cuda.synchronize()  # vLLM's kernels have written everything
    total = sum(g.nbytes for g in storages)
    done = 0
    progress(0, total)

    def report(nbytes: int) -> None:
        nonlocal done
        done += nbytes
        progress(done, total)

    infos: dict[str, TensorInfo] = {}
    segment_sizes: list[int] = []
    fds: list[int] = []
    # Storages built in the arena's chunks: one segment per chunk, no copy.
    placed: list[tuple[int, int] | None] = [None] * len(storages)
    try:
        if arena is not None:
            placed, segment_sizes, fds = _export_arena(arena, storages, model.alignment, clock)
        for i, place in enumerate(placed):
            if place is not None:
                _record(infos, storages[i], *place)
                report(storages[i].nbytes)
        if algorithm:
            _digest(infos, [storages[i] for i, p in enumerate(placed) if p is not None], algorithm)
            clock.lap("digest")
        # The rest (everything off a GPU, or what torch placed elsewhere) is
        # copied into segments of its own after the chunks.
        copied = [i for i, p in enumerate(placed) if p is None]
        copy_sizes, copy_fds = _copy_storages(
            model,
            backend,
            [storages[i] for i in copied],
            first_segment=len(segment_sizes),
            infos=infos,
            algorithm=algorithm,
            clock=clock,
            peak=peak,
            report=report,
        )
    except BaseException:
        close_fds(fds)
        raise
    segment_sizes += copy_sizes
    fds += copy_fds
    entries = [infos[name] for name, _, _ in unique]
    entries += alias_entries(entries, aliases)

    key = built.key
    attrs = {
        "vllm.form": built.form,
        "vllm.processed_modules": ",".join(built.processed_modules),
    }
    if algorithm:
        attrs["digest"] = algorithm
    if model.fingerprint == "content":
        # The key keeps the header fingerprint (what an engine computes
        # cheaply to match); every checkpoint byte's hash is recorded
        # beside it for `wcached verify`.
        attrs["checkpoint.content"] = Checkpoint(model.path).content_digest()
    try:
        from vllm.model_executor.model_loader.weight_cache.utils import export_model_attrs

        attrs.update({f"vllm.attr.{k}": "1" if v else "0" for k, v in export_model_attrs(net).items()})
    except ImportError:
        pass
    manifest = Manifest(
        model=model.name,
        key=key,
        segments=[
            SegmentInfo(index=i, nbytes=n, backend=backend.name, device=instance)
            for i, n in enumerate(segment_sizes)
        ],
        tensors=entries,
        total_bytes=total,
        filled_at=time.time(),
        attrs=attrs,
    )
    return FilledModel(
        manifest,
        fds,
        clock.total(),
        clock.phases,
        peak_device_bytes=peak.bytes,
        read_bytes=checkpoint_bytes(model) if READ in clock.phases else 0,
    )


def _device_type(backend: MemoryBackend) -> str:
    """The torch device type a model is built on for ``backend``."""
    return "cpu" if backend.name == "host" else "cuda"


def _open_arena(model: VllmModel, backend: MemoryBackend) -> Any:
    """The arena the model is built in, or None to copy it (the model asks
    to, or this torch cannot route its allocations)."""
    if not model.build_in_place:
        return None
    from wcached.memory import cuda_arena

    reason = cuda_arena.unsupported_reason()
    if reason is not None:
        log.warning(
            "%s: built in vLLM's own memory and copied (the model's memory plus one segment at the peak): %s",
            model.name,
            reason,
            extra={"model": model.name},
        )
        return None
    return cuda_arena.CudaArena(
        backend,  # type: ignore[arg-type]
        model.segment_bytes,
        model.name,
        expected_bytes=expected_bytes(model),
    )


# The arena's estimate of a rank's bytes errs high: one a little high leaves
# that much of the last chunk unused, one a little low can leave a big tensor
# that comes last (an untied lm_head) a chunk of its own beside a last chunk
# that holds little. vLLM adds buffers (rotary caches) to the checkpoint's
# tensors, and torch rounds each request up to 2 MiB.
EXPECTED_MARGIN = 0.01
EXPECTED_SLACK = 64 << 20


def expected_bytes(model: VllmModel) -> int | None:
    """What this rank's weights are expected to take on the device, from the
    checkpoint's headers (its tensors as ``dtype`` serves them, split over
    the ranks), a little high; None where the headers cannot say: online
    quantization, a hub id, no safetensors."""
    if model.engine_args.get("quantization"):
        return None
    try:
        headers = Checkpoint.of(model).headers()
    except (WcacheError, OSError) as e:
        log.debug("%s: no expected size for its arena: %s", model.name, e, extra={"model": model.name})
        return None
    stored = sum(math.prod(t.shape) * model.served_dtype(t.dtype).itemsize for t in headers.tensors)
    return int(stored / model.world_size * (1 + EXPECTED_MARGIN)) + EXPECTED_SLACK


def checkpoint_bytes(model: VllmModel) -> int:
    """The bytes vLLM reads from the checkpoint (every rank reads all of its
    tensors and keeps its share); 0 where the headers cannot say."""
    try:
        return sum(t.nbytes for t in Checkpoint.of(model).headers().tensors)
    except (WcacheError, OSError):
        return 0


def _export_arena(
    arena: Any, storages: list[_Storage], alignment: int, clock: PhaseClock
) -> tuple[list[tuple[int, int] | None], list[int], list[int]]:
    """Export the arena's chunks that hold storages: where each storage is
    (segment, offset), or None to copy it; the segments' sizes; their fds."""
    sealed, fds = arena.seal([(g.start, g.nbytes) for g in storages])
    placed: list[tuple[int, int] | None] = []
    for place, g in zip(sealed.places, storages, strict=True):
        if not g.nbytes:
            # Empty tensors need a segment to name; the first has room for none.
            placed.append((0, 0) if sealed.chunks else None)
        elif place is None or place[1] % alignment:
            # Elsewhere, or off the model's alignment in its chunk (torch
            # places blocks at 512 bytes): copied, its chunk exported unused.
            placed.append(None)
        else:
            placed.append(place)
    clock.lap("export")
    copied = [g for p, g in zip(placed, storages, strict=True) if p is None and g.nbytes]
    log.info(
        "%s built in place: %d segments of %.2f GiB, %.2f GiB of it held by no tensor "
        "(torch's rounding, the load's freed buffers, the last chunk's tail); "
        "%d chunks holding none not exported; %d storages to copy",
        arena.label,
        len(sealed.chunks),
        sum(c.nbytes for c in sealed.chunks) / 2**30,
        sealed.dead_bytes / 2**30,
        sealed.unexported,
        len(copied),
        extra={"model": arena.label},
    )
    if copied:
        log.warning(
            "%s: %d storages (%.2f GiB, the first %s) were not built where they are served and are "
            "copied (torch placed them outside the arena, or off the model's alignment of %d)",
            arena.label,
            len(copied),
            sum(g.nbytes for g in copied) / 2**30,
            copied[0].members[0][0],
            alignment,
            extra={"model": arena.label},
        )
    return placed, [c.nbytes for c in sealed.chunks], fds


def _record(infos: dict[str, TensorInfo], group: _Storage, segment: int, offset: int) -> None:
    """Manifest entries of a storage's tensors, the storage's span at
    ``offset`` of ``segment``."""
    for name, t, kind in group.members:
        infos[name] = TensorInfo(
            name=name,
            dtype=str(t.dtype).removeprefix("torch."),
            shape=tuple(t.shape),
            stride=tuple(t.stride()),
            segment=segment,
            offset=offset + (t.data_ptr() - group.start if group.nbytes else 0),
            nbytes=span_bytes(t),
            kind=kind,
        )


def _digest(infos: dict[str, TensorInfo], groups: list[_Storage], algorithm: str) -> None:
    """Each tensor's digest, of the bytes it has where it was built (GPU
    tensors in one kernel launch)."""
    named = [(name, t) for group in groups for name, t, _ in group.members if infos[name].nbytes]
    got = tensor_digest.digests([(t, infos[name].nbytes) for name, t in named], algorithm)
    for (name, _), d in zip(named, got, strict=True):
        infos[name] = msgspec.structs.replace(infos[name], digest=d)


def _copy_storages(
    model: VllmModel,
    backend: MemoryBackend,
    storages: list[_Storage],
    *,
    first_segment: int,
    infos: dict[str, TensorInfo],
    algorithm: str,
    clock: PhaseClock,
    peak: _PeakMemory,
    report: Callable[[int], None],
) -> tuple[list[int], list[int]]:
    """Copy ``storages`` into segments numbered from ``first_segment``, each
    freed once copied (the copy needs one segment beyond them); returns the
    segments' sizes and fds."""
    import torch

    if not storages:
        return [], []
    on_gpu = _device_type(backend) != "cpu"
    placements, seg_sizes = plan_layout(
        ((g.members[0][0], g.nbytes) for g in storages), model.segment_bytes, model.alignment
    )
    by_segment: list[list[int]] = [[] for _ in seg_sizes]
    for i, p in enumerate(placements):
        by_segment[p.segment].append(i)

    def copy(index: int, writer: SegmentWriter) -> None:
        peak.sample()
        for i in by_segment[index]:
            group, p = storages[i], placements[i]
            if group.nbytes:
                _check_alive(group)
                writer.copy_from_pointer(p.offset, group.start, group.nbytes, None)
            _record(infos, group, first_segment + p.segment, p.offset)
            report(group.nbytes)
        if algorithm:
            # Of vLLM's copies, before they are freed: the bytes just copied.
            clock.lap("copy")
            _digest(infos, [storages[i] for i in by_segment[index]], algorithm)
            clock.lap("digest")
        # This segment holds them now: give vLLM's copies back before the
        # next segment is allocated.
        for i in by_segment[index]:
            if storages[i].storage is not None:
                _free(storages[i].storage)
        if on_gpu:
            torch.cuda.empty_cache()

    writers, fds = fill_segments_in_order(backend, model.name, seg_sizes, clock, copy)
    return [w.nbytes for w in writers], fds


class _PeakMemory:
    """Device memory this fill used at its peak, above what was in use before
    it started (vLLM's copy, the segments, the CUDA context's growth)."""

    def __init__(self, backend: MemoryBackend):
        self.used = getattr(backend, "device_used_bytes", None)
        self.base = self.used() if self.used else 0
        self.bytes: int | None = 0 if self.used else None

    def sample(self) -> None:
        if self.used is not None:
            self.include(self.used() - self.base)

    def include(self, nbytes: int) -> None:
        if self.bytes is not None:
            self.bytes = max(self.bytes, nbytes)
