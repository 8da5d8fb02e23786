"""What a multimodal prompt becomes: token ids with expanded placeholders, the encoder inputs of
each image and video, and the per-token data the model needs beyond token ids.

An engine request carries one `MultiModalPrompt` (shared by its `n` samples); the engine treats
it as opaque "extra model inputs" apart from `block_key`, which prefix caching mixes into the
key of every KV block so two prompts that differ only in an image never share blocks.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class MultiModalItem:
    """One image or video of a prompt."""

    modality: str  # "image" or "video"
    #: encoder input rows [T*h*w, 3*14*14] float32
    patches: np.ndarray
    #: (T, h, w) in patches
    grid_thw: tuple[int, int, int]
    #: first placeholder token of this item in the prompt, and how many there are
    offset: int
    length: int
    #: sha256 of the modality, grid and patch values
    content_hash: str = ""
    #: the encoder's output rows (device array [length, hidden]), computed once per request
    embeddings: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.content_hash:
            digest = hashlib.sha256(f"{self.modality}:{self.grid_thw}".encode())
            digest.update(np.ascontiguousarray(self.patches, dtype=np.float32).tobytes())
            self.content_hash = digest.hexdigest()

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass
class MultiModalPrompt:
    """Prompt tokens plus what the model needs for its images and videos."""

    token_ids: list[int]
    items: list[MultiModalItem]
    #: rotary positions of the prompt tokens: int64 [3, len(token_ids)] (time, height, width)
    positions: np.ndarray
    #: position of the first generated token (prompt positions' maximum + 1)
    next_position: int
    #: 1 where a prompt token is routed to the vision experts (placeholders and their start/end
    #: tokens), else 0: int8 [len(token_ids)]
    vision_mask: np.ndarray

    @property
    def num_image_tokens(self) -> int:
        return sum(item.length for item in self.items if item.modality == "image")

    @property
    def num_video_tokens(self) -> int:
        return sum(item.length for item in self.items if item.modality == "video")

    def block_key(self, start: int, end: int) -> tuple[str, ...]:
        """Content hashes of the items whose placeholders overlap tokens [start, end)."""
        return tuple(item.content_hash for item in self.items if item.offset < end and start < item.end)

    def release_encoder_outputs(self) -> None:
        """Drop the cached encoder outputs (when the request finishes)."""
        for item in self.items:
            item.embeddings = None
