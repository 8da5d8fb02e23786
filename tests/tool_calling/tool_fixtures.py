"""Tools shared by the tool-calling tests, and the Qwen3-style template that renders them."""

from __future__ import annotations

from pathlib import Path

TOOLS_TEMPLATE = str(Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tools_chat_template.jinja")

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "minLength": 1, "maxLength": 30}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Local time in a time zone", "parameters": TIME},
    },
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
#: a Hermes call the auto-mode tests force with a regex (the 135M model does not call tools unasked)
FORCED_CALL_REGEX = (
    r'I will check\.\n<tool_call>\n\{"name": "get_weather", "arguments": '
    r'\{"city": "(Paris|Rome)", "unit": "(celsius|fahrenheit)"\}\}\n</tool_call>'
)
