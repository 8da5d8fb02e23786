"""Host work of one engine step, per component, with the forward pass taken out.

On a GPU a decode step of a small model is a few milliseconds of device work, so the Python
around it (scheduling, building the batch layout, sampling, detokenizing, stop checks) decides
the throughput. This script runs the real `LLM.generate` loop on the embedded SmolLM2 model with
the cpu backend, but replaces the model runner by a stand-in that builds the real batch layout
and then, instead of a forward pass, hands back the next token of a fixed text for every sampling
sequence (and the backend's device argmax by the identity). What is left is exactly the engine's
host work per step, which it prints in ms per decode step, split by component:

  * schedule: `Scheduler.schedule` (block allocation, preemption checks)
  * layout:   `build_layout` (token ids, positions, slot mapping, block tables)
  * sample:   `LLMEngine._sample` + `_bans` (greedy: the argmax is the stand-in's identity)
  * outputs:  the rest of the step (appending tokens, detokenizing, stop checks, outputs)

Modes: plain `generate` (text read only at the end), `--stop` (a stop string that never matches:
text must be produced token by token), `--stream` (every step returns every request's output, as
the server's requests do).

    python benchmarks/engine_overhead.py [--batches 16 64 256] [--new-tokens 128] [--stop] [--stream]

Runs on CPU (no GPU needed); figures are for comparing revisions on one machine.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

#: mixed text (ASCII, accents, CJK, emoji) so the detokenizer meets multi-token characters too
TEXT = (
    "The history of printing begins with woodblocks and movable type, spreads through Europe with "
    "Gutenberg's press, and reshapes science, religion and politics as books become cheap. "
    "Les caractères mobiles ont changé l'Europe. 活字印刷术是中国古代的重要发明。 🙂📚 "
    "In 1450 a printer could set a page by hand; by 1900 machines cast whole lines of type at once. "
)


class _Timers:
    """Seconds spent per component, over the steps that were decode-only."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.total: dict[str, float] = defaultdict(float)
        self.decode_steps = 0

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.current[name] += time.perf_counter() - start

        return timed

    def end_step(self, decode_only: bool) -> None:
        if decode_only:
            self.decode_steps += 1
            for name, seconds in self.current.items():
                self.total[name] += seconds
        self.current.clear()


class _HostOnlyRunner:
    """Builds the real layout, then returns the next token of `stream` per sampling sequence."""

    def __init__(self, block_size: int, stream: list[int], timers: _Timers) -> None:
        from fastdeploy.model_executor import model_runner

        self.block_size = block_size
        self.stream = np.asarray(stream, dtype=np.int64)
        self.build_layout = timers.wrap("layout", model_runner.build_layout)
        self.timers = timers
        self.last_decode_only = False

    def execute(self, batch: Any) -> tuple[np.ndarray, list[int], float]:
        self.last_decode_only = all(count == 1 for count in batch.num_new_tokens)
        layout, sampling = self.build_layout(batch, self.block_size)
        seqs = [batch.seqs[i] for i in sampling]
        offsets = np.array([seq.seq_id * 7 + seq.num_tokens for seq in seqs], dtype=np.int64)
        return self.stream[offsets % self.stream.size], sampling, 0.0


class _IdentityArgmax:
    """The engine's backend, except that the "logits" already are the chosen tokens."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def argmax_rows(self, logits: np.ndarray) -> np.ndarray:
        return logits

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def measure(llm: Any, batch: int, args: argparse.Namespace, stream_ids: list[int]) -> dict[str, float]:
    """ms per decode step for each component, running `batch` prompts through the engine."""
    from fastdeploy import SamplingParams

    engine = llm.llm_engine
    timers = _Timers()
    runner = _HostOnlyRunner(engine.runner.block_size, stream_ids, timers)
    saved = engine.runner, engine.backend, engine.scheduler.schedule, engine._sample, engine._bans
    engine.runner, engine.backend = runner, _IdentityArgmax(engine.backend)
    engine.scheduler.schedule = timers.wrap("schedule", engine.scheduler.schedule)
    engine._sample = timers.wrap("sample", engine._sample)
    engine._bans = timers.wrap("sample", engine._bans)
    step = engine.step

    def timed_step() -> list[Any]:
        start = time.perf_counter()
        outputs = step()
        timers.current["step"] += time.perf_counter() - start
        timers.end_step(runner.last_decode_only)
        return outputs

    engine.step = timed_step
    stop = ["\x00never"] if args.stop else []
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True, stop=stop)
    prompts = [stream_ids[i : i + args.prompt_len] for i in range(batch)]
    try:
        if args.stream:
            for index, prompt in enumerate(prompts):
                engine.add_request(f"bench-{batch}-{index}", prompt, params, stream=True)
            while engine.has_unfinished_requests():
                engine.step()
        else:
            llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        engine.runner, engine.backend = saved[0], saved[1]
        del engine.scheduler.schedule, engine._sample, engine._bans, engine.step
    steps = max(timers.decode_steps, 1)
    figures = {name: 1000 * seconds / steps for name, seconds in timers.total.items()}
    figures["outputs"] = figures["step"] - sum(figures.get(k, 0.0) for k in ("schedule", "layout", "sample"))
    figures["decode_steps"] = timers.decode_steps
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="report the best of this many runs")
    parser.add_argument("--stop", action="store_true", help="a stop string (never matched) per request")
    parser.add_argument("--stream", action="store_true", help="every step returns every request's output")
    args = parser.parse_args()

    from fastdeploy import LLM

    largest = max(args.batches)
    blocks_per_seq = -(-(args.prompt_len + args.new_tokens) // 64)
    llm = LLM(
        max_model_len=args.prompt_len + args.new_tokens + 64,
        max_num_seqs=largest,
        max_num_batched_tokens=max(2048, largest * args.prompt_len),
        num_gpu_blocks_override=largest * blocks_per_seq + 8,
    )
    stream_ids = llm.get_tokenizer().encode(TEXT * 8, add_special_tokens=False)
    mode = "stream" if args.stream else "stop strings" if args.stop else "generate"
    print(f"engine host work per decode step (ms), mode: {mode}, best of {args.repeats}")
    print(f"{'seqs':>6} {'schedule':>9} {'layout':>8} {'sample':>8} {'outputs':>8} {'total':>8}  steps")
    for batch in args.batches:
        runs = [measure(llm, batch, args, stream_ids) for _ in range(args.repeats)]
        best = min(runs, key=lambda figures: figures["step"])
        print(
            f"{batch:>6} {best.get('schedule', 0):>9.3f} {best.get('layout', 0):>8.3f} "
            f"{best.get('sample', 0):>8.3f} {best['outputs']:>8.3f} {best['step']:>8.3f}  "
            f"{best['decode_steps']}"
        )


if __name__ == "__main__":
    main()
