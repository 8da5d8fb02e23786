"""Guided decoding (structured outputs): outputs constrained to a JSON schema, regex, choice,
grammar or structural tag. See docs/structured_outputs.md."""

from fastdeploy.engine.guided.params import GuidedDecodingError, GuidedDecodingParams, StructuredOutputsParams

__all__ = ["GuidedDecodingError", "GuidedDecodingParams", "StructuredOutputsParams"]
