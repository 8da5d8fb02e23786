"""The end-to-end check of the backend conformance suite: a whole `LLM` on a device.

It sits with the entry points because it builds an `LLM`; the op-level checks are in
`fastdeploy.backends.conformance`. Plugin authors reach both through `fastdeploy.plugins.api`.
"""

from __future__ import annotations

from fastdeploy.backends.conformance import numpy_reference as ref
from fastdeploy.backends.conformance.checkpoint import tiny_llama
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.llm import LLM


def check_greedy_generation(device: str, directory: str, new_tokens: int = 12) -> list[int]:
    """`LLM(device=device)` on a tiny random Llama greedily produces the numpy forward's tokens.

    Two prompts run as one batch (so prefill and decode share passes); returns the first
    prompt's tokens.
    """
    config, weights = tiny_llama(directory)
    prompts = [[72, 101, 108, 108, 111, 44, 32], [87, 111, 114, 108, 100]]
    llm = LLM(
        model=directory,
        device=device,
        dtype="float32",
        max_model_len=64,
        block_size=4,
        num_gpu_blocks_override=64,
    )
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    results = []
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = ref.greedy_tokens(lambda ids: ref.llama_logits(weights, config, ids), prompt, new_tokens)
        got = list(output.outputs.token_ids)
        if got != expected:
            raise AssertionError(f"greedy generation on {device}: got {got}, numpy reference {expected}")
        results.append(got)
    return results[0]
