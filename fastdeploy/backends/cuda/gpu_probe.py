"""Which NVIDIA GPUs this process may use, answered from device files and environment variables,
without importing a framework: `device="cuda"` on a machine without a GPU fails in milliseconds,
and the engine can hand each rank process its own GPU before that process imports anything."""

from __future__ import annotations

import glob
import os


def _driver_gpu_count() -> int:
    """GPUs the NVIDIA driver exposes (/proc lists each; /dev/nvidiaN when /proc is hidden)."""
    listed = glob.glob("/proc/driver/nvidia/gpus/*")
    return len(listed) if listed else len(glob.glob("/dev/nvidia[0-9]*"))


def visible_gpu_ids() -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries this process may use (indices or UUIDs), in order; every
    driver GPU ("0", "1", ...) when the variable is unset."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(index) for index in range(_driver_gpu_count())]
    ids = []
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):  # CUDA ignores everything from an invalid entry on
            break
        ids.append(entry)
    return ids


def visible_gpu_reason() -> str | None:
    """None when the NVIDIA driver exposes a GPU this process may use, else what is missing."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible_gpu_ids():
        return f"no GPU is visible: CUDA_VISIBLE_DEVICES={visible!r} hides them all"
    devices = glob.glob("/dev/nvidia[0-9]*") + glob.glob("/proc/driver/nvidia/gpus/*") + glob.glob("/dev/dxg")
    if not devices:  # (/dev/dxg: WSL's GPU)
        return "no NVIDIA GPU is visible (no /dev/nvidia0 device: no GPU, or its driver is not loaded)"
    return None


def local_gpu_index() -> int:
    """The GPU (among the visible ones) this process computes on: the one `paddle.distributed.launch`
    selected for a rank (`FLAGS_selected_gpus`), else the first."""
    selected = os.environ.get("FLAGS_selected_gpus", "").strip()  # noqa: SIM112 (paddle's name)
    return int(selected) if selected.isdigit() else 0
