"""Single-stream decoding speed with and without speculative decoding, in one run.

Two engines on the embedded SmolLM2 (the same weights): one plain, one with
`--speculative-config` (default prompt lookup, 4 drafts, suffixes of 2 to 4 tokens). Each
workload runs greedily on both, so both produce the same tokens (the script checks), and the
tokens/s of the whole generation (first token included) are compared:

  * grounded: answers that draw on their input (correct a passage's spelling, comment a given
    function, summarise a passage), where prompt lookup drafts are mostly right. The prompts are
    ones the embedded 135M model follows: an instruction it ignores (asked to rename a variable,
    it writes a different function) makes open-ended text, whatever the prompt says;
  * open-ended: a story, where the text rarely repeats and the speculation must back off.

Goals: >= 1.6x on the grounded workload, <= 5% slower on the open-ended one. Each workload is
timed `--repeats` times on each engine, alternating, and the best run of each is kept.

    python benchmarks/speculative.py [--speculative-config JSON] [--new-tokens 160] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

from fastdeploy import LLM, SamplingParams

CODE = """def parse_config(path):
    settings = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            settings[key.strip()] = value.strip()
    return settings
"""

PASSAGE = (
    "The lighthouse stood at the end of the northern pier for more than a century. Every evening "
    "the keeper climbed the one hundred and twelve steps, trimmed the wick, wound the clockwork "
    "that turned the great lens, and wrote the weather in a leather book. Ships passing in the "
    "night saw its beam sweep across the water every ten seconds, and sailors said that as long "
    "as the light turned, the harbour was safe."
)

#: the passage with four spelling mistakes to correct
MISSPELT = (
    PASSAGE.replace("century", "centruy")
    .replace("keeper", "keper")
    .replace("weather", "wether")
    .replace("harbour", "harbur")
)

WORKLOADS = {
    "grounded": [
        [
            {
                "role": "user",
                "content": "Correct the spelling mistakes in this passage and output the corrected "
                f"passage:\n\n{MISSPELT}",
            }
        ],
        [{"role": "user", "content": f"Add comments to this Python function:\n\n```python\n{CODE}```"}],
        [{"role": "user", "content": f"Summarise this passage:\n\n{PASSAGE}"}],
    ],
    "open-ended": [
        [{"role": "user", "content": "Write a short story about a dragon who learns to cook."}],
        [{"role": "user", "content": "Describe your ideal weekend in the mountains."}],
    ],
}


def timed_chat(llm: LLM, messages: list[dict], new_tokens: int) -> tuple[float, list[int], object, int]:
    """Seconds, generated tokens, metrics and prompt length of one greedy chat answer."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens)
    start = time.perf_counter()
    (output,) = llm.chat(messages, params, use_tqdm=False)
    return time.perf_counter() - start, output.outputs.token_ids, output.metrics, len(output.prompt_token_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--speculative-config",
        default='{"method": "ngram", "num_speculative_tokens": 4, "max_ngram_size": 4, "min_ngram_size": 2}',
    )
    parser.add_argument("--new-tokens", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = json.loads(args.speculative_config)
    plain = LLM(max_model_len=2048, max_num_seqs=4)
    spec = LLM(max_model_len=2048, max_num_seqs=4, speculative_config=config)
    for llm in (plain, spec):  # warm up (first-call costs)
        llm.chat(WORKLOADS["open-ended"][0], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    print(f"speculative_config: {json.dumps(config)}; {args.new_tokens} new tokens, best of {args.repeats}")
    print(
        f"{'workload':<12} {'prompt':>6} {'tokens':>6} {'plain tok/s':>12} {'spec tok/s':>11} {'ratio':>6} "
        f"{'accepted':>9} {'per step':>9}"
    )
    for name, conversations in WORKLOADS.items():
        plain_total = spec_total = 0.0
        tokens_total = 0
        for index, messages in enumerate(conversations):
            best_plain = best_spec = float("inf")
            for _ in range(args.repeats):
                seconds, plain_tokens, _, prompt_len = timed_chat(plain, messages, args.new_tokens)
                best_plain = min(best_plain, seconds)
                seconds, spec_tokens, metrics, _ = timed_chat(spec, messages, args.new_tokens)
                best_spec = min(best_spec, seconds)
                if spec_tokens != plain_tokens:
                    raise SystemExit(
                        f"{name}[{index}]: speculative greedy output differs from plain decoding"
                    )
            count = len(plain_tokens)
            rate = metrics.spec_acceptance_rate
            per_step = metrics.spec_accepted_tokens_per_step
            print(
                f"{name + f'[{index}]':<12} {prompt_len:>6} {count:>6} {count / best_plain:>12.1f} {count / best_spec:>11.1f} "
                f"{best_plain / best_spec:>5.2f}x {'-' if rate is None else f'{rate:.2f}':>9} "
                f"{'-' if per_step is None else f'{per_step:.2f}':>9}"
            )
            plain_total += best_plain
            spec_total += best_spec
            tokens_total += count
        print(
            f"{name:<12} {'all':>6} {tokens_total:>6} {tokens_total / plain_total:>12.1f} "
            f"{tokens_total / spec_total:>11.1f} {plain_total / spec_total:>5.2f}x"
        )


if __name__ == "__main__":
    main()
