"""Installs the fault-injection plugin as a distribution in a directory of its own.

An installed distribution is a module plus a `*.dist-info` directory (METADATA, entry_points.txt)
on `sys.path`; that is all `pip install` leaves behind, and all `importlib.metadata` reads to find
entry points. Writing one into a temporary directory gives the tests a real installed plugin,
visible only to the processes that put that directory on their path (`PYTHONPATH` for a server
process), so the rest of the suite never sees the `faulty` device.
"""

from __future__ import annotations

import os
import shutil

NAME = "fastdeploy-faults"
MODULE = "fastdeploy_faults"
VERSION = "0.1"


def install(directory: str) -> str:
    """Install the plugin into `directory` and return it (the path entry to add)."""
    here = os.path.dirname(os.path.abspath(__file__))
    shutil.copy(os.path.join(here, f"{MODULE}.py"), os.path.join(directory, f"{MODULE}.py"))
    dist_info = os.path.join(directory, f"{MODULE}-{VERSION}.dist-info")
    os.makedirs(dist_info, exist_ok=True)
    with open(os.path.join(dist_info, "METADATA"), "w", encoding="utf-8") as handle:
        handle.write(f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n")
    with open(os.path.join(dist_info, "entry_points.txt"), "w", encoding="utf-8") as handle:
        handle.write(f"[fastdeploy.plugins]\nfaults = {MODULE}\n")
    return directory
