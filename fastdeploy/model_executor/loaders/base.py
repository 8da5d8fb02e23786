"""The weight-loader interface: a checkpoint format in, an HF-style config and named tensors out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import numpy as np

from fastdeploy.formats.ggml_tensor import GGMLTensor


class WeightLoader(ABC):
    """Reads one checkpoint format; registered through `fastdeploy_weight_loaders`.

    Loaders speak Hugging Face names: `load_config` returns a config.json-style dict and
    `load_tensors` yields tensors under the names transformers uses for the architecture, so
    model classes need to know only one naming per checkpoint family.
    """

    name: str = "base"
    #: loaders are asked in descending priority; the first that can load wins
    priority: int = 0
    #: what this loader reads, in words, for the error shown when no loader can read a path
    reads: str = "a checkpoint"

    @abstractmethod
    def can_load(self, model_path: str) -> bool:
        """Whether this loader understands the file or directory at `model_path`."""

    @abstractmethod
    def load_config(self, model_path: str) -> dict[str, Any]:
        """The model's configuration as a config.json-style dict (with `architectures`)."""

    @abstractmethod
    def load_tensors(self, model_path: str) -> Iterator[tuple[str, np.ndarray | GGMLTensor]]:
        """(name, host tensor) pairs: arrays (memory-mapped, any float dtype) or, for quantised
        matrices a backend may use as they are, `GGMLTensor`s (which convert with `np.asarray`)."""

    def shape_error(
        self, model_path: str, wrong: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
    ) -> str | None:
        """The message for tensors (HF name, shape, expected shape) that disagree with the config,
        in the terms of this format (its file and tensor names); None keeps the config.json one."""
        return None

    def preload(self) -> None:
        """Import what `load_tensors` reads with, ahead of it (a fork server does, once for all
        its ranks, which would otherwise each import it while loading); nothing by default."""
        return None
