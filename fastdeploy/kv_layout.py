"""What a KV cache's blocks look like: the descriptor that travels with transferred KV blocks.

A prefill instance and a decode instance can exchange blocks only when they agree on all of it
(same model, element type, block size, layer count, kv heads, head dimension and array layout);
`KVLayout.mismatch` names the first field that differs. `fastdeploy router` compares the layouts
its prefill and decode workers report before it pairs them, and the decode instance checks the
layout of every transfer it receives. It is plain data (no engine, no numpy), so both can read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from fastdeploy.errors import InvalidArgumentError

#: the built-in array layout: per layer, keys and values [blocks, block_size, kv_heads, head_dim]
#: in the cache's element type, then (int8 caches only) their float32 scales [blocks, block_size,
#: kv_heads]; a device plugin's transport may name its own
BLOCK_MAJOR = "blocks-slots-heads-dim"
#: the element type (numpy's name) of each cache dtype's blocks in that layout: bfloat16 as its bits
WIRE_DTYPES = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2", "int8": "i1"}


@dataclass(frozen=True)
class KVLayout:
    """The shape and meaning of one KV block, identical on both ends of a transfer."""

    #: the model's name (its checkpoint's file or directory name)
    model: str
    #: the cache's element type (`kv_cache_dtype` resolved: float32, float16, bfloat16, int8)
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    layout: str = BLOCK_MAJOR

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> KVLayout:
        """The layout a peer sent (JSON); an error naming what is missing or wrong."""
        if not isinstance(data, dict):
            raise InvalidArgumentError(f"a KV layout must be a JSON object, got {type(data).__name__}")
        values = {}
        for item in fields(cls):
            if item.name not in data:
                raise InvalidArgumentError(f"the KV layout lacks {item.name!r}")
            value = data[item.name]
            expected = int if item.type in ("int", int) else str
            if isinstance(value, bool) or not isinstance(value, expected):
                raise InvalidArgumentError(f"the KV layout's {item.name} must be a {expected.__name__}")
            values[item.name] = value
        return cls(**values)

    def mismatch(self, other: KVLayout) -> str | None:
        """Why blocks of `other` cannot go into a cache of this layout (None: they can)."""
        for item in fields(self):
            mine, theirs = getattr(self, item.name), getattr(other, item.name)
            if mine != theirs:
                return f"{item.name} {theirs!r} differs from {mine!r}"
        return None

    def arrays_per_layer(self) -> int:
        """Keys and values, plus their scales in an int8 cache."""
        return 4 if self.dtype == "int8" else 2
