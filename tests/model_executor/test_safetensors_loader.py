"""Hugging Face directories (config.json + safetensors + tokenizer.json) through the whole engine.

The directories are written by the test from the SmolLM2 GGUF in transformers' layout; greedy
tokens must still match transformers' reference outputs for that model.
"""

import json
import os

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from fastdeploy import LLM, SamplingParams
from fastdeploy.errors import WeightLoadError
from fastdeploy.model_executor.loaders.gguf_loader import GGUFLoader
from fastdeploy.model_executor.loaders.safetensors_loader import SafetensorsLoader


def write_tokenizer(directory, gguf_path):
    from fastdeploy.input.gguf_tokenizer import GGUFTokenizerLoader

    tokenizer = GGUFTokenizerLoader().load(gguf_path)
    tokenizer.backend.save(os.path.join(directory, "tokenizer.json"))
    config = {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "add_bos_token": False,
        "chat_template": tokenizer.chat_template,
    }
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)


def write_config(directory, gguf_path):
    config = GGUFLoader().load_config(gguf_path)
    config.update({"model_type": "llama", "torch_dtype": "float32"})
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)


@pytest.fixture(scope="module")
def hf_tensors(smollm2_path):
    # quantised matrices come as GGMLTensor blocks; a safetensors checkpoint holds their float32 values
    return {name: np.asarray(tensor) for name, tensor in GGUFLoader().load_tensors(smollm2_path)}


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory, smollm2_path, hf_tensors):
    """float32 weights in three shards with model.safetensors.index.json."""
    directory = tmp_path_factory.mktemp("smollm2-sharded")
    names = sorted(hf_tensors)
    weight_map = {}
    for shard, chunk in enumerate(np.array_split(np.array(names), 3)):
        filename = f"model-{shard + 1:05d}-of-00003.safetensors"
        save_file({name: np.ascontiguousarray(hf_tensors[name]) for name in chunk}, str(directory / filename))
        weight_map.update(dict.fromkeys(chunk.tolist(), filename))
    with open(directory / "model.safetensors.index.json", "w", encoding="utf-8") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)
    write_config(directory, smollm2_path)
    write_tokenizer(directory, smollm2_path)
    return str(directory)


def test_sharded_directory_generates_the_reference_tokens(sharded_dir, smollm2_reference):
    llm = LLM(model=sharded_dir, max_model_len=512)
    for case in smollm2_reference["cases"][:3] + smollm2_reference["cases"][-2:]:
        params = SamplingParams(temperature=0, max_tokens=len(case["output_token_ids"]))
        if case["kind"] == "chat":
            (output,) = llm.chat(case["input"], params, use_tqdm=False)
        else:
            (output,) = llm.generate(case["input"], params, use_tqdm=False)
        assert output.prompt_token_ids == case["prompt_token_ids"], case["name"]
        assert output.outputs.token_ids == case["output_token_ids"], case["name"]


def test_bfloat16_weights_load_as_rounded_float32(tmp_path, hf_tensors):
    names = ["model.layers.0.mlp.down_proj.weight", "model.norm.weight"]
    save_file(
        {name: hf_tensors[name].astype(ml_dtypes.bfloat16) for name in names},
        str(tmp_path / "model.safetensors"),
    )
    (tmp_path / "config.json").write_text("{}")
    loaded = dict(SafetensorsLoader().load_tensors(str(tmp_path)))
    for name in names:
        expected = hf_tensors[name].astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(loaded[name].astype(np.float32), expected)
    # the dequantised Q4_1 matrix is not bf16-representable: the rounding really happened
    rounded = hf_tensors[names[0]].astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.abs(rounded - hf_tensors[names[0]]).max() > 0


def test_missing_and_unknown_tensors_are_named(tmp_path, smollm2_path, hf_tensors):
    tensors = {name: np.ascontiguousarray(value) for name, value in hf_tensors.items()}
    del tensors["model.layers.3.mlp.up_proj.weight"]
    tensors["model.layers.3.mlp.extra_proj.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    write_config(tmp_path, smollm2_path)
    write_tokenizer(tmp_path, smollm2_path)
    with pytest.raises(WeightLoadError) as info:
        LLM(model=str(tmp_path), max_model_len=256)
    message = str(info.value)
    assert "missing tensors: model.layers.3.mlp.up_proj.weight" in message
    assert "unknown tensors: model.layers.3.mlp.extra_proj.weight" in message


def test_index_naming_a_missing_shard(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "gone.safetensors"}})
    )
    with pytest.raises(WeightLoadError, match="gone.safetensors"):
        list(SafetensorsLoader().load_tensors(str(tmp_path)))
