"""Is an NVIDIA GPU visible to this process? Answered from device files, without importing a
framework, so `device="cuda"` on a machine without a GPU fails in milliseconds."""

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
