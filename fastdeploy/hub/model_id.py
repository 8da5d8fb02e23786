"""What a hub model id looks like: `org/name`, or `org/name:QUANT` for one GGUF of a repository
(llama.cpp's `-hf` form, e.g. `Qwen/Qwen3-0.6B-GGUF:Q8_0`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_HUB_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)"
    r"(?::(?P<quant>[A-Za-z0-9][A-Za-z0-9._-]*))?$"
)


@dataclass(frozen=True)
class HubModelId:
    """A repository on a hub and, optionally, the quantisation tag of the GGUF to take from it."""

    repo_id: str
    quant: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f":{self.quant}" if self.quant else "")


def parse_hub_id(text: str) -> HubModelId | None:
    """`text` as a hub model id, or None when it is not shaped like one (`org/name[:QUANT]`;
    hubs refuse `--` and `..` in names)."""
    match = _HUB_ID.match(text)
    if match is None or "--" in match["repo"] or ".." in match["repo"]:
        return None
    return HubModelId(match["repo"], match["quant"])
