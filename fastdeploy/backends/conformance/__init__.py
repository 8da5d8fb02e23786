"""Backend conformance checks: what any device backend must compute, against numpy references.

A backend plugin runs these against itself; fastdeploy's test suite runs them for every
available registered backend (`tests/backends/test_conformance.py`, devices chosen with
`FD_CONFORMANCE_DEVICES`). The checks follow the contract's three parts:

- `PLATFORM_CHECKS`: identity, availability, ranks, memory, the capability declaration;
- `OP_CHECKS`: each primitive of the ops part;
- `CAPABILITY_CHECKS`: each optional capability (its portable default where the backend does not
  declare it; skipped with a reason where there is none).

Each check takes a built backend and raises AssertionError with the op's name on a mismatch, or
returns a string saying why it does not apply. `ALL_CHECKS` holds all three under prefixed names.
`fastdeploy.plugins.api.check_greedy_generation` builds a whole `LLM` on the device from a tiny
random checkpoint and compares its greedy tokens with a numpy forward pass.

Tolerances are float32's; a backend computing in lower precision runs them with dtype float32.
"""

from __future__ import annotations

from collections.abc import Callable

from fastdeploy.backends.base import Backend, BackendOptions
from fastdeploy.backends.conformance.capability_checks import CAPABILITY_CHECKS
from fastdeploy.backends.conformance.op_checks import (
    check_activations,
    check_embedding_and_gather,
    check_kv_cache_layers_are_independent,
    check_layer_norm,
    check_linear,
    check_paged_attention,
    check_rms_norm,
    check_rotary,
    check_verify_attention_and_rollback,
)
from fastdeploy.backends.conformance.platform_checks import PLATFORM_CHECKS
from fastdeploy.backends.selection import create_backend
from fastdeploy.plugins.registry import get_registry


def build_backend(device: str, threads: int | None = None) -> Backend:
    """The registered backend `device`, built as an `LLM` would build it (float32)."""
    return create_backend(device, BackendOptions(threads=threads), get_registry())


#: op-level checks of the primitives every backend implements, each `check(backend) -> None`
OP_CHECKS: dict[str, Callable[[Backend], str | None]] = {
    "embedding_and_gather": check_embedding_and_gather,
    "linear": check_linear,
    "rms_norm": check_rms_norm,
    "layer_norm": check_layer_norm,
    "activations": check_activations,
    "rotary": check_rotary,
    "paged_attention": check_paged_attention,
    "kv_cache_layers": check_kv_cache_layers_are_independent,
    "verify_attention": check_verify_attention_and_rollback,
}

#: every check: "platform/NAME", "op/NAME" and "capability/NAME" (the capability's value)
ALL_CHECKS: dict[str, Callable[[Backend], str | None]] = {
    **{f"platform/{name}": check for name, check in PLATFORM_CHECKS.items()},
    **{f"op/{name}": check for name, check in OP_CHECKS.items()},
    **{f"capability/{capability.value}": check for capability, check in CAPABILITY_CHECKS.items()},
}

__all__ = ["ALL_CHECKS", "CAPABILITY_CHECKS", "OP_CHECKS", "PLATFORM_CHECKS", "build_backend"]
