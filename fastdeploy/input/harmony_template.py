"""GPT-OSS's harmony chat format as a chat template, for checkpoints that carry none of their own.

Written from the harmony format's description (OpenAI's `openai-harmony` renders the same
text; the package itself needs its tokenizer vocabulary downloaded at run time, so it is not
used here). A conversation renders as

    <|start|>system<|message|>{model identity, knowledge cutoff, optional current date,
        "Reasoning: {effort}", the valid channels, where function calls go}<|end|>
    <|start|>developer<|message|># Instructions\\n\\n{system + developer messages}
        \\n\\n# Tools\\n\\n## functions\\n\\nnamespace functions {...} // namespace functions<|end|>
    <|start|>user<|message|>{text}<|end|>
    <|start|>assistant<|channel|>final<|message|>{text}<|end|>
    <|start|>assistant to=functions.{name}<|channel|>commentary <|constrain|>json<|message|>{arguments}<|call|>
    <|start|>functions.{name}<|message|>{tool result}<|end|>
    <|start|>assistant                      (the generation prompt)

The developer message is left out when there are neither instructions nor tools. Tools are
declared as TypeScript function types, each parameter on a line (`name?: type,` when optional,
`// description` above it, `// default: value` after it). Earlier turns' reasoning is dropped;
the reasoning (`reasoning_content`) of assistant messages after the last user message (a turn
still under way, e.g. between a call and its result) is kept on the `analysis` channel.

`chat_template_kwargs`: `reasoning_effort` ("low" | "medium" | "high", default "medium"),
`current_date` (e.g. "2025-06-28"; left out by default), `model_identity`.
"""

from __future__ import annotations

HARMONY_CHAT_TEMPLATE = r"""
{%- macro ts_type(schema) -%}
{%- if schema.enum is defined -%}
{%- for value in schema.enum -%}{{ value | tojson }}{{ " | " if not loop.last }}{%- endfor -%}
{%- elif schema.type is defined and schema.type is string and schema.type in ("number", "integer") -%}number
{%- elif schema.type is defined and schema.type == "array" -%}
{{ ts_type(schema.get("items", {})) }}[]
{%- elif schema.type is defined and schema.type is string and schema.type in ("string", "boolean", "object", "null") -%}
{{ schema.type }}
{%- else -%}any
{%- endif -%}
{%- endmacro -%}
{%- macro render_function(function) -%}
{%- if function.description -%}// {{ function.description }}
{% endif -%}
{%- set parameters = function.get("parameters") or {} -%}
{%- set properties = parameters.get("properties") or {} -%}
{%- if properties -%}
type {{ function.name }} = (_: {
{% for name, schema in properties.items() -%}
{%- if schema.description is defined and schema.description -%}// {{ schema.description }}
{% endif -%}
{{ name }}{{ "" if name in (parameters.get("required") or []) else "?" }}: {{ ts_type(schema) }},
{%- if schema.default is defined %} // default: {{ schema.default }}{% endif %}

{% endfor -%}
}) => any;
{%- else -%}
type {{ function.name }} = () => any;
{%- endif -%}
{%- endmacro -%}
{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort else "medium" -%}
{%- set identity = model_identity if model_identity is defined and model_identity else "You are ChatGPT, a large language model trained by OpenAI." -%}
<|start|>system<|message|>{{ identity }}
Knowledge cutoff: 2024-06
{% if current_date is defined and current_date %}Current date: {{ current_date }}
{% endif %}

Reasoning: {{ effort }}

# Valid channels: analysis, commentary, final. Channel must be included for every message.
{%- if tools %}

Calls to these tools must go to the commentary channel: 'functions'.
{%- endif -%}
<|end|>
{%- set ns = namespace(instructions=[], last_user=-1) -%}
{%- for message in messages -%}
{%- if message.role in ("system", "developer") and message.content -%}
{%- set ns.instructions = ns.instructions + [message.content] -%}
{%- elif message.role == "user" -%}
{%- set ns.last_user = loop.index0 -%}
{%- endif -%}
{%- endfor -%}
{%- if ns.instructions or tools -%}
<|start|>developer<|message|>
{%- if ns.instructions -%}
# Instructions

{{ ns.instructions | join("\n\n") }}
{%- if tools %}


{% endif -%}
{%- endif -%}
{%- if tools -%}
# Tools

## functions

namespace functions {

{% for tool in tools -%}
{{ render_function(tool.function if tool.function is defined else tool) }}

{% endfor -%}
} // namespace functions
{%- endif -%}
<|end|>
{%- endif -%}
{%- set calls = namespace(names={}) -%}
{%- for message in messages -%}
{%- if message.role == "user" -%}
<|start|>user<|message|>{{ message.content }}<|end|>
{%- elif message.role == "assistant" -%}
{%- if loop.index0 > ns.last_user and message.reasoning_content -%}
<|start|>assistant<|channel|>analysis<|message|>{{ message.reasoning_content }}<|end|>
{%- endif -%}
{%- if message.content -%}
<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>
{%- endif -%}
{%- for call in message.tool_calls or [] -%}
{%- set function = call.function if call.function is defined else call -%}
{%- if call.id is defined -%}{%- set calls.names = dict(calls.names, **{call.id: function.name}) -%}{%- endif -%}
{%- set arguments = function.arguments if function.arguments is string else function.arguments | tojson -%}
<|start|>assistant to=functions.{{ function.name }}<|channel|>commentary <|constrain|>json<|message|>{{ arguments }}<|call|>
{%- endfor -%}
{%- elif message.role == "tool" -%}
{%- set name = message.name if message.name is defined and message.name else calls.names.get(message.tool_call_id, "") -%}
<|start|>functions.{{ name }}<|message|>{{ message.content }}<|end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|start|>assistant
{%- endif -%}
"""
