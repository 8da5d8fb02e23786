"""A checkpoint's generation_config.json sets the sampling defaults of requests that leave them unset
(FastDeploy applies its temperature/top_p/penalties; vLLM also top_k, min_p and max_new_tokens)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import tiny_checkpoints as tiny  # noqa: E402

from fastdeploy import LLM, SamplingParams  # noqa: E402
from fastdeploy.engine.generation_defaults import read_generation_defaults  # noqa: E402
from fastdeploy.entrypoints.openai.params import chat_sampling_params, completion_sampling_params  # noqa: E402
from fastdeploy.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest  # noqa: E402
from fastdeploy.errors import InvalidArgumentError  # noqa: E402


def write_generation_config(directory: Path, **values) -> None:
    # transformers writes the token ids there too; they are not sampling settings
    values = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "transformers_version": "5.0"} | values
    (directory / "generation_config.json").write_text(json.dumps(values), encoding="utf-8")


def test_sampling_keys_are_read_and_max_new_tokens_becomes_max_tokens(tmp_path):
    write_generation_config(
        tmp_path, temperature=0.8, top_p=0.8, top_k=20, repetition_penalty=1.05, max_new_tokens=9
    )
    assert read_generation_defaults(str(tmp_path)) == {
        "temperature": 0.8,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
        "max_tokens": 9,
    }
    assert read_generation_defaults(str(tmp_path), "none") == {}


def test_no_file_or_a_single_file_checkpoint_gives_no_defaults(tmp_path):
    assert read_generation_defaults(str(tmp_path)) == {}
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"GGUF")
    assert read_generation_defaults(str(model_file)) == {}


def test_an_invalid_value_names_the_file_and_the_field(tmp_path):
    write_generation_config(tmp_path, top_p=1.5)
    with pytest.raises(
        InvalidArgumentError, match=r"generation_config.json: SamplingParams.top_p must be in"
    ):
        read_generation_defaults(str(tmp_path))
    (tmp_path / "generation_config.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="must hold a JSON object"):
        read_generation_defaults(str(tmp_path))


def test_an_unknown_mode_is_refused():
    with pytest.raises(InvalidArgumentError, match="generation_config must be one of"):
        LLM(model="unused", generation_config="vllm")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("llama")
    tiny.write_checkpoint(directory, "llama", "pt")
    tiny.write_ernie_tokenizer(directory)
    write_generation_config(directory, temperature=0.0, max_new_tokens=5)
    return directory


def test_offline_calls_without_sampling_params_use_the_checkpoint_defaults(llama_dir):
    reference = json.loads((tiny.FIXTURES / "tiny_model_references.json").read_text(encoding="utf-8"))
    case = reference["models"]["llama"]["cases"][0]
    llm = LLM(model=str(llama_dir), max_model_len=64, max_num_seqs=2, block_size=16)
    assert llm.get_default_sampling_params().max_tokens == 5
    (output,) = llm.generate({"prompt_token_ids": case["prompt_token_ids"]}, use_tqdm=False)
    # greedy (temperature 0 from the file) and 5 tokens: transformers' first 5
    assert output.outputs.token_ids == case["output_token_ids"][:5]
    # explicit SamplingParams are taken as given
    (output,) = llm.generate(
        {"prompt_token_ids": case["prompt_token_ids"]},
        SamplingParams(temperature=0, max_tokens=7),
        use_tqdm=False,
    )
    assert output.outputs.token_ids == case["output_token_ids"][:7]


def test_generation_config_none_ignores_the_file(llama_dir):
    llm = LLM(model=str(llama_dir), max_model_len=64, max_num_seqs=2, block_size=16, generation_config="none")
    assert llm.get_default_sampling_params() == SamplingParams()


def test_server_requests_take_defaults_only_for_the_fields_they_omit():
    defaults = {"temperature": 0.7, "top_p": 0.8, "max_tokens": 11}
    omitted = completion_sampling_params(CompletionRequest(model="m", prompt="x"), defaults)
    assert (omitted.temperature, omitted.top_p, omitted.max_tokens) == (0.7, 0.8, 11)
    given = completion_sampling_params(
        CompletionRequest(model="m", prompt="x", temperature=0.0, max_tokens=16), defaults
    )
    assert (given.temperature, given.top_p, given.max_tokens) == (0.0, 0.8, 16)
    chat = chat_sampling_params(
        ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}]), defaults
    )
    assert (chat.temperature, chat.max_tokens) == (0.7, 11)
    chat = chat_sampling_params(
        ChatCompletionRequest(
            model="m", messages=[{"role": "user", "content": "x"}], max_completion_tokens=3
        ),
        defaults,
    )
    assert chat.max_tokens == 3
    assert completion_sampling_params(CompletionRequest(model="m", prompt="x"), {}).max_tokens == 16
