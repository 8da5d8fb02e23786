"""The hook fastdeploy calls: checkpoints whose config.json says `"architectures": ["MinimalLMForCausalLM"]`."""

from fastdeploy.plugins.api import hookimpl
from fastdeploy_minimal_model.model import MinimalLMForCausalLM


@hookimpl
def fastdeploy_model_architectures() -> dict[str, type]:
    return {"MinimalLMForCausalLM": MinimalLMForCausalLM}
