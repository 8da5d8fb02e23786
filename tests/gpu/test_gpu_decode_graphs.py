"""Decode steps on a GPU: sampling inside the CUDA graph replay, one device-to-host copy a step.

A random-weight checkpoint of SmolLM2-135M's shape (tools/gpu_checkpoints.py) in float32, three
prompts, greedy and seeded top-p sampling, with CUDA graphs (the default) and with
`enforce_eager=True`. With graphs every step reads one copy (the token ids with the broken-row
flags) and the decode steps are replayed; eagerly a sampled step reads two (the row maxima, then
the drawn ids). The first 8 tokens of both runs must agree: the same kernels, the same uniforms
from each sequence's generator (later tokens may part where random weights leave two tokens
within float32 rounding, the split-KV decode differing in its split count).
"""

from __future__ import annotations

import gc
import importlib.util
import os

import pytest

pytestmark = pytest.mark.gpu

DEVICE = os.environ.get("FD_GPU_TEST_DEVICE", "cuda")
PROMPTS = [[72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100], [84, 104, 101, 32] * 5, [1, 2, 3]]
NEW_TOKENS = 24
COMPARED = 8


def _checkpoint(directory: str) -> str:
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "gpu_checkpoints.py")
    spec = importlib.util.spec_from_file_location("gpu_checkpoints", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_checkpoint(directory, "llama", "smollm2")


def _run(path: str, eager: bool) -> dict:
    """Tokens per prompt, greedy and sampled, the transfers of every step, and the replays."""
    import torch

    from fastdeploy import LLM, SamplingParams

    llm = LLM(path, device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, enforce_eager=eager)
    engine = llm.llm_engine
    rt = engine.backend.rt
    counted = {"transfers": 0, "inside": 0}
    to_numpy, copy_later = rt.to_numpy, rt.copy_to_host_later

    def counting_to_numpy(tensor):
        counted["transfers"] += 0 if counted["inside"] else 1
        return to_numpy(tensor)

    def counting_copy_later(tensors):
        counted["transfers"] += 1
        counted["inside"] += 1
        try:
            return copy_later(tensors)
        finally:
            counted["inside"] -= 1

    rt.to_numpy, rt.copy_to_host_later = counting_to_numpy, counting_copy_later
    steps: list[int] = []
    step = engine.step

    def counted_step():
        before = counted["transfers"]
        outputs = step()
        steps.append(counted["transfers"] - before)
        return outputs

    engine.step = counted_step
    settings = {
        "greedy": SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
        "sampled": SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=NEW_TOKENS, ignore_eos=True),
    }
    result = {}
    for name, params in settings.items():
        steps.clear()
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        result[name] = ([list(o.outputs.token_ids) for o in outputs], list(steps))
    graphs = engine.runner.graphs
    result["replays"] = graphs.replays if graphs is not None else 0
    del llm, engine, graphs
    gc.collect()
    torch.cuda.empty_cache()
    return result


def test_replayed_decode_steps_sample_in_the_graph_with_one_transfer(tmp_path):
    if DEVICE != "cuda":
        pytest.skip("CUDA graphs are captured only on a GPU")
    path = _checkpoint(str(tmp_path))
    replayed = _run(path, eager=False)
    eager = _run(path, eager=True)
    assert replayed["replays"] >= 2 * (NEW_TOKENS - 1)
    for name in ("greedy", "sampled"):
        tokens, steps = replayed[name]
        assert all(transfers <= 1 for transfers in steps), (name, steps)
        eager_tokens, _ = eager[name]
        assert [t[:COMPARED] for t in tokens] == [t[:COMPARED] for t in eager_tokens], name
    assert max(eager["sampled"][1]) >= 2  # eager sampled steps: row maxima, then the drawn ids
