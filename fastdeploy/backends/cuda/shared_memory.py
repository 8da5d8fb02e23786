"""How much shared memory a Triton program may use: the kernels pick their tile sizes from it.

Below both the kernel modules and the launcher (`launch.py` imports the kernels, the kernels
import only this), so neither imports the other's module.
"""

from __future__ import annotations

#: shared memory per program from which the prefill and MoE kernels take larger tiles (Hopper's
#: 227 KiB; an A100's 163 KiB does not fit them)
LARGE_SHARED_MEMORY = 200_000


def device_shared_memory() -> int | None:
    """Shared memory one program may use on the current GPU (bytes), from Triton's driver; None
    where it cannot say (the interpreter): the kernels then take tiles that fit every GPU."""
    try:
        from triton.runtime import driver  # optional dependency: only the Triton kernels need it

        properties = driver.active.utils.get_device_properties(driver.active.get_current_device())
        return int(properties["max_shared_mem"])
    except Exception:  # noqa: BLE001 - no GPU driver behind Triton: the conservative tiles
        return None
