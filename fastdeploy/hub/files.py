"""Which files of a hub repository a model needs, and where its weights lie once downloaded.

A safetensors checkpoint needs its weights, config, tokenizer, chat template, generation defaults
and processor configs, all at the top of the repository, and an embedding model's
sentence-transformers files (`modules.json`, its prompts, each module's `config.json`); PyTorch `.bin`/`.pth` copies, ONNX
exports, GGUFs and READMEs stay on the hub. A GGUF is one file, or every shard of a split one,
picked by its quantisation tag (`org/name:Q4_K_M`, case-insensitive, as llama.cpp's `-hf` picks
it) or by name (`gguf_file`). The same choice runs twice: on the repository's listing, to know
what to download, and on the downloaded snapshot, to find the weights in it.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from fastdeploy.errors import InvalidArgumentError, ModelNotFoundError
from fastdeploy.formats.gguf_file import gguf_shard_names
from fastdeploy.hub.model_id import HubModelId

#: the files of a checkpoint directory besides its weights, at the top of the repository
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    # sentence-transformers' module list, prompts and settings (the pooling runner reads them)
    "modules.json",
    "config_sentence_transformers.json",
    "sentence_bert_config.json",
)
#: a sentence-transformers module's settings, in its folder (`1_Pooling/config.json`)
_MODULE_CONFIG = re.compile(r"[0-9]+_[A-Za-z]+/config\.json")
_MODULE_CONFIG_PATTERN = "[0-9]*_*/config.json"
_TEMPLATES_DIR = "additional_chat_templates/"
_INDEX_SUFFIX = ".safetensors.index.json"

#: the quantisation llama.cpp's `-hf` takes from a repository of several GGUFs when none is named
DEFAULT_QUANT = "Q4_K_M"


@dataclass(frozen=True)
class Selection:
    """The repository paths to download, and the one the model loads from: "" for the snapshot
    directory itself (a safetensors checkpoint), else the GGUF (a split one's first shard)."""

    files: tuple[str, ...]
    weights: str


def choose_files(files: Iterable[str], model: HubModelId, gguf_file: str | None, where: str) -> Selection:
    """What `model` needs of a repository holding `files` (paths with `/`); `where` names the
    repository (or the cached copy) in errors."""
    files = sorted(files)
    if gguf_file is not None:
        return _named_gguf(files, gguf_file, where)
    if model.quant is not None:
        return _tagged_gguf(files, model.quant, where)
    checkpoint = _checkpoint(files)
    if checkpoint is not None:
        return checkpoint
    groups = _gguf_groups(files)
    if len(groups) == 1:
        return _gguf_selection(next(iter(groups.values())))
    if groups:
        default = _matching(groups, DEFAULT_QUANT)
        if len(default) == 1:
            return _gguf_selection(default[0])
        raise InvalidArgumentError(
            f"{where} holds several GGUFs ({_names(groups)}); pick one with {model.repo_id}:QUANT "
            "(e.g. :Q8_0) or gguf_file= (--gguf-file)"
        )
    held = ", ".join(files[:10]) + (", ..." if len(files) > 10 else "") if files else "no files"
    raise ModelNotFoundError(
        f"{where} holds no weights fastdeploy reads (*.safetensors or .gguf); it holds: {held}. "
        "Use a repository with safetensors or GGUF weights (PyTorch .bin files are not read)"
    )


def download_patterns(model: HubModelId, gguf_file: str | None) -> list[str]:
    """Glob patterns of the files `model` needs, for a hub whose repository listing is not read
    first (the weights are then found in what arrived)."""
    if gguf_file is not None:
        folder, name = posixpath.split(gguf_file)
        return [posixpath.join(folder, shard) for shard in gguf_shard_names(name)]
    if model.quant is not None:
        tag = "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in model.quant)
        return [f"*{tag}*.gguf"]
    return [
        *CHECKPOINT_FILES,
        "*.safetensors",
        "*" + _INDEX_SUFFIX,
        _TEMPLATES_DIR + "*.jinja",
        _MODULE_CONFIG_PATTERN,
    ]


def local_files(folder: str) -> list[str]:
    """The files under a downloaded snapshot, as repository paths (hidden folders, where hub
    clients keep their bookkeeping, left out)."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [name for name in dirs if not name.startswith(".")]
        relative = os.path.relpath(root, folder)
        for name in names:
            path = name if relative == "." else os.path.join(relative, name)
            found.append(path.replace(os.sep, "/"))
    return found


def _checkpoint(files: list[str]) -> Selection | None:
    """The safetensors checkpoint at the top of the repository, or None when it has none."""
    top = [path for path in files if "/" not in path]
    weights = [path for path in top if path.endswith(".safetensors")]
    if not weights:
        return None
    if any(path.endswith(_INDEX_SUFFIX) for path in top):
        # Mistral's repositories add consolidated.safetensors, the same weights in its own format
        weights = [path for path in weights if not path.startswith("consolidated")]
    extras = [path for path in top if path in CHECKPOINT_FILES or path.endswith(_INDEX_SUFFIX)]
    templates = [path for path in files if path.startswith(_TEMPLATES_DIR) and path.endswith(".jinja")]
    modules = [path for path in files if _MODULE_CONFIG.fullmatch(path)]
    return Selection(tuple(sorted(weights + extras + templates + modules)), "")


def _gguf_groups(files: list[str]) -> dict[str, list[str]]:
    """The repository's GGUF models (vision projectors left out): first shard -> every shard
    its name implies (one file for a whole GGUF)."""
    groups: dict[str, list[str]] = {}
    for path in files:
        folder, name = posixpath.split(path)
        if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
            continue
        shards = [posixpath.join(folder, shard) for shard in gguf_shard_names(name)]
        groups.setdefault(shards[0], shards)
    return groups


def _matching(groups: dict[str, list[str]], tag: str) -> list[list[str]]:
    """The GGUF models whose path carries `tag` (case-insensitive) between separators; failing
    that, between any non-alphanumerics (`model_q8_0.gguf`)."""
    for word in ("A-Za-z0-9_", "A-Za-z0-9"):
        pattern = re.compile(rf"(?<![{word}]){re.escape(tag)}(?![{word}])", re.IGNORECASE)
        found = [shards for first, shards in groups.items() if pattern.search(first)]
        if found:
            return found
    return []


def _tagged_gguf(files: list[str], tag: str, where: str) -> Selection:
    groups = _gguf_groups(files)
    found = _matching(groups, tag)
    if len(found) == 1:
        return _gguf_selection(found[0])
    if found:
        raise InvalidArgumentError(
            f"several GGUFs of {where} carry the tag {tag!r} ({', '.join(shards[0] for shards in found)}); "
            "name one with gguf_file= (--gguf-file)"
        )
    held = f"its GGUFs: {_names(groups)}" if groups else "it holds no GGUF"
    raise ModelNotFoundError(f"{where} has no GGUF with the tag {tag!r}; {held}")


def _named_gguf(files: list[str], gguf_file: str, where: str) -> Selection:
    path = gguf_file if gguf_file in files else None
    if path is None:
        by_name = [candidate for candidate in files if posixpath.basename(candidate) == gguf_file]
        path = by_name[0] if len(by_name) == 1 else None
    if path is None or not path.lower().endswith(".gguf"):
        ggufs = _gguf_groups(files)
        held = f"its GGUFs: {_names(ggufs)}" if ggufs else "it holds no GGUF"
        raise ModelNotFoundError(f"{where} has no GGUF file {gguf_file!r}; {held}")
    folder, name = posixpath.split(path)
    return _gguf_selection([posixpath.join(folder, shard) for shard in gguf_shard_names(name)])


def _gguf_selection(shards: list[str]) -> Selection:
    return Selection(tuple(shards), shards[0])


def _names(groups: dict[str, list[str]]) -> str:
    return ", ".join(sorted(groups))
