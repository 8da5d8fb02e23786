"""Tool calling: `tools` / `tool_choice` requests, tool-call parsers, streamed call deltas.

See docs/tool_calling.md. Parsers register through the `fastdeploy_tool_call_parsers` hook.
"""
