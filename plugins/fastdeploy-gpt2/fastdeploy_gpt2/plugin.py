"""The hooks fastdeploy calls: the architecture, its weight loader and a chat template."""

from __future__ import annotations

from fastdeploy.plugins.api import hookimpl
from fastdeploy_gpt2.loader import GPT2Loader
from fastdeploy_gpt2.model import GPT2LMHeadModel

#: GPT-2 checkpoints ship no chat template; this plain one lets `LLM.chat` work with them
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    return {"GPT2LMHeadModel": GPT2LMHeadModel}


@hookimpl
def fastdeploy_weight_loaders() -> list[GPT2Loader]:
    return [GPT2Loader()]


@hookimpl
def fastdeploy_chat_templates() -> dict[str, str]:
    return {"GPT2LMHeadModel": CHAT_TEMPLATE}
