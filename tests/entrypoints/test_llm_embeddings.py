"""`LLM(model, runner="pooling").embed(...)` against sentence-transformers and transformers on the
same checkpoint: tiny random Qwen3 models saved by sentence-transformers (last-token pooling with
normalisation and a query prompt, as Qwen3-Embedding; mean pooling without), see
tests/models/embedding_checkpoint.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))

pytest.importorskip(
    "sentence_transformers", reason="the reference embeddings come from sentence-transformers"
)
torch = pytest.importorskip("torch", reason="sentence-transformers runs on torch")

import embedding_checkpoint  # noqa: E402
from fake_hub import FakeHub, Repo  # noqa: E402
from huggingface_hub import constants as hf_constants  # noqa: E402

from fastdeploy import LLM, PoolingParams, SamplingParams  # noqa: E402
from fastdeploy.backends.cpu import native  # noqa: E402
from fastdeploy.errors import InvalidArgumentError, UnsupportedModelError  # noqa: E402

SENTENCES = [
    "the river bank is cold in the morning",
    "where is the money",
    "paris is the capital of france",
    "a small red bird on a green tree in the warm rain at night " * 3,
    "what",
    "how fast is the new train from the old city to the sea by the bridge",
]
#: 1e-5 cosine distance, the issue's bound
COSINE = 1e-5
#: dtype="bfloat16" (opt-in): each product's inputs keep 8 significant bits
BF16_COSINE = 5e-3
#: quantization="wint8" with FD_CPU_ACTIVATIONS=int8 (opt-in): int8 weights per output channel and
#: int8 activations per 128 inputs (measured: 2.0e-3 on this checkpoint)
W8A8_COSINE = 1e-2


def cosine_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return 1 - (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def embeddings(outputs) -> np.ndarray:
    assert all(output.error_code == 200 and output.finished for output in outputs)
    return np.array([output.outputs.embedding for output in outputs], dtype=np.float32)


@pytest.fixture(scope="module")
def last_token(tmp_path_factory):
    """Last-token pooling, normalised, with Qwen3-Embedding's query prompt."""
    directory = str(tmp_path_factory.mktemp("emb") / "last")
    reference = embedding_checkpoint.build(
        directory, "lasttoken", True, prompts={"query": embedding_checkpoint.QUERY_PROMPT, "document": ""}
    )
    return directory, reference


@pytest.fixture(scope="module")
def mean(tmp_path_factory):
    """Mean pooling, not normalised."""
    directory = str(tmp_path_factory.mktemp("emb") / "mean")
    return directory, embedding_checkpoint.build(directory, "mean", False, seed=31)


@pytest.fixture(scope="module")
def last_llm(last_token):
    # a small budget and few seats: long prompts are computed in chunks, the batch in several steps
    return LLM(last_token[0], runner="pooling", max_num_batched_tokens=16, max_num_seqs=3, max_model_len=128)


def test_checkpoint_is_saved_as_published(last_token):
    """What the runner must read: the bare decoder, the Pooling and Normalize modules, the prompts."""
    directory = Path(last_token[0])
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["Qwen3Model"]
    kinds = [
        module["type"].rsplit(".", 1)[-1] for module in json.loads((directory / "modules.json").read_text())
    ]
    assert kinds == ["Transformer", "Pooling", "Normalize"]


def test_last_token_matches_sentence_transformers(last_token, last_llm):
    reference = last_token[1].encode(SENTENCES, convert_to_numpy=True)
    ours = embeddings(last_llm.embed(SENTENCES, use_tqdm=False))
    assert ours.shape == reference.shape == (len(SENTENCES), 32)
    assert cosine_distance(ours, reference).max() < COSINE
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-6)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


@pytest.mark.skipif(not native.has_bf16(), reason="dtype='bfloat16' is only fast with AVX512_BF16")
def test_bfloat16_matmuls_stay_near_sentence_transformers(last_token):
    """The opt-in dtype="bfloat16" (linear layers multiply bfloat16-rounded weights and
    activations): near the float32 reference, and not equal to it (the rounding happened)."""
    reference = last_token[1].encode(SENTENCES, convert_to_numpy=True)
    llm = LLM(last_token[0], runner="pooling", dtype="bfloat16", max_model_len=128)
    ours = embeddings(llm.embed(SENTENCES, use_tqdm=False))
    distance = cosine_distance(ours, reference)
    assert distance.max() < BF16_COSINE
    assert distance.max() > 1e-7  # float32 products: ~1e-11


@pytest.mark.skipif(
    native.unavailable_reason() is not None, reason="int8 activations need the native kernels"
)
@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_int8_products_stay_near_sentence_transformers(last_token, monkeypatch, isa):
    """wint8 weights with int8 activations (gemm_w8a8.c, AVX-512 VNNI and AVX2): near the float32
    reference, and not equal to it (the rounding happened)."""
    if isa == "avx512" and native.best_isa() != "avx512":
        pytest.skip("no AVX-512 here")
    reference = last_token[1].encode(SENTENCES, convert_to_numpy=True)
    monkeypatch.setenv("FD_CPU_ACTIVATIONS", "int8")
    monkeypatch.setenv("FD_CPU_KERNELS", isa)
    llm = LLM(last_token[0], runner="pooling", quantization="wint8", max_model_len=128)
    ours = embeddings(llm.embed(SENTENCES, use_tqdm=False))
    distance = cosine_distance(ours, reference)
    assert distance.max() < W8A8_COSINE
    assert distance.max() > 1e-6


def test_tokens_are_the_reference_tokenizers(last_token, last_llm):
    """Texts are encoded as transformers' `tokenizer(text)` does: `<|endoftext|>` appended."""
    tokenizer = last_token[1].tokenizer
    (output,) = last_llm.embed(SENTENCES[0], use_tqdm=False)
    assert output.prompt_token_ids == tokenizer(SENTENCES[0])["input_ids"]
    assert output.prompt_token_ids[-1] == 2


def test_query_prompt_as_sentence_transformers(last_token, last_llm):
    """Qwen3-Embedding's instruction format through the checkpoint's named prompt."""
    reference = last_token[1].encode(SENTENCES[:3], prompt_name="query", convert_to_numpy=True)
    ours = embeddings(last_llm.embed(SENTENCES[:3], prompt_name="query", use_tqdm=False))
    assert cosine_distance(ours, reference).max() < COSINE
    plain = embeddings(last_llm.embed(SENTENCES[:3], use_tqdm=False))
    assert cosine_distance(ours, plain).min() > 1e-3  # the prompt changed the embeddings
    with pytest.raises(InvalidArgumentError, match="prompt_name 'passage'.*names: document, query"):
        last_llm.embed("x", prompt_name="passage")


def test_token_id_prompts_are_embedded_as_given(last_llm):
    texts = embeddings(last_llm.embed(SENTENCES[:2], use_tqdm=False))
    ids = [output.prompt_token_ids for output in last_llm.embed(SENTENCES[:2], use_tqdm=False)]
    np.testing.assert_array_equal(embeddings(last_llm.embed(ids, use_tqdm=False)), texts)
    np.testing.assert_array_equal(embeddings(last_llm.embed(ids[0], use_tqdm=False)), texts[:1])


def test_mean_matches_sentence_transformers_across_chunks(mean):
    directory, reference_model = mean
    reference = reference_model.encode(SENTENCES, convert_to_numpy=True)
    for budget in (2048, 7):  # whole prompts, and prompts computed 7 tokens a pass
        llm = LLM(directory, runner="pooling", max_num_batched_tokens=budget, max_model_len=128)
        ours = embeddings(llm.embed(SENTENCES, use_tqdm=False))
        assert cosine_distance(ours, reference).max() < COSINE, budget
        np.testing.assert_allclose(ours, reference, atol=1e-5)
        assert abs(np.linalg.norm(ours[0]) - 1) > 1e-2  # not normalised, as the checkpoint says


@pytest.mark.parametrize("device", ["torch-cpu", "paddle-cpu"])
def test_the_cuda_backends_code_pools_alike(mean, device):
    """The cuda backend's runtime code on the host (rows gathered and copied from its tensors),
    prompts computed 4 tokens a pass."""
    directory, reference_model = mean
    llm = LLM(directory, runner="pooling", device=device, max_num_batched_tokens=4, max_model_len=128)
    ours = embeddings(llm.embed(SENTENCES, use_tqdm=False))
    assert cosine_distance(ours, reference_model.encode(SENTENCES, convert_to_numpy=True)).max() < COSINE


def test_cls_and_mean_equal_transformers_hidden_states(mean):
    """CLS (pooler_config) and mean against transformers' own last hidden state."""
    directory, reference_model = mean
    tokenizer = reference_model.tokenizer
    model = reference_model[0].auto_model
    llm = LLM(directory, runner="pooling", pooler_config={"pooling_type": "CLS", "normalize": True})
    ours = embeddings(llm.embed(SENTENCES, use_tqdm=False))
    for text, vector in zip(SENTENCES, ours, strict=True):
        with torch.no_grad():
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].numpy()
        assert cosine_distance(vector, hidden[0]) < COSINE
        np.testing.assert_allclose(vector, hidden[0] / np.linalg.norm(hidden[0]), atol=1e-5)


def test_dimensions_cut_matryoshka_embeddings_and_renormalise(last_token):
    directory, reference_model = last_token
    llm = LLM(directory, runner="pooling", pooler_config={"is_matryoshka": True})
    full = reference_model.encode(SENTENCES[:3], convert_to_numpy=True)
    outputs = llm.embed(SENTENCES[:3], PoolingParams(dimensions=8), use_tqdm=False)
    cut = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(embeddings(outputs), cut, atol=1e-5)
    (refused,) = llm.embed("x", PoolingParams(dimensions=33), use_tqdm=False)  # fails alone, as in generate
    assert refused.error_code == 400
    assert "dimensions=33 is not a size of this model's embeddings: 1 to 32" in refused.error_msg


def test_dimensions_refused_where_the_model_declares_no_matryoshka(last_llm):
    outputs = last_llm.embed(["x", "y"], [PoolingParams(dimensions=8), PoolingParams()], use_tqdm=False)
    assert [output.error_code for output in outputs] == [400, 200]
    assert "dimensions=8: this model does not declare Matryoshka" in outputs[0].error_msg


def test_one_bad_prompt_fails_alone(last_token, last_llm):
    outputs = last_llm.embed([SENTENCES[0], [1, 10_000], "", SENTENCES[1]], use_tqdm=False)
    assert [output.error_code for output in outputs] == [200, 400, 400, 200]
    assert "prompt token ids must be in [0, 99)" in outputs[1].error_msg
    assert "prompt 2 is an empty string" in outputs[2].error_msg
    reference = last_token[1].encode([SENTENCES[0], SENTENCES[1]], convert_to_numpy=True)
    assert cosine_distance(embeddings([outputs[0], outputs[3]]), reference).max() < COSINE


def test_a_failing_pass_fails_only_its_request(last_token, last_llm, monkeypatch):
    """A pass that raises is run again per sequence (fault isolation): the prompt that fails
    alone ends with 500, the others get their embeddings."""
    engine = last_llm.llm_engine
    pool = engine._runner.pool
    poison = last_token[1].tokenizer("fish")["input_ids"][0]

    def failing_pool(batch, pooling_type):
        if any(poison in seq.token_ids for seq in batch.seqs):
            raise RuntimeError("injected kernel failure")
        return pool(batch, pooling_type)

    monkeypatch.setattr(engine._runner, "pool", failing_pool)
    outputs = last_llm.embed([SENTENCES[0], "a fish in the sea", SENTENCES[2]], use_tqdm=False)
    assert [output.error_code for output in outputs] == [200, 500, 200]
    assert "injected kernel failure" in outputs[1].error_msg
    reference = last_token[1].encode([SENTENCES[0], SENTENCES[2]], convert_to_numpy=True)
    assert cosine_distance(embeddings([outputs[0], outputs[2]]), reference).max() < COSINE
    assert (
        not engine.has_unfinished_requests()
        and engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    )


def test_the_runners_refuse_each_others_calls(last_llm, llm):
    with pytest.raises(
        InvalidArgumentError, match=r"LLM.generate\(\) needs runner='generate'.*use embed\(\)"
    ):
        last_llm.generate("hello", SamplingParams(max_tokens=2))
    with pytest.raises(InvalidArgumentError, match=r"LLM.chat\(\) needs runner='generate'"):
        last_llm.chat([{"role": "user", "content": "hi"}])
    with pytest.raises(InvalidArgumentError, match=r"LLM.embed\(\) needs runner='pooling'"):
        llm.embed("hello")


def test_a_model_without_pooling_names_the_supported_ones(tmp_path, last_token):
    directory = tmp_path / "bare"
    shutil.copytree(last_token[0], directory)
    (directory / "modules.json").unlink()
    with pytest.raises(UnsupportedModelError) as info:
        LLM(str(directory), runner="pooling")
    assert "has no sentence-transformers modules.json" in str(info.value)
    assert "LAST" in str(info.value) and "MEAN" in str(info.value) and "CLS" in str(info.value)
    # and a pooling named in pooler_config serves it
    llm = LLM(str(directory), runner="pooling", pooler_config={"pooling_type": "last"})
    reference = last_token[1].encode(SENTENCES[:2], convert_to_numpy=True)
    assert cosine_distance(embeddings(llm.embed(SENTENCES[:2], use_tqdm=False)), reference).max() < COSINE


def test_files_as_qwen3_embedding_publishes_them(tmp_path, last_token):
    """config.json naming the causal LM over bare decoder tensors, sentence-transformers' older
    module names and boolean Pooling keys: the same embeddings."""
    directory = tmp_path / "published"
    shutil.copytree(last_token[0], directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"architectures": ["Qwen3ForCausalLM"]}))
    modules = json.loads((directory / "modules.json").read_text())
    for module in modules:
        module["type"] = "sentence_transformers.models." + module["type"].rsplit(".", 1)[-1]
    (directory / "modules.json").write_text(json.dumps(modules))
    legacy = {f"pooling_mode_{mode}": False for mode in ("cls_token", "mean_tokens", "max_tokens")}
    legacy |= {"word_embedding_dimension": 32, "pooling_mode_lasttoken": True, "include_prompt": True}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(legacy))
    llm = LLM(str(directory), runner="pooling")
    reference = last_token[1].encode(SENTENCES, prompt_name="query", convert_to_numpy=True)
    ours = embeddings(llm.embed(SENTENCES, prompt_name="query", use_tqdm=False))
    assert cosine_distance(ours, reference).max() < COSINE


def test_a_hub_id_downloads_the_sentence_transformers_files(tmp_path, monkeypatch, last_token):
    """`LLM("org/name", runner="pooling")` from a loopback Hugging Face hub: the pooling and the
    prompts arrive with the weights (tests/hub/fake_hub.py; nothing reaches the internet)."""
    root = Path(last_token[0])
    files = {str(path.relative_to(root)): path.read_bytes() for path in root.rglob("*") if path.is_file()}
    with FakeHub({"org/tiny-embed": Repo(files)}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "FD_MODEL_SOURCE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        llm = LLM("org/tiny-embed", runner="pooling")
        # built: modules.json and 1_Pooling/config.json came (without them it refuses to load)
    reference = last_token[1].encode(SENTENCES[:2], prompt_name="query", convert_to_numpy=True)
    ours = embeddings(llm.embed(SENTENCES[:2], prompt_name="query", use_tqdm=False))
    assert cosine_distance(ours, reference).max() < COSINE


def test_unsupported_sentence_transformers_poolings_are_named(tmp_path, last_token):
    directory = tmp_path / "max"
    shutil.copytree(last_token[0], directory)
    config = directory / "1_Pooling" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"pooling_mode": "max"}))
    with pytest.raises(UnsupportedModelError, match="pooling mode 'max' is not supported.*LAST.*MEAN.*CLS"):
        LLM(str(directory), runner="pooling")


def test_pooling_options_are_checked():
    with pytest.raises(InvalidArgumentError, match="runner must be one of generate, pooling"):
        LLM(runner="embed")
    with pytest.raises(InvalidArgumentError, match="pooler_config applies to runner='pooling' only"):
        LLM(pooler_config={"pooling_type": "LAST"})
    with pytest.raises(InvalidArgumentError, match="runner='pooling' runs the model in the engine process"):
        LLM(runner="pooling", tensor_parallel_size=2)
