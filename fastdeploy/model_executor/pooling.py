"""How the pooling runner turns a prompt pass's hidden states into an embedding.

`read_pooling_spec` reads the checkpoint's sentence-transformers files (`modules.json` with its
Pooling and Normalize modules, `config_sentence_transformers.json`'s prompts,
`sentence_bert_config.json`'s modalities: whether texts are rendered as chat messages, see
input/embedding_text.py) and the engine's `pooler_config`, which overrides them. `pool_chunk` reduces one pass's rows per sequence (a prompt
may be computed in several chunks) and `finish_embedding` turns what the chunks gave into the
embedding: the mean taken, Matryoshka truncation, then normalisation.

`pooling_checkpoint` reads a checkpoint saved as a bare decoder (transformers' `Qwen3Model`, as
sentence-transformers and Qwen3-Embedding save it: tensors without `model.`, no LM head) as the
registered causal LM, whose forward pass gives the final hidden states.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdeploy.config import ModelConfig
from fastdeploy.errors import InvalidArgumentError, UnsupportedModelError
from fastdeploy.input.embedding_text import TextRendering, read_text_rendering
from fastdeploy.model_executor.loaders.base import WeightLoader
from fastdeploy.model_executor.model_loader import CheckpointInfo

#: the poolings the runner computes (vLLM's names)
POOLING_TYPES = ("LAST", "MEAN", "CLS")
#: sentence-transformers' pooling modes that are ours
_SENTENCE_TRANSFORMERS_MODES = {"lasttoken": "LAST", "mean": "MEAN", "cls": "CLS"}
#: the boolean keys of sentence-transformers' older Pooling configs, and their mode
_LEGACY_MODE_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
#: `pooler_config` keys
_POOLER_CONFIG_KEYS = ("pooling_type", "normalize", "is_matryoshka", "matryoshka_dimensions")
#: top-level tensor names of transformers' bare decoders, which their causal LMs keep under `model.`
_DECODER_NAMES = ("embed_tokens.", "layers.", "norm.", "rotary_emb.")

SUPPORTED = "LAST (sentence-transformers' lasttoken), MEAN (mean), CLS (cls)"


@dataclass(frozen=True)
class PoolingSpec:
    """What the pooling runner computes for this model."""

    pooling_type: str
    normalize: bool
    #: the embedding's full size (the model's hidden size)
    hidden_size: int
    #: Matryoshka sizes `dimensions` may ask for: None refuses `dimensions`, () allows any size
    #: up to `hidden_size`
    matryoshka: tuple[int, ...] | None = None
    #: named prompts put before a text (config_sentence_transformers.json), and the default one
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    #: how a text is fed: raw, or as a chat message through the chat template
    rendering: TextRendering = field(default_factory=TextRendering)

    def prompt(self, prompt_name: str | None) -> str:
        """The text put before each prompt: the named prompt, else the default one, else none."""
        name = prompt_name if prompt_name is not None else self.default_prompt_name
        if name is None:
            return ""
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise InvalidArgumentError(
                f"prompt_name {name!r} is not one of this model's prompts (config_sentence_transformers.json "
                f"names: {known})"
            )
        return self.prompts[name]

    def check_dimensions(self, dimensions: int | None) -> None:
        """Refuse a `dimensions` this model was not trained to be truncated to."""
        if dimensions is None:
            return
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            raise InvalidArgumentError(f"dimensions must be a positive int, got {dimensions!r}")
        if self.matryoshka is None:
            raise InvalidArgumentError(
                f"dimensions={dimensions}: this model does not declare Matryoshka embeddings (config.json "
                "is_matryoshka or matryoshka_dimensions, or pooler_config), and a truncated embedding of "
                "another model is a poor one; leave dimensions unset"
            )
        if dimensions > self.hidden_size or (self.matryoshka and dimensions not in self.matryoshka):
            allowed = ", ".join(map(str, self.matryoshka)) if self.matryoshka else f"1 to {self.hidden_size}"
            raise InvalidArgumentError(
                f"dimensions={dimensions} is not a size of this model's embeddings: {allowed}"
            )


def read_pooling_spec(
    model_path: str,
    config: ModelConfig,
    overrides: Mapping[str, Any] | None,
    chat_template: str | None = None,
) -> PoolingSpec:
    """The checkpoint's pooling (sentence-transformers files), with `overrides` (`pooler_config`)
    over it; refuses a model with neither, or with modules the runner does not compute.
    `chat_template` is the tokenizer's, for a checkpoint that embeds texts as chat messages."""
    overrides = _checked_overrides(overrides or {})
    modules = _sentence_transformers_modules(model_path)
    pooling_type = overrides.get("pooling_type") or (modules[0] if modules else None)
    if pooling_type is None:
        raise UnsupportedModelError(
            f"runner='pooling' needs a pooling: {model_path} has no sentence-transformers modules.json "
            f"with a Pooling module; pass pooler_config={{'pooling_type': ...}} with one of: {SUPPORTED}"
        )
    normalize = overrides.get("normalize", modules[1] if modules else True)
    raw = config.raw
    dimensions = overrides.get("matryoshka_dimensions", raw.get("matryoshka_dimensions"))
    if dimensions:
        matryoshka: tuple[int, ...] | None = tuple(int(size) for size in dimensions)
    else:
        matryoshka = () if overrides.get("is_matryoshka", raw.get("is_matryoshka")) else None
    prompts, default_prompt_name = _prompts(model_path)
    rendering = read_text_rendering(model_path, config.raw, chat_template)
    return PoolingSpec(
        pooling_type, bool(normalize), config.hidden_size, matryoshka, prompts, default_prompt_name, rendering
    )


def _checked_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(_POOLER_CONFIG_KEYS))
    if unknown:
        raise InvalidArgumentError(
            f"pooler_config has unknown keys {', '.join(unknown)}; it takes: {', '.join(_POOLER_CONFIG_KEYS)}"
        )
    checked = dict(overrides)
    pooling_type = checked.get("pooling_type")
    if pooling_type is not None:
        if not isinstance(pooling_type, str) or pooling_type.upper() not in POOLING_TYPES:
            raise InvalidArgumentError(
                f"pooler_config pooling_type must be one of: {SUPPORTED}; got {pooling_type!r}"
            )
        checked["pooling_type"] = pooling_type.upper()
    for key in ("normalize", "is_matryoshka"):
        if key in checked and not isinstance(checked[key], bool):
            raise InvalidArgumentError(f"pooler_config {key} must be true or false, got {checked[key]!r}")
    sizes = checked.get("matryoshka_dimensions")
    if sizes is not None and (
        not isinstance(sizes, list)
        or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes)
    ):
        raise InvalidArgumentError(
            f"pooler_config matryoshka_dimensions must be a list of positive ints, got {sizes!r}"
        )
    return checked


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModelError(f"{path} is not readable JSON: {exc}") from exc


def _sentence_transformers_modules(model_path: str) -> tuple[str, bool] | None:
    """(pooling type, whether a Normalize module follows) of the checkpoint's modules.json, or None
    without one. Transformer, Pooling and Normalize are computed; any other module is refused."""
    path = os.path.join(model_path, "modules.json")
    if not os.path.isfile(path):
        return None
    modules = _read_json(path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) and "type" in m for m in modules):
        raise UnsupportedModelError(f"{path} must be a list of modules with a 'type' each")
    pooling_type, normalize = None, False
    for module in sorted(modules, key=lambda m: m.get("idx", 0)):
        kind = str(module["type"]).rsplit(".", 1)[-1]
        if kind == "Transformer" and pooling_type is None:
            continue
        if kind == "Pooling" and pooling_type is None:
            pooling_type = _pooling_mode(os.path.join(model_path, str(module.get("path", "")), "config.json"))
        elif kind == "Normalize" and pooling_type is not None:
            normalize = True
        else:
            raise UnsupportedModelError(
                f"{path}: the module {module.get('name', kind)!r} ({module['type']}) is not computed by "
                "runner='pooling', which runs a Transformer, then a Pooling, then optionally a Normalize module"
            )
    if pooling_type is None:
        raise UnsupportedModelError(f"{path} has no Pooling module; the supported poolings are: {SUPPORTED}")
    return pooling_type, normalize


def _pooling_mode(path: str) -> str:
    """Our pooling type for a sentence-transformers Pooling module's config.json."""
    config = _read_json(path)
    if not isinstance(config, dict):
        raise UnsupportedModelError(f"{path} must hold a JSON object")
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in _LEGACY_MODE_KEYS.items() if config.get(key)]
        mode = modes if len(modes) != 1 else modes[0]
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if not isinstance(mode, str) or mode not in _SENTENCE_TRANSFORMERS_MODES:
        raise UnsupportedModelError(
            f"{path}: pooling mode {mode!r} is not supported; the supported poolings are: {SUPPORTED}"
        )
    if config.get("include_prompt") is False:
        raise UnsupportedModelError(
            f"{path}: include_prompt=false (pooling that leaves out the prompt's tokens) is not supported"
        )
    return _SENTENCE_TRANSFORMERS_MODES[mode]


def _prompts(model_path: str) -> tuple[dict[str, str], str | None]:
    """config_sentence_transformers.json's named prompts and its default prompt's name."""
    path = os.path.join(model_path, "config_sentence_transformers.json")
    if not os.path.isfile(path):
        return {}, None
    config = _read_json(path)
    prompts = config.get("prompts") if isinstance(config, dict) else None
    if not isinstance(prompts, dict):
        return {}, None
    prompts = {str(name): str(text or "") for name, text in prompts.items()}
    default = config.get("default_prompt_name")
    return prompts, default if isinstance(default, str) and default in prompts else None


def pool_chunk(hidden: np.ndarray, query_lens: np.ndarray, pooling_type: str) -> np.ndarray:
    """Per sequence of a pass ([tokens, hidden] rows, `query_lens` rows each, in order), what its
    chunk gives: the last row (LAST), the row sum (MEAN) or the first row (CLS)."""
    ends = np.cumsum(query_lens)
    starts = ends - query_lens
    if pooling_type == "MEAN":
        return np.add.reduceat(hidden, starts, axis=0, dtype=np.float32)
    return hidden[ends - 1 if pooling_type == "LAST" else starts]


def pooled_rows(query_lens: np.ndarray, pooling_type: str) -> np.ndarray | None:
    """The rows a LAST or CLS pooling reads (so a device gathers only those), None for MEAN."""
    if pooling_type == "MEAN":
        return None
    ends = np.cumsum(query_lens)
    return ends - 1 if pooling_type == "LAST" else ends - query_lens


def finish_embedding(
    pooled: np.ndarray, num_tokens: int, spec: PoolingSpec, dimensions: int | None
) -> np.ndarray:
    """The embedding of a prompt whose chunks gave `pooled` (their sum for MEAN): the mean over
    its `num_tokens`, cut to `dimensions` (Matryoshka), normalised after the cut when the model
    normalises (so a shorter embedding is a unit vector too)."""
    vector = pooled.astype(np.float32) / np.float32(num_tokens) if spec.pooling_type == "MEAN" else pooled
    if dimensions is not None:
        vector = vector[:dimensions]
    if spec.normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    return np.asarray(vector, dtype=np.float32)


class _DecoderWeights(WeightLoader):
    """A bare decoder's tensors under its causal LM's names (`layers.0...` -> `model.layers.0...`)."""

    def __init__(self, inner: WeightLoader) -> None:
        self.inner = inner
        self.name = inner.name

    def can_load(self, model_path: str) -> bool:
        return self.inner.can_load(model_path)

    def load_config(self, model_path: str) -> dict[str, Any]:
        return self.inner.load_config(model_path)

    def load_tensors(self, model_path: str) -> Iterator[tuple[str, Any]]:
        for name, tensor in self.inner.load_tensors(model_path):
            yield ("model." + name if name.startswith(_DECODER_NAMES) else name), tensor

    def preload(self) -> None:
        self.inner.preload()


def pooling_checkpoint(checkpoint: CheckpointInfo, architectures: Mapping[str, type]) -> CheckpointInfo:
    """`checkpoint` as the pooling runner loads it: an architecture `XModel` that no plugin
    registers is read as `XForCausalLM`, bare decoder tensor names gain `model.`, and the LM
    head is tied to the embedding (the runner never computes logits of its own, and embedding
    checkpoints ship no head)."""
    config = checkpoint.config
    raw = dict(config.raw)
    name = config.architecture
    causal = name.removesuffix("Model") + "ForCausalLM"
    if name not in architectures and name.endswith("Model") and causal in architectures:
        raw["architectures"] = [causal]
    raw["tie_word_embeddings"] = True
    adapted = ModelConfig.from_hf_dict(raw)
    return dataclasses.replace(checkpoint, loader=_DecoderWeights(checkpoint.loader), config=adapted)
