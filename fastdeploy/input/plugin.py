"""The built-in tokenizer loaders, registered through the `fastdeploy.plugins` entry point.

fastdeploy's own loaders go through the same hook as third-party ones, so the plugin path is
exercised on every run. GGUF files and tokenizer.json directories never overlap, so the order
only matters to plugins that add loaders for the same paths (higher `priority` is asked first).
The families' chat templates (`family_templates`) are the fallback for checkpoints without one.
"""

from __future__ import annotations

from fastdeploy.input.family_templates import FAMILY_CHAT_TEMPLATES
from fastdeploy.input.gguf_tokenizer import GGUFTokenizerLoader
from fastdeploy.input.harmony_template import HARMONY_CHAT_TEMPLATE
from fastdeploy.input.hf_tokenizer import HFTokenizerLoader
from fastdeploy.input.tokenizer import TokenizerLoader
from fastdeploy.plugins.hookspecs import hookimpl


@hookimpl
def fastdeploy_tokenizer_loaders() -> list[TokenizerLoader]:
    """The GGUF-metadata loader and the tokenizer.json directory loader."""
    return [GGUFTokenizerLoader(), HFTokenizerLoader()]


@hookimpl
def fastdeploy_chat_templates() -> dict[str, str]:
    """Gemma's, Qwen's and GPT-OSS's (harmony) turn formats, for their checkpoints that carry no template."""
    return {**FAMILY_CHAT_TEMPLATES, "GptOssForCausalLM": HARMONY_CHAT_TEMPLATE}
