"""``make run``: generate a small Llama-shaped checkpoint and serve it on cpu0.

The checkpoint is written without torch or numpy (the safetensors layout is a
JSON header and raw bytes), so the demo needs only wcached's own dependencies.
Values are deterministic bf16 in +-[2^-7, 2^-5), norms are ones.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import struct
import sys
import threading
import time
from pathlib import Path

LLAMA_TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 2048,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
}

# Random byte -> high byte of a bf16 of exponent 120/121 with the byte's sign.
_HI = bytes((r & 0x80) | 0x3C for r in range(256))
_ONE_BF16 = struct.pack("<H", 0x3F80)


def llama_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = [("model.embed_tokens.weight", (v, h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
        ]
    shapes.append(("model.norm.weight", (h,)))
    if not cfg.get("tie_word_embeddings"):
        shapes.append(("lm_head.weight", (v, h)))
    return shapes


def random_bf16(rng: random.Random, count: int) -> bytes:
    lo = rng.randbytes(count)
    hi = rng.randbytes(count).translate(_HI)
    out = bytearray(2 * count)
    out[0::2] = lo
    out[1::2] = hi
    return bytes(out)


def write_safetensors(path: Path, tensors: list[tuple[str, str, tuple[int, ...], bytes]]) -> None:
    """Write ``(name, dtype, shape, data)`` entries in the safetensors layout."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep tensor data 8-byte aligned
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, _, _, data in tensors:
            f.write(data)
    os.replace(tmp, path)


def generate_llama(out: Path, cfg: dict = LLAMA_TINY, shards: int = 2, seed: int = 0) -> Path:
    """Write a sharded bf16 Llama checkpoint with index and config.json."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    entries = []
    for name, shape in llama_shapes(cfg):
        n = math.prod(shape)
        data = _ONE_BF16 * n if name.endswith("norm.weight") else random_bf16(rng, n)
        entries.append((name, "BF16", shape, data))
    per = math.ceil(len(entries) / shards)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = entries[s * per : (s + 1) * per]
        write_safetensors(out / fname, part)
        weight_map.update({e[0]: fname for e in part})
    total = sum(len(e[3]) for e in entries)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    write_word_tokenizer(out, cfg["vocab_size"])
    return out


def write_word_tokenizer(out: Path, vocab_size: int) -> None:
    """A word-level tokenizer (token i is the word ``w<i>``), so that
    ``vllm serve`` runs on the generated checkpoint as on a real one."""
    specials = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab = {**specials, **{f"w{i}": i for i in range(len(specials), vocab_size)}}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for t, i in specials.items()
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": 2048,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


DEMO_CONFIG = """\
# Written by `make run` (wcached.cli.demo); the documented default is etc/wcache/wcached.toml.
[daemon]
socket_dir = "run"

[[model]]
name = "default"
path = "model"
loader = "safetensors"
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="serve a generated tiny Llama on cpu0")
    p.add_argument("--dir", default="build/demo", help="where the model, config and socket go")
    p.add_argument("--instance", default="cpu0")
    p.add_argument("--generate-only", action="store_true")
    args = p.parse_args(argv)
    root = Path(args.dir).resolve()
    model = root / "model"
    if not (model / "model.safetensors.index.json").exists():
        print(f"generating a tiny Llama checkpoint in {model}", file=sys.stderr)
        generate_llama(model)
    config = root / "wcached.toml"
    if not config.exists():
        config.write_text(DEMO_CONFIG)
    if args.generate_only:
        return 0
    sock = root / "run" / f"{args.instance}.sock"
    # The commands as a new shell runs them: this interpreter and its
    # wcached script by their full paths (no venv activated there).
    python = sys.executable
    wcached = Path(python).parent / "wcached"
    wcached_cmd = str(wcached) if wcached.exists() else f"{python} -m wcached"
    howto = (
        f"serving {model} on {args.instance}; attach from another shell with:\n"
        f"  {python} -c \"from wcached.client import attach; a = attach('default', '{args.instance}', "
        f"socket_dir='{sock.parent}'); print(len(a.tensors), 'tensors')\"\n"
        f"  {wcached_cmd} status --config {config}\n"
        "Ctrl-C stops it."
    )
    threading.Thread(target=_announce_when_ready, args=(str(sock), howto), daemon=True).start()
    from wcached.daemon.service import serve

    return serve(args.instance, str(config))


def _announce_when_ready(sock: str, howto: str) -> None:
    """Print how to attach once the daemon answers on its socket (not before:
    a client started earlier would find nothing there)."""
    from wcached.client.connection import DaemonConnection
    from wcached.errors import WcacheError

    while True:
        try:
            with DaemonConnection(sock, timeout=2.0, client="make run") as conn:
                conn.status()
        except (WcacheError, OSError):
            time.sleep(0.1)
            continue
        print(howto, file=sys.stderr, flush=True)
        return


if __name__ == "__main__":
    sys.exit(main())
