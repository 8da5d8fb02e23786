"""Chat templates of the ERNIE-4.5 text models, for tokenizer directories that ship none.

Real checkpoints carry their template in tokenizer_config.json / chat_template.jinja and that
always wins; these are the fallback of `Ernie4_5Tokenizer` and what the
`fastdeploy_chat_templates` hook offers for the ERNIE architectures.

- `ERNIE_4_5_CHAT_TEMPLATE` (ERNIE-4.5-0.3B / 21B-A3B instruct): `<|begin_of_sentence|>`, a
  system message as `content\n`, `User: content\n`, `Assistant: content<|end_of_sentence|>`, and
  `Assistant: ` as the generation prompt.
- `ERNIE_THINKING_CHAT_TEMPLATE` (ERNIE-X1 / -Thinking style): the same turns, but the
  generation prompt opens the reasoning block (`Assistant: <think>\n`), so the model writes its
  reasoning, `</think>`, then the answer. With `enable_thinking=False` the prompt carries an
  empty, closed block (`<think>\n\n</think>\n\n`) and the model answers directly; the reasoning
  parser is told thinking is off and returns everything as the answer. Earlier assistant turns
  keep only their answer (their `reasoning_content` is not replayed).
"""

from __future__ import annotations

_TURNS = """\
{%- if cls_token is not defined -%}{%- set cls_token = "<|begin_of_sentence|>" -%}{%- endif -%}
{%- if sep_token is not defined -%}{%- set sep_token = "<|end_of_sentence|>" -%}{%- endif -%}
{{- cls_token -}}
{%- for message in messages -%}
    {%- if message["role"] == "system" -%}
        {{- message["content"] + "\\n" -}}
    {%- elif message["role"] == "user" -%}
        {{- "User: " + message["content"] + "\\n" -}}
    {%- elif message["role"] == "assistant" -%}
        {{- "Assistant: " + (message["content"] or "") + sep_token -}}
    {%- else -%}
        {{- raise_exception("ERNIE-4.5 chat messages must be system, user or assistant; got " + message["role"]) -}}
    {%- endif -%}
{%- endfor -%}
"""

ERNIE_4_5_CHAT_TEMPLATE = (
    _TURNS
    + """\
{%- if add_generation_prompt -%}
    {{- "Assistant: " -}}
{%- endif -%}
"""
)

#: the generation prompt of the thinking templates: thinking on unless enable_thinking=False
_THINKING_PROMPT = """\
{%- if add_generation_prompt -%}
    {%- if enable_thinking is defined and not enable_thinking -%}
        {{- "Assistant: <think>\\n\\n</think>\\n\\n" -}}
    {%- else -%}
        {{- "Assistant: <think>\\n" -}}
    {%- endif -%}
{%- endif -%}
"""

ERNIE_THINKING_CHAT_TEMPLATE = _TURNS + _THINKING_PROMPT

#: ERNIE-4.5-VL: the same turns, with content parts. An image part becomes
#: `Picture N:<|IMAGE_START|><|image@placeholder|><|IMAGE_END|>` and a video part
#: `Video N:<|VIDEO_START|><|video@placeholder|><|VIDEO_END|>` (numbered across the conversation),
#: as FastDeploy's processor expects; text parts are written as they are. Thinking is on unless
#: `enable_thinking=False` (the generation prompt then carries an empty, closed block).
ERNIE_4_5_VL_CHAT_TEMPLATE = (
    """\
{%- set counts = namespace(image=0, video=0) -%}
{%- macro render(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part["type"] == "text" -%}
                {{- part["text"] -}}
            {%- elif part["type"] in ("image_url", "image") -%}
                {%- set counts.image = counts.image + 1 -%}
                {{- "Picture " ~ counts.image ~ ":<|IMAGE_START|><|image@placeholder|><|IMAGE_END|>" -}}
            {%- elif part["type"] in ("video_url", "video") -%}
                {%- set counts.video = counts.video + 1 -%}
                {{- "Video " ~ counts.video ~ ":<|VIDEO_START|><|video@placeholder|><|VIDEO_END|>" -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{{- "<|begin_of_sentence|>" -}}
{%- for message in messages -%}
    {%- set content = message["content"] -%}
    {%- if message["role"] == "system" -%}
        {{- render(content) + "\\n" -}}
    {%- elif message["role"] == "user" -%}
        {{- "User: " + render(content) + "\\n" -}}
    {%- elif message["role"] == "assistant" -%}
        {{- "Assistant: " + render(content or "") + "<|end_of_sentence|>" -}}
    {%- else -%}
        {{- raise_exception("ERNIE-4.5-VL chat messages must be system, user or assistant; got " + message["role"]) -}}
    {%- endif -%}
{%- endfor -%}
"""
    + _THINKING_PROMPT
)
