"""The hook fastdeploy calls: `reasoning_parser="think-tags"`."""

from fastdeploy.plugins.api import hookimpl
from fastdeploy_think_parser.parser import ThinkTagsParser


@hookimpl
def fastdeploy_reasoning_parsers() -> dict[str, type]:
    return {"think-tags": ThinkTagsParser}
