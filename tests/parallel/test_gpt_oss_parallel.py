"""GPT-OSS split over 2 tensor-parallel ranks: each rank holds half the query and KV heads (their
q/k/v rows and biases, o_proj columns, attention sinks) and half the experts (float, or MXFP4
blocks kept packed); greedy tokens equal transformers' float32 ones, as in one process
(tests/models/test_gpt_oss.py). The sliding window is narrowed to 8 so that every prompt and its
24 tokens cross it, and the sinks are set large enough that each rank's own matter. Split into
2 pipeline stages instead (a layer each: the sliding one, then the full one), likewise."""

from __future__ import annotations

import pytest

from fastdeploy import LLM, SamplingParams

pytest.importorskip("paddle", reason="tensor parallelism on the CPU uses paddle.distributed (gloo)")
torch = pytest.importorskip("torch", reason="the reference tokens come from transformers")
pytest.importorskip("transformers", reason="the reference tokens come from transformers")

import tiny_gpt_oss as gpt_oss  # noqa: E402  (needs torch and transformers)

WINDOW = 8
#: per layer, per query head (rank 0 holds heads 0-1, rank 1 heads 2-3)
SINKS = [[0.5, -1.0, 3.0, 1.5], [2.5, -0.5, 1.0, 4.0]]


def set_sinks(model, sinks: list[list[float]]) -> None:
    with torch.no_grad():
        for layer, values in zip(model.model.layers, sinks, strict=True):
            layer.self_attn.sinks.copy_(torch.tensor(values))


def test_each_ranks_sinks_change_the_tokens():
    """With rank 0's sinks on rank 1's heads, transformers' tokens change: the equality below
    covers the split of the sinks."""
    model = gpt_oss.reference_model(sliding_window=WINDOW)
    set_sinks(model, SINKS)
    tokens = gpt_oss.reference_tokens(model)
    set_sinks(model, [values[:2] * 2 for values in SINKS])
    assert gpt_oss.reference_tokens(model) != tokens


@pytest.mark.parametrize(("tp", "pp", "experts"), [(2, 1, "float"), (2, 1, "mxfp4"), (1, 2, "float")])
def test_gpt_oss_over_two_ranks_matches_transformers(tmp_path, tp, pp, experts):
    model = gpt_oss.reference_model(sliding_window=WINDOW)
    set_sinks(model, SINKS)
    if experts == "float":
        tensors = {name: t.numpy() for name, t in model.state_dict().items()}
    else:
        tensors = gpt_oss.mxfp4_tensors(model)
    directory = gpt_oss.write_checkpoint(tmp_path / experts, tensors, sliding_window=WINDOW)
    expected = gpt_oss.reference_tokens(model)
    assert min(len(prompt) for prompt in gpt_oss.PROMPTS) + gpt_oss.NEW_TOKENS > 2 * WINDOW
    llm = LLM(
        model=directory,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_model_len=64,
        max_num_seqs=4,
        block_size=16,
    )
    try:
        params = SamplingParams(temperature=0, max_tokens=gpt_oss.NEW_TOKENS, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in gpt_oss.PROMPTS], params, use_tqdm=False)
        assert [o.outputs.token_ids for o in outputs] == expected
    finally:
        llm.shutdown()
