"""The SentencePiece tokenizer loader (plain or ERNIE-4.5 tokenizers) and ERNIE-4.5's fallback
chat template, registered.

A separate entry point from `input.plugin` (GGUF and tokenizer.json loaders) so the
SentencePiece dependency and ERNIE specifics are one plugin that `fastdeploy env` lists on its
own. The loader's priority (5) puts it before the tokenizer.json loader for directories it
claims: those with a `tokenizer.model` and either no tokenizer.json or an ERNIE tokenizer class.
"""

from __future__ import annotations

import os

from fastdeploy.input.ernie4_5_tokenizer import Ernie4_5Tokenizer
from fastdeploy.input.ernie_templates import ERNIE_4_5_CHAT_TEMPLATE
from fastdeploy.input.hf_tokenizer import _read_json
from fastdeploy.input.sentencepiece_tokenizer import SentencePieceTokenizer, build_sentencepiece_tokenizer
from fastdeploy.input.tokenizer import Tokenizer, TokenizerLoader
from fastdeploy.logger import get_logger
from fastdeploy.plugins.hookspecs import hookimpl

logger = get_logger(__name__)


class SentencePieceTokenizerLoader(TokenizerLoader):
    """Directories with a `tokenizer.model` and no `tokenizer.json` (which the `tokenizers` loader
    reads faster), or whose tokenizer_config names an ERNIE tokenizer class."""

    name = "sentencepiece"
    priority = 5
    reads = "a directory with a SentencePiece tokenizer.model"

    def can_load(self, model_path: str) -> bool:
        if not (os.path.isdir(model_path) and os.path.isfile(os.path.join(model_path, "tokenizer.model"))):
            return False
        if not os.path.isfile(os.path.join(model_path, "tokenizer.json")):
            return True
        return _is_ernie_class(model_path)

    def load(self, model_path: str) -> Tokenizer:
        cls = Ernie4_5Tokenizer if _is_ernie_class(model_path) else SentencePieceTokenizer
        tokenizer = build_sentencepiece_tokenizer(model_path, cls)
        logger.info("loaded tokenizer.model from %s: %r", model_path, tokenizer)
        return tokenizer


def _is_ernie_class(model_path: str) -> bool:
    tokenizer_class = _read_json(model_path, "tokenizer_config.json").get("tokenizer_class")
    if isinstance(tokenizer_class, str) and tokenizer_class.replace("_", "").lower().startswith("ernie"):
        return True
    architectures = _read_json(model_path, "config.json").get("architectures") or []
    return any(isinstance(name, str) and name.startswith("Ernie4_5") for name in architectures)


@hookimpl
def fastdeploy_tokenizer_loaders() -> list[TokenizerLoader]:
    return [SentencePieceTokenizerLoader()]


@hookimpl
def fastdeploy_chat_templates() -> dict[str, str]:
    """ERNIE-4.5's template for ERNIE checkpoints whose tokenizer files carry none."""
    architectures = ("Ernie4_5ForCausalLM", "Ernie4_5_ForCausalLM", "Ernie4_5_MoeForCausalLM")
    return dict.fromkeys(architectures, ERNIE_4_5_CHAT_TEMPLATE)
