"""Element types as safetensors names them, with the torch name and size.

The daemon and the host-memory loader need sizes only, so this table has no
torch import; clients map the torch name with ``getattr(torch, name)``.
"""

from __future__ import annotations

from typing import NamedTuple


class Dtype(NamedTuple):
    safetensors: str
    torch: str
    itemsize: int
    # Cast by a model's dtype policy (fp8 and integers keep their type).
    castable: bool


DTYPES: dict[str, Dtype] = {
    d.safetensors: d
    for d in (
        Dtype("F64", "float64", 8, True),
        Dtype("F32", "float32", 4, True),
        Dtype("F16", "float16", 2, True),
        Dtype("BF16", "bfloat16", 2, True),
        Dtype("F8_E4M3", "float8_e4m3fn", 1, False),
        Dtype("F8_E5M2", "float8_e5m2", 1, False),
        Dtype("I64", "int64", 8, False),
        Dtype("I32", "int32", 4, False),
        Dtype("I16", "int16", 2, False),
        Dtype("I8", "int8", 1, False),
        Dtype("U64", "uint64", 8, False),
        Dtype("U32", "uint32", 4, False),
        Dtype("U16", "uint16", 2, False),
        Dtype("U8", "uint8", 1, False),
        Dtype("BOOL", "bool", 1, False),
    )
}

BY_TORCH_NAME: dict[str, Dtype] = {d.torch: d for d in DTYPES.values()}
