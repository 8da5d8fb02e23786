"""A tiny Llama GGUF whose tensors are of every block type the cpu kernels keep, mixed tensor by
tensor as llama.cpp's Q4_K_M-style files mix them (fused q/k/v and gate/up of different types),
whole or split into shards.

Each weight must stay in the type it was written in (no float32 copy), and greedy decoding on the
native kernels (both instruction sets) must give the tokens of the numpy path, which multiplies
float32 weights dequantised by `gguf` (the float reference on the dequantised weights).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from test_native_blocks import random_blocks
from test_native_kernels import ISAS, requires_native
from token_match import assert_tokens_match

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.base import BackendOptions
from fastdeploy.backends.cpu import native
from fastdeploy.backends.cpu.backend import CpuBackend
from fastdeploy.errors import UnsupportedModelError
from fastdeploy.formats.gguf_file import read_gguf
from fastdeploy.input.gguf_tokenizer import _BYTE_CHARS
from fastdeploy.model_executor.loaders.gguf_loader import GGUFLoader

HIDDEN, HEADS, KV_HEADS, INNER = 256, 4, 2, 512
#: per layer: the GGML type of q, k, v, output, gate, up, down
LAYERS = [
    ("Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q4_K", "Q6_K"),  # a Q4_K_M layer
    ("Q5_0", "Q5_0", "Q8_0", "Q5_K", "IQ4_XS", "Q3_K", "Q2_K"),
    ("Q4_0", "Q4_1", "Q5_1", "IQ4_NL", "Q5_K", "Q5_K", "Q4_K"),
]
NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
CONTROL = ["<|begin|>", "<|end|>"]


def shapes() -> dict[str, tuple[int, int]]:
    head_dim = HIDDEN // HEADS
    return {
        "attn_q": (HIDDEN, HIDDEN),
        "attn_k": (KV_HEADS * head_dim, HIDDEN),
        "attn_v": (KV_HEADS * head_dim, HIDDEN),
        "attn_output": (HIDDEN, HIDDEN),
        "ffn_gate": (INNER, HIDDEN),
        "ffn_up": (INNER, HIDDEN),
        "ffn_down": (HIDDEN, INNER),
    }


def write_model(path: Path, shard: tuple[int, int] = (0, 1)) -> None:
    """The model, or shard (index, count) of it: every count-th tensor from the index-th on
    (the metadata in every shard)."""
    tokens = [_BYTE_CHARS[byte] for byte in range(256)] + ["he"] + CONTROL
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(len(LAYERS))
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INNER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 257 + [3] * len(CONTROL))
    writer.add_token_merges(["h e"])
    writer.add_bos_token_id(tokens.index("<|begin|>"))
    writer.add_eos_token_id(tokens.index("<|end|>"))
    rng = np.random.default_rng(0)
    seed = iter(range(1000))
    order = iter(range(1000))

    def add(name: str, array: np.ndarray, raw_dtype=None) -> None:
        if next(order) % shard[1] == shard[0]:
            writer.add_tensor(name, array, raw_dtype=raw_dtype)

    def blocks(name: str, type_name: str, rows: int, cols: int) -> None:
        tensor = random_blocks(type_name, rows, cols, next(seed), exponents=(-12, -9))
        add(name, tensor.rows, raw_dtype=tensor.ggml_type)

    blocks("token_embd.weight", "Q4_K", len(tokens), HIDDEN)
    blocks("output.weight", "Q6_K", len(tokens), HIDDEN)
    add("output_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    for layer, types in enumerate(LAYERS):
        for name, type_name in zip(NAMES, types, strict=True):
            blocks(f"blk.{layer}.{name}.weight", type_name, *shapes()[name])
        for norm in ("attn_norm", "ffn_norm"):
            weight = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
            add(f"blk.{layer}.{norm}.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("mixed") / "mixed-q4_k_m-like.gguf"
    write_model(path)
    return str(path)


def greedy(model_path: str, kernels: str, monkeypatch) -> list[list[int]]:
    monkeypatch.setenv("FD_CPU_KERNELS", kernels)
    llm = LLM(model=model_path, max_model_len=128, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate(["hello there", "the 123", "x"], params, use_tqdm=False)
    assert all(output.error_code == 200 for output in outputs)
    return [list(output.outputs.token_ids) for output in outputs]


@requires_native
@pytest.mark.parametrize("isa", ISAS)
def test_greedy_tokens_equal_the_float_reference(model_path, isa, monkeypatch):
    assert_tokens_match(greedy(model_path, isa, monkeypatch), greedy(model_path, "numpy", monkeypatch))


@requires_native
@pytest.mark.parametrize("isa", ISAS)
def test_int8_activations_decode_as_a_prefill_of_the_same_tokens(model_path, isa, monkeypatch):
    """FD_CPU_ACTIVATIONS=int8 runs decode's one-row products on int8 kernels too, whose rows do not
    depend on the rows beside them: each greedy token and its logprob equal those a single prefill
    of the prompt and the tokens before it gives (prompt logprobs), bit for bit, on every type."""
    monkeypatch.setenv("FD_CPU_KERNELS", isa)
    monkeypatch.setenv("FD_CPU_ACTIVATIONS", "int8")
    llm = LLM(model=model_path, max_model_len=128, max_num_seqs=4, enable_prefix_caching=False)
    prompts = [[256, 104, 101, 108, 108, 111, 32, 116, 104, 101, 114, 101], [120], [49, 50, 51]]
    decoding = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], decoding, use_tqdm=False)
    scoring = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    for ids, output in zip(prompts, outputs, strict=True):
        tokens = list(output.outputs.token_ids)
        decoded = [entry[token] for entry, token in zip(output.outputs.logprobs, tokens, strict=True)]
        (rescored,) = llm.generate({"prompt_token_ids": ids + tokens}, scoring, use_tqdm=False)
        entries = rescored.prompt_logprobs[len(ids) :]
        assert [max(entry, key=entry.get) for entry in entries] == tokens
        assert [entry[token] for entry, token in zip(entries, tokens, strict=True)] == decoded


@requires_native
def test_every_weight_keeps_its_ggml_type(model_path, monkeypatch):
    """The loader hands each matrix over in the type it was written in, and the backend's packed
    weights report it: fused q/k/v and gate/up of different types are segments of one weight, each
    in its own type (none dequantised to float32)."""
    monkeypatch.setenv("FD_CPU_KERNELS", "auto")
    tensors = dict(GGUFLoader().load_tensors(model_path))
    backend = CpuBackend(BackendOptions(threads=1))
    for layer, types in enumerate(LAYERS):
        prefix = f"model.layers.{layer}."
        qkv = backend.linear_weight(*(tensors[f"{prefix}self_attn.{p}_proj.weight"] for p in "qkv"))
        gate_up = backend.linear_weight(*(tensors[f"{prefix}mlp.{p}_proj.weight"] for p in ("gate", "up")))
        o_proj = backend.linear_weight(tensors[f"{prefix}self_attn.o_proj.weight"])
        down = backend.linear_weight(tensors[f"{prefix}mlp.down_proj.weight"])
        q, k, v, o, gate, up, down_type = types
        assert segments(qkv) == merge([(q, HIDDEN), (k, 128), (v, 128)])
        assert segments(gate_up) == merge([(gate, INNER), (up, INNER)])
        assert segments(o_proj) == [(o, HIDDEN)] and segments(down) == [(down_type, HIDDEN)]


def segments(weight: native.PackedWeight) -> list[tuple[str, int]]:
    return list(weight.segments) if weight.type_name == "MIXED" else [(weight.type_name, weight.out_features)]


def merge(parts: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Adjacent parts of one type as one segment."""
    merged: list[tuple[str, int]] = []
    for name, columns in parts:
        if merged and merged[-1][0] == name:
            merged[-1] = (name, merged[-1][1] + columns)
        else:
            merged.append((name, columns))
    return merged


@requires_native
def test_a_split_gguf_loads_as_one_model(model_path, tmp_path, monkeypatch):
    """llama.cpp's gguf-split shards (NAME-0000i-of-00003.gguf) run as the single file does; a
    missing shard fails at load, naming it."""
    for index in range(3):
        write_model(tmp_path / f"mixed-{index + 1:05d}-of-00003.gguf", shard=(index, 3))
    first = str(tmp_path / "mixed-00001-of-00003.gguf")
    assert greedy(first, "auto", monkeypatch) == greedy(model_path, "auto", monkeypatch)
    (tmp_path / "mixed-00002-of-00003.gguf").unlink()
    with pytest.raises(
        UnsupportedModelError, match=r"one of 3 shards .* missing: .*mixed-00002-of-00003.gguf"
    ):
        read_gguf(first)
