"""Which files of a repository a hub model id needs, from the repository's listing alone."""

from __future__ import annotations

import pytest

from fastdeploy.errors import InvalidArgumentError, ModelNotFoundError
from fastdeploy.hub.files import choose_files, download_patterns
from fastdeploy.hub.model_id import HubModelId, parse_hub_id
from fastdeploy.model_resolver import is_hub_id, resolve_model

QWEN_LIKE = [
    ".gitattributes",
    "LICENSE",
    "README.md",
    "config.json",
    "generation_config.json",
    "merges.txt",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "onnx/model.safetensors",
    "additional_chat_templates/tool_use.jinja",
]


def pick(files, model="org/name", gguf_file=None):
    return choose_files(files, parse_hub_id(model), gguf_file, "org/name")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Qwen/Qwen3-0.6B", HubModelId("Qwen/Qwen3-0.6B")),
        ("unsloth/Qwen3-0.6B-GGUF:Q4_K_M", HubModelId("unsloth/Qwen3-0.6B-GGUF", "Q4_K_M")),
        ("org/name.v2:iq4_xs", HubModelId("org/name.v2", "iq4_xs")),
        ("no-slash", None),
        ("./org/name", None),
        ("/abs/path", None),
        ("org/name/extra", None),
        ("org--x/name", None),
        ("org/na..me", None),
        ("org/name:", None),
    ],
)
def test_hub_ids(text, expected):
    assert parse_hub_id(text) == expected


def test_a_checkpoint_takes_its_weights_config_tokenizer_and_templates_only():
    selection = pick(QWEN_LIKE)
    assert selection.weights == ""
    assert selection.files == (
        "additional_chat_templates/tool_use.jinja",
        "config.json",
        "generation_config.json",
        "merges.txt",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.json",
    )


def test_an_embedding_model_takes_its_sentence_transformers_files():
    """Qwen3-Embedding's repository: the pooling runner reads modules.json, the prompts and the
    Pooling module's config.json (docs/embeddings.md); a Dense module's weights stay."""
    listing = [
        *QWEN_LIKE,
        "modules.json",
        "config_sentence_transformers.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
        "2_Dense/config.json",
        "2_Dense/model.safetensors",
    ]
    files = set(pick(listing).files)
    assert {"modules.json", "config_sentence_transformers.json", "1_Pooling/config.json"} <= files
    assert "2_Dense/model.safetensors" not in files and "onnx/model.safetensors" not in files
    patterns = download_patterns(HubModelId("o/n"), None)
    assert {"modules.json", "config_sentence_transformers.json", "[0-9]*_*/config.json"} <= set(patterns)


def test_mistral_s_consolidated_copy_is_left_when_an_index_names_the_shards():
    files = ["config.json", "consolidated.safetensors", "params.json", "model.safetensors.index.json"]
    files += ["model-00001-of-00001.safetensors", "tokenizer.json"]
    assert "consolidated.safetensors" not in pick(files).files
    assert "consolidated.safetensors" in pick(["config.json", "consolidated.safetensors"]).files


GGUFS = [
    "README.md",
    "Model-Q4_K_M.gguf",
    "Model-Q4_K_S.gguf",
    "Model-Q4_K.gguf",
    "model_q8_0.gguf",
    "mmproj-Model-F16.gguf",
    "BF16/Model-BF16-00001-of-00002.gguf",
    "BF16/Model-BF16-00002-of-00002.gguf",
]


@pytest.mark.parametrize(
    ("tag", "weights"),
    [
        ("Q4_K_M", "Model-Q4_K_M.gguf"),
        ("q4_k_s", "Model-Q4_K_S.gguf"),
        ("Q4_K", "Model-Q4_K.gguf"),  # not Q4_K_M nor Q4_K_S
        ("Q8_0", "model_q8_0.gguf"),  # joined by "_" to the name
        ("bf16", "BF16/Model-BF16-00001-of-00002.gguf"),
    ],
)
def test_a_quant_tag_picks_one_gguf_case_insensitively(tag, weights):
    selection = pick(GGUFS, f"org/name:{tag}")
    assert selection.weights == weights
    assert selection.files[0] == weights


def test_a_split_gguf_downloads_every_shard():
    selection = pick(GGUFS, "org/name:BF16")
    assert selection.files == ("BF16/Model-BF16-00001-of-00002.gguf", "BF16/Model-BF16-00002-of-00002.gguf")
    assert pick(GGUFS, gguf_file="Model-BF16-00002-of-00002.gguf").files == selection.files


def test_without_a_tag_a_gguf_repository_gives_q4_k_m_or_its_only_model():
    assert pick(GGUFS).weights == "Model-Q4_K_M.gguf"
    assert pick(["a.gguf", "mmproj-a.gguf", "README.md"]).weights == "a.gguf"
    with pytest.raises(
        InvalidArgumentError, match=r"several GGUFs \(a-Q8_0.gguf, b-F16.gguf\).*org/name:QUANT"
    ):
        pick(["a-Q8_0.gguf", "b-F16.gguf"])


def test_missing_tags_files_and_weights_are_named():
    with pytest.raises(ModelNotFoundError, match=r"no GGUF with the tag 'IQ1_S'; its GGUFs: BF16/Model"):
        pick(GGUFS, "org/name:IQ1_S")
    with pytest.raises(ModelNotFoundError, match=r"no GGUF file 'x.gguf'"):
        pick(GGUFS, gguf_file="x.gguf")
    with pytest.raises(
        ModelNotFoundError, match=r"holds no weights .* it holds: config.json, pytorch_model.bin"
    ):
        pick(["config.json", "pytorch_model.bin"])


def test_patterns_for_hubs_whose_listing_is_not_read():
    assert download_patterns(HubModelId("o/n", "Q4_K_M"), None) == ["*[qQ]4_[kK]_[mM]*.gguf"]
    assert download_patterns(HubModelId("o/n"), "d/m-00001-of-00002.gguf") == [
        "d/m-00001-of-00002.gguf",
        "d/m-00002-of-00002.gguf",
    ]
    patterns = download_patterns(HubModelId("o/n"), None)
    assert {"config.json", "tokenizer.json", "*.safetensors", "*.safetensors.index.json"} <= set(patterns)
    assert not any(pattern.endswith((".bin", ".gguf", ".pth")) for pattern in patterns)


def test_paths_and_embedded_aliases_come_before_hub_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "org" / "name" / "m-Q8_0.gguf").write_bytes(b"GGUF")
    assert not is_hub_id("org/name")
    assert resolve_model("org/name") == str(tmp_path / "org" / "name")
    assert resolve_model("org/name", gguf_file="m-Q8_0.gguf") == str(
        tmp_path / "org" / "name" / "m-Q8_0.gguf"
    )
    with pytest.raises(ModelNotFoundError, match="gguf_file='x.gguf' is not a file in"):
        resolve_model("org/name", gguf_file="x.gguf")
    with pytest.raises(
        InvalidArgumentError, match=r"revision= applies to hub ids \(org/name\); 'org/name' is not one"
    ):
        resolve_model("org/name", revision="v1")
    assert not is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct")  # the embedded model
    assert is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct", revision="main")
    assert is_hub_id("org/other:Q8_0") and not is_hub_id("other") and not is_hub_id(None)
    with pytest.raises(InvalidArgumentError, match="revision must be a non-empty string"):
        resolve_model("org/other", revision="")
