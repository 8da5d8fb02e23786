"""Is an NVIDIA GPU visible to this process, and which one does it compute on? Answered from
device files and environment variables without importing a framework, so `device="cuda"` on a
machine without a GPU fails in milliseconds."""

from __future__ import annotations

import glob
import os


def visible_gpu_reason() -> str | None:
    """None when the NVIDIA driver exposes a GPU this process may use, else what is missing."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
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


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs), or
    the driver's device files' indices when it is unset (ranks of tensor parallelism take one each)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [device.strip() for device in visible.split(",") if device.strip() not in ("", "-1")]
    return sorted((path[len("/dev/nvidia") :] for path in glob.glob("/dev/nvidia[0-9]*")), key=int)
