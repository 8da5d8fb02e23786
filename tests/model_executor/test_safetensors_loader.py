"""Hugging Face directories (config.json + safetensors + tokenizer.json) through the whole engine.

The directories are written by the test from the SmolLM2 GGUF in transformers' layout; greedy
tokens must still match transformers' reference outputs for that model.
"""

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.errors import WeightLoadError
from fastdeploy.model_executor.gguf_export import export_hf_directory, float32_tensors, write_hf_metadata
from fastdeploy.model_executor.loaders.safetensors_loader import SafetensorsLoader


@pytest.fixture(scope="module")
def hf_tensors(smollm2_path):
    return float32_tensors(smollm2_path)


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
    write_hf_metadata(str(directory), smollm2_path)
    return str(directory)


def test_sharded_directory_generates_the_reference_tokens(sharded_dir, smollm2_reference):
    llm = LLM(model=sharded_dir, max_model_len=512)
    cases = smollm2_reference["cases"][:3] + smollm2_reference["cases"][-2:]
    outputs = []
    for case in cases:
        params = SamplingParams(temperature=0, max_tokens=len(case["output_token_ids"]))
        if case["kind"] == "chat":
            (output,) = llm.chat(case["input"], params, use_tqdm=False)
        else:
            (output,) = llm.generate(case["input"], params, use_tqdm=False)
        assert output.prompt_token_ids == case["prompt_token_ids"], case["name"]
        outputs.append(output.outputs.token_ids)
    assert_tokens_match(
        outputs, [case["output_token_ids"] for case in cases], [case["name"] for case in cases]
    )


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
    write_hf_metadata(str(tmp_path), smollm2_path)
    with pytest.raises(WeightLoadError) as info:
        LLM(model=str(tmp_path), max_model_len=256)
    message = str(info.value)
    assert "missing tensors: model.layers.3.mlp.up_proj.weight" in message
    assert "unknown tensors: model.layers.3.mlp.extra_proj.weight" in message


@pytest.mark.parametrize(
    ("cut", "fragment"),
    [
        (0.5, "is truncated: tensor"),  # the header is whole, the data is not
        (4, "cannot read the safetensors header"),  # not even the header's length
        (40, "header of"),  # a header length that runs past the end
    ],
)
def test_a_truncated_file_is_a_weight_load_error_naming_it(tmp_path, cut, fragment):
    path = tmp_path / "model.safetensors"
    save_file({"a": np.arange(1000, dtype=np.float32), "b": np.ones((10, 10), np.float32)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut) if isinstance(cut, float) else cut])
    with pytest.raises(WeightLoadError, match=fragment) as info:
        list(SafetensorsLoader().load_tensors(str(tmp_path)))
    assert "model.safetensors" in str(info.value)


def test_index_naming_a_missing_shard(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "gone.safetensors"}})
    )
    with pytest.raises(WeightLoadError, match="gone.safetensors"):
        list(SafetensorsLoader().load_tensors(str(tmp_path)))


def test_exported_directory_is_a_transformers_layout_that_generates_the_reference(
    tmp_path, smollm2_path, smollm2_reference
):
    export_hf_directory(smollm2_path, str(tmp_path))
    with open(tmp_path / "config.json", encoding="utf-8") as handle:
        config = json.load(handle)
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    case = smollm2_reference["cases"][0]
    llm = LLM(model=str(tmp_path), max_model_len=256, max_num_seqs=2)
    (output,) = llm.generate(
        case["input"], SamplingParams(temperature=0, max_tokens=len(case["output_token_ids"])), use_tqdm=False
    )
    assert output.outputs.token_ids == case["output_token_ids"]
