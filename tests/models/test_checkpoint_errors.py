"""Checkpoint naming: -Paddle detection, and errors that name the tensors at fault."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny_checkpoints as tiny

from fastdeploy import LLM
from fastdeploy.errors import WeightLoadError
from fastdeploy.model_executor.loaders.paddle_ernie import PaddleErnieLoader, PaddleErnieTranslator
from fastdeploy.model_executor.loaders.safetensors_loader import SafetensorsLoader


def _write(directory, name, layout, edit=None, shards=1):
    directory.mkdir(parents=True, exist_ok=True)
    tensors = tiny.pt_tensors(name)
    config = tiny.SPECS[name]["config"]
    if layout == "paddle":
        tensors = tiny.paddle_tensors(name, tensors)
        config = tiny.paddle_config(config)
    if edit is not None:
        edit(tensors)
    tiny.write_safetensors(directory, tensors, shards)
    (directory / "config.json").write_text(json.dumps(config))
    tiny.write_ernie_tokenizer(directory)
    return str(directory)


def test_paddle_directories_are_recognised_by_their_tensor_names(tmp_path):
    paddle = _write(tmp_path / "paddle", "ernie4_5", "paddle", shards=2)
    pt = _write(tmp_path / "pt", "ernie4_5", "pt")
    assert PaddleErnieLoader().can_load(paddle) and not PaddleErnieLoader().can_load(pt)
    names = dict(PaddleErnieLoader().load_tensors(paddle))
    expected = tiny.pt_tensors("ernie4_5")
    assert set(names) == set(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(names[key], value)


def test_missing_paddle_tensor_is_named(tmp_path):
    directory = _write(
        tmp_path,
        "ernie4_5_moe",
        "paddle",
        lambda t: t.pop("ernie.layers.2.mlp.moe_statics.e_score_correction_bias"),
    )
    with pytest.raises(
        WeightLoadError, match=r"missing tensors: model\.layers\.2\.mlp\.moe_statics\.e_score_correction_bias"
    ):
        LLM(model=directory, max_model_len=32)


def test_unknown_expert_is_named(tmp_path):
    def add_expert(tensors):
        tensors["model.layers.1.mlp.experts.8.down_proj.weight"] = np.zeros((32, 16), np.float32)

    directory = _write(tmp_path, "ernie4_5_moe", "pt", add_expert)
    with pytest.raises(
        WeightLoadError, match=r"unknown tensors: model\.layers\.1\.mlp\.experts\.8\.down_proj\.weight"
    ):
        LLM(model=directory, max_model_len=32)


def test_tensors_whose_sizes_disagree_with_config_json_are_named_at_construction(tmp_path):
    """They used to load, then fail the first forward pass (a norm of the wrong width) or a
    request whose token ids lie past the embedding's rows (500)."""
    hidden, vocab = (
        tiny.SPECS["ernie4_5"]["config"]["hidden_size"],
        tiny.SPECS["ernie4_5"]["config"]["vocab_size"],
    )

    def shrink(tensors):
        tensors["model.norm.weight"] = tensors["model.norm.weight"][:-1]
        tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"][:-8]

    directory = _write(tmp_path, "ernie4_5", "pt", shrink)
    with pytest.raises(WeightLoadError) as info:
        LLM(model=directory, max_model_len=32)
    message = str(info.value)
    assert (
        f"model.embed_tokens.weight is ({vocab - 8}, {hidden}), config.json implies ({vocab}, {hidden})"
        in message
    )
    assert f"model.norm.weight is ({hidden - 1},), config.json implies ({hidden},)" in message


def test_fused_qkv_of_the_wrong_width_names_the_tensor(tmp_path):
    translator = PaddleErnieTranslator(tiny.SPECS["ernie4_5"]["config"])
    with pytest.raises(WeightLoadError, match=r"ernie\.layers\.0\.self_attn\.qkv_proj\.weight .* 128 wide"):
        translator.translate("ernie.layers.0.self_attn.qkv_proj.weight", np.zeros((32, 96), np.float32))


def test_multi_token_prediction_tensors_are_ignored(tmp_path):
    def add_mtp(tensors):
        tensors["ernie.mtp_block.0.self_attn.qkv_proj.weight"] = np.zeros((32, 128), np.float32)
        tensors["ernie.mtp_emb_norm.0.weight"] = np.ones(32, np.float32)

    directory = _write(tmp_path, "ernie4_5", "paddle", add_mtp)
    assert (
        LLM(model=directory, max_model_len=32).llm_engine.model_config.architecture == "Ernie4_5_ForCausalLM"
    )


def test_pt_directories_still_go_to_the_plain_safetensors_loader(tmp_path):
    directory = _write(tmp_path, "qwen3", "pt")
    assert SafetensorsLoader().can_load(directory) and not PaddleErnieLoader().can_load(directory)


GOOD_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 32,
    "vocab_size": 64,
}


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ([1, 2], "config.json must be a JSON object, got list"),
        ({**GOOD_CONFIG, "architectures": "LlamaForCausalLM"}, "no 'architectures' list"),
        (
            {k: v for k, v in GOOD_CONFIG.items() if k != "vocab_size"},
            "lacks the required field 'vocab_size'",
        ),
        (
            {**GOOD_CONFIG, "max_position_embeddings": 0},
            "max_position_embeddings must be a positive integer, got 0",
        ),
        ({**GOOD_CONFIG, "hidden_size": "16"}, "hidden_size must be a positive integer, got '16'"),
        ({**GOOD_CONFIG, "num_attention_heads": 2.5}, "num_attention_heads must be a positive integer"),
        ({**GOOD_CONFIG, "num_hidden_layers": True}, "num_hidden_layers must be a positive integer"),
    ],
)
def test_a_malformed_config_names_its_field(config, fragment):
    from fastdeploy.config import ModelConfig
    from fastdeploy.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as info:
        ModelConfig.from_hf_dict(config)
    assert fragment in str(info.value)
    assert ModelConfig.from_hf_dict({**GOOD_CONFIG, "head_dim": None}).head_dim == 4  # null means derived


def _gguf_copy(source: str, target, edit) -> str:
    """`source` rewritten with `edit(name, array)` applied to each tensor's array."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(source)
    writer = GGUFWriter(str(target), reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type)
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))
        writer.add_tensor(tensor.name, edit(tensor.name, np.array(tensor.data).reshape(shape)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(target)


def test_a_gguf_tensor_whose_shape_disagrees_with_the_metadata_names_the_file_and_tensor(tmp_path):
    """The message names the GGUF file, the tensor as the file names it, and the shape its
    metadata implies (not a config.json the user never had)."""
    source = str(tiny.FIXTURES / "gguf" / "tiny-ernie4-5-f32.gguf")
    hidden = tiny.SPECS["ernie4_5"]["config"]["hidden_size"]
    kv_rows = tiny.SPECS["ernie4_5"]["config"]["num_key_value_heads"] * 16

    def shrink(name, array):
        if name == "blk.1.ffn_norm.weight":
            return array[:-1]
        return array[:-16] if name == "blk.0.attn_k.weight" else array

    path = _gguf_copy(source, tmp_path / "bad-shapes.gguf", shrink)
    with pytest.raises(WeightLoadError) as info:
        LLM(model=path, max_model_len=32)
    message = str(info.value)
    assert message.startswith(f"{path}: tensors disagree with the file's ernie4_5 metadata")
    assert (
        f"tensor 'blk.0.attn_k.weight' has shape ({kv_rows - 16}, {hidden}), expected ({kv_rows}, {hidden})"
        in message
    )
    assert f"tensor 'blk.1.ffn_norm.weight' has shape ({hidden - 1},), expected ({hidden},)" in message
    assert "config.json" not in message


def test_a_gguf_architecture_we_lack_is_refused_naming_the_file_and_the_supported_ones(tmp_path):
    from gguf import GGUFWriter

    from fastdeploy.errors import UnsupportedModelError

    path = tmp_path / "state-space.gguf"
    writer = GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError) as info:
        LLM(model=str(path), max_model_len=32)
    message = str(info.value)
    assert message.startswith(f"{path}: GGUF architecture 'mamba' is not supported (supported: ")
    for supported in ("llama", "qwen2", "qwen3", "phi3", "gemma3", "ernie4_5", "ernie4_5-moe", "qwen3moe"):
        assert f"{supported}," in message or f"{supported})" in message
