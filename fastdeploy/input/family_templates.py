"""Chat templates of model families, for checkpoints that carry none of their own.

A GGUF usually stores its template (`tokenizer.chat_template`) and a Hugging Face directory in
its tokenizer files; both always win. A file converted without one (an older converter, a
base-model upload) would otherwise refuse chat requests, so `fastdeploy_chat_templates` offers
the family's published turn format, written here from its description:

- Gemma 2 / Gemma 3: `<bos>`, turns `<start_of_turn>{user|model}\\n{text}<end_of_turn>\\n` with
  the text trimmed; a system message has no turn of its own and is prepended (plus a blank
  line) to the next user turn; the generation prompt is `<start_of_turn>model\\n`.
- Qwen2 / Qwen3 (dense and MoE): ChatML, `<|im_start|>{role}\\n{text}<|im_end|>\\n` per message
  and `<|im_start|>assistant\\n` as the generation prompt.
"""

from __future__ import annotations

GEMMA_CHAT_TEMPLATE = """\
{{- bos_token -}}
{%- set ns = namespace(prefix="") -%}
{%- for message in messages -%}
    {%- if message["role"] == "system" -%}
        {%- set ns.prefix = ns.prefix + (message["content"] or "") | trim + "\\n\\n" -%}
    {%- else -%}
        {%- set role = "model" if message["role"] == "assistant" else message["role"] -%}
        {{- "<start_of_turn>" + role + "\\n" + ns.prefix + (message["content"] or "") | trim + "<end_of_turn>\\n" -}}
        {%- set ns.prefix = "" -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "<start_of_turn>model\\n" -}}
{%- endif -%}
"""

CHATML_TEMPLATE = """\
{%- for message in messages -%}
    {{- "<|im_start|>" + message["role"] + "\\n" + (message["content"] or "") + "<|im_end|>\\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "<|im_start|>assistant\\n" -}}
{%- endif -%}
"""

#: architecture name -> template (the names config.json and the GGUF loader give)
FAMILY_CHAT_TEMPLATES: dict[str, str] = {
    "Gemma2ForCausalLM": GEMMA_CHAT_TEMPLATE,
    "Gemma3ForCausalLM": GEMMA_CHAT_TEMPLATE,
    "Qwen2ForCausalLM": CHATML_TEMPLATE,
    "Qwen3ForCausalLM": CHATML_TEMPLATE,
    "Qwen2MoeForCausalLM": CHATML_TEMPLATE,
    "Qwen3MoeForCausalLM": CHATML_TEMPLATE,
}
