"""LoRA adapters in the server, through the real openai SDK: `--lora-modules`, the request's
`model` picking the adapter, `/v1/models` listing adapters with their base, unknown adapters'
404, and loading and unloading at run time."""

from __future__ import annotations

import httpx
import lora_fixtures as fixtures
import openai
import pytest
from openai_server_helpers import ServerProcess, free_port

from fastdeploy import LLM
from fastdeploy.entrypoints.openai.api_server import check_server_flags
from fastdeploy.entrypoints.openai.cli_args import build_parser
from fastdeploy.entrypoints.openai.serving_lora import parse_lora_modules
from fastdeploy.errors import InvalidArgumentError


@pytest.fixture(scope="module")
def server(llama_dir, adapters):
    modules = [f"{name}={path}" for name, path in adapters.items() if name != "mlp-r2-rslora"]
    process = ServerProcess(
        [
            "-m",
            "fastdeploy.entrypoints.openai.api_server",
            llama_dir,
            "--device",
            "cpu",
            "--served-model-name",
            "tiny-llama",
            "--enable-lora",
            "--max-loras",
            "2",
            "--max-lora-rank",
            "8",
            "--lora-modules",
            *modules,
            "--allow-runtime-lora-updating",
        ],
        free_port(),
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def expected_text(llama_dir, reference_tokens):
    """The text of each reference continuation, decoded by the checkpoint's own tokenizer (the
    server answers with text)."""
    tokenizer = LLM(llama_dir, device="cpu", max_num_seqs=1).get_tokenizer()
    texts = {
        name: [tokenizer.decode(tokens, skip_special_tokens=True) for tokens in outputs]
        for name, outputs in reference_tokens.items()
    }
    for name, outputs in texts.items():  # the texts tell the adapters apart
        assert name is None or outputs != texts[None], name
    return texts


def _complete(client, model: str, prompt: list[int]) -> str:
    response = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=fixtures.NEW_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    return response.choices[0].text


def test_model_field_picks_the_adapter(client, expected_text):
    for model, name in (("all-r8", "all-r8"), ("attn-r4", "attn-r4"), ("tiny-llama", None)):
        for index, prompt in enumerate(fixtures.PROMPTS):
            assert _complete(client, model, prompt) == expected_text[name][index], (model, index)


def test_models_lists_adapters_with_their_parent(client):
    models = {model.id: model for model in client.models.list().data}
    assert set(models) == {"tiny-llama", "all-r8", "attn-r4"}
    assert models["all-r8"].parent == "tiny-llama" and models["tiny-llama"].parent is None


def test_unknown_adapter_is_404_listing_the_names(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="nope", prompt=[1, 2, 3], max_tokens=2)
    message = caught.value.body["message"]
    assert "nope" in message and "all-r8" in message and "attn-r4" in message


def test_load_and_unload_at_run_time(server, client, adapters, expected_text):
    """vLLM's endpoints and bodies: a text answer on success, the OpenAI error shape otherwise."""
    load, unload = server.url + "/v1/load_lora_adapter", server.url + "/v1/unload_lora_adapter"
    missing = httpx.post(load, json={"lora_name": "mlp", "lora_path": "/nowhere"})
    assert missing.status_code == 400 and "no such directory" in missing.json()["error"]["message"]
    loaded = httpx.post(load, json={"lora_name": "mlp", "lora_path": adapters["mlp-r2-rslora"]})
    assert loaded.status_code == 200 and "mlp" in loaded.text
    assert (
        httpx.post(load, json={"lora_name": "mlp", "lora_path": adapters["mlp-r2-rslora"]}).status_code == 400
    )
    assert _complete(client, "mlp", fixtures.PROMPTS[1]) == expected_text["mlp-r2-rslora"][1]
    assert "mlp" in {model.id for model in client.models.list().data}
    assert httpx.post(unload, json={"lora_name": "mlp"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="mlp", prompt=[1, 2, 3], max_tokens=2)
    assert httpx.post(unload, json={"lora_name": "mlp"}).status_code == 404
    assert httpx.post(load, json={"lora_name": "x"}).status_code == 400  # lora_path missing


def test_lora_flags_need_enable_lora_and_well_formed_modules():
    parser = build_parser("serve")
    with pytest.raises(InvalidArgumentError, match="need --enable-lora"):
        check_server_flags(parser.parse_args(["--lora-modules", "a=/x"]))
    assert parse_lora_modules(["a=/x", '{"name": "b", "path": "/y"}']) == [("a", "/x"), ("b", "/y")]
    with pytest.raises(InvalidArgumentError, match="expected name=path"):
        parse_lora_modules(["just-a-path"])
    with pytest.raises(InvalidArgumentError, match="must be distinct"):
        parse_lora_modules(["a=/x", "a=/y"])
