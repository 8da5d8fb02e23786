"""llama.cpp's GGUF LoRA (`convert_lora_to_gguf.py` output, committed by tools/make_lora_fixture.py)
on the tiny Llama checkpoint: the greedy tokens transformers + peft gave with the PEFT adapter it
was converted from, beside the base model in the same batch. Needs neither torch nor peft."""

from __future__ import annotations

import hashlib
import json

import pytest
import tiny_checkpoints as tiny

from fastdeploy import LLM, LoRARequest, SamplingParams
from fastdeploy.formats.gguf_file import read_gguf

GGUF = tiny.FIXTURES / "gguf" / "tiny-llama-lora-f32.gguf"


@pytest.fixture(scope="module")
def reference() -> dict:
    data = json.loads((tiny.FIXTURES / "tiny_lora_reference.json").read_text(encoding="utf-8"))
    assert data["gguf_sha256"] == hashlib.sha256(GGUF.read_bytes()).hexdigest()
    return data


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("llama")
    tiny.write_checkpoint(directory, "llama", "pt")
    tiny.write_ernie_tokenizer(directory)
    return str(directory)


def test_the_fixture_is_llama_cpp_lora_with_interleaved_qk():
    gguf = read_gguf(GGUF)
    assert gguf.metadata["general.type"] == "adapter" and gguf.metadata["adapter.type"] == "lora"
    names = {tensor.name for tensor in gguf.tensors}
    assert {"blk.0.attn_q.weight.lora_a", "blk.1.ffn_down.weight.lora_b"} <= names


def test_gguf_lora_matches_peft(base_dir, reference):
    assert reference["tokens"] != reference["base_tokens"]
    llm = LLM(base_dir, device="cpu", enable_lora=True, max_loras=1, max_lora_rank=8)
    adapter = LoRARequest("gguf", 1, str(GGUF))
    prompts = [{"prompt_token_ids": prompt} for prompt in reference["prompts"]] * 2
    loras = [adapter] * len(reference["prompts"]) + [None] * len(reference["prompts"])
    params = SamplingParams(temperature=0.0, max_tokens=len(reference["tokens"][0]), ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    tokens = [output.outputs[0].token_ids for output in outputs]
    assert tokens == reference["tokens"] + reference["base_tokens"]
