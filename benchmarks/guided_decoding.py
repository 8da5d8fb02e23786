"""Cost of guided-decoding masks per decode step, against unconstrained steps, on the embedded model.

For each batch size (default 16 and 64) it decodes the same number of steps twice, once with
every request constrained by a JSON schema (an array of objects long enough that no request
finishes early) and once unconstrained (EOS ignored), alternating the two several times, and
prints the median step time of each, the ratio, and how long llguidance takes to fill the batch's
masks alone (the part the worker thread overlaps with the forward pass). Goal: constrained steps
at most 10% slower at batch 16.

    python benchmarks/guided_decoding.py [--batches 16 64] [--steps 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fastdeploy import LLM, GuidedDecodingParams, SamplingParams
from fastdeploy.engine.guided.backend import bitmask_words

SCHEMA = {
    "type": "array",
    "minItems": 200,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "rank": {"type": "integer", "minimum": 1, "maximum": 999},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 2},
        },
        "required": ["name", "rank", "tags"],
        "additionalProperties": False,
    },
}


def step_times(
    llm: LLM, prompt: list[int], batch: int, steps: int, guided: GuidedDecodingParams | None
) -> list[float]:
    """Seconds of each decode step (the prefill step excluded) for `batch` requests."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True, guided_decoding=guided)
    for index in range(batch):
        engine.add_request(f"bench-{time.perf_counter_ns()}-{index}", prompt, params)
    engine.step()  # prefill (and the first token) of every request
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return times


def mask_fill_seconds(llm: LLM, guided: GuidedDecodingParams, batch: int, repeats: int = 20) -> float:
    """Median time llguidance takes to fill `batch` masks (start of the schema)."""
    decoder = llm.llm_engine.guided
    compiled = decoder.compile(guided)
    matchers = [decoder.backend.matcher(compiled) for _ in range(batch)]
    bitmask = np.zeros((batch, bitmask_words(decoder.vocab_size)), dtype=np.int32)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        decoder.backend.fill_bitmasks(matchers, bitmask)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(max_model_len=512, max_num_seqs=max(args.batches), max_num_batched_tokens=8192)
    tokenizer = llm.get_tokenizer()
    text = tokenizer.apply_chat_template([{"role": "user", "content": "List the team members as JSON."}])
    prompt = tokenizer.encode(text, add_special_tokens=False)
    guided = GuidedDecodingParams(json=SCHEMA)
    step_times(llm, prompt, 2, 4, guided)  # warm-up: builds llguidance's tokenizer, compiles the schema
    print(
        f"{'batch':>5} {'unconstrained ms/step':>22} {'constrained ms/step':>20} {'ratio':>7} {'mask fill ms':>13}"
    )
    for batch in args.batches:
        plain, constrained = [], []
        for _ in range(args.rounds):  # alternate, so load changes hit both alike
            plain.extend(step_times(llm, prompt, batch, args.steps, None))
            constrained.extend(step_times(llm, prompt, batch, args.steps, guided))
        base, masked = statistics.median(plain), statistics.median(constrained)
        fill = mask_fill_seconds(llm, guided, batch)
        print(
            f"{batch:>5} {base * 1e3:>22.1f} {masked * 1e3:>20.1f} {masked / base:>7.3f} {fill * 1e3:>13.2f}"
        )


if __name__ == "__main__":
    main()
