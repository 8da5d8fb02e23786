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
- Qwen2.5-VL: ChatML whose content may be a list of parts; an image part (`image`,
  `image_url`) is written `<|vision_start|><|image_pad|><|vision_end|>`, a video part the same
  with `<|video_pad|>`, a text part as its text, in the parts' order.
- PaddleOCR-VL: `<|begin_of_sentence|>`, then `User: ` + the message's images (each
  `<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>`, parts `image` or `image_url`) + its texts
  + a newline; `Assistant: ` + text + `</s>`; a system message's text + a newline; the generation
  prompt is `Assistant: `.
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

QWEN_VL_CHAT_TEMPLATE = """\
{%- for message in messages -%}
    {{- "<|im_start|>" + message["role"] + "\\n" -}}
    {%- if message["content"] is string or message["content"] is none -%}
        {{- message["content"] or "" -}}
    {%- else -%}
        {%- for part in message["content"] -%}
            {%- if part["type"] in ("image", "image_url") -%}
                {{- "<|vision_start|><|image_pad|><|vision_end|>" -}}
            {%- elif part["type"] in ("video", "video_url") -%}
                {{- "<|vision_start|><|video_pad|><|vision_end|>" -}}
            {%- elif part["type"] == "text" -%}
                {{- part["text"] -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- "<|im_end|>\\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "<|im_start|>assistant\\n" -}}
{%- endif -%}
"""

PADDLEOCR_VL_CHAT_TEMPLATE = """\
{%- macro texts(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is not none -%}
        {%- for part in content if part["type"] == "text" -%}
            {{- part["text"] -}}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{{- "<|begin_of_sentence|>" -}}
{%- for message in messages -%}
    {%- if message["role"] == "user" -%}
        {{- "User: " -}}
        {%- if message["content"] is not string and message["content"] is not none -%}
            {%- for part in message["content"] if part["type"] in ("image", "image_url") -%}
                {{- "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>" -}}
            {%- endfor -%}
        {%- endif -%}
        {{- texts(message["content"]) + "\\n" -}}
    {%- elif message["role"] == "assistant" -%}
        {{- "Assistant: " + texts(message["content"]) + "</s>" -}}
    {%- elif message["role"] == "system" -%}
        {{- texts(message["content"]) + "\\n" -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "Assistant: " -}}
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
    "Qwen2_5_VLForConditionalGeneration": QWEN_VL_CHAT_TEMPLATE,
    "PaddleOCRVLForConditionalGeneration": PADDLEOCR_VL_CHAT_TEMPLATE,
}
