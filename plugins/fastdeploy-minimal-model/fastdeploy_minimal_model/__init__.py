"""Example fastdeploy plugin: the `MinimalLMForCausalLM` architecture."""
