"""One engine of benchmarks/throughput.py, in its own process (and its own interpreter: llama.cpp and
transformers live in other virtual environments than fastdeploy).

The driver starts `python bench_worker.py ENGINE --model PATH [--threads N] [--option KEY=VALUE]`,
the worker loads the model once, prints `{"ready": true}` and then answers one JSON line per
request line on stdin, so the driver can interleave the engines run by run. Requests carry token
ids (made once by the driver), so every engine sees the same prompts:

    {"op": "prefill", "prompt": [ids]}                 -> {"seconds": s}  (prompt + one token)
    {"op": "decode", "prompt": [ids], "tokens": n}      -> {"seconds": s, "tokens": n - 1}
        (the n - 1 tokens after the first, timed from the first token on)
    {"op": "batch", "prompts": [[ids], ...], "tokens": n} -> {"seconds": s, "tokens": generated}

Greedy decoding with end-of-sequence ignored, so every engine generates exactly n tokens. Only the
standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


class FastDeployEngine:
    def __init__(self, model: str, threads: int | None, options: dict[str, str]) -> None:
        from fastdeploy import LLM, SamplingParams

        self.params = SamplingParams
        kwargs = {"max_model_len": 2048, "max_num_seqs": 16, **options}
        if threads:
            kwargs["cpu_threads"] = threads
        self.llm = LLM(model=model, **kwargs)

    def _generate(self, prompts: list[list[int]], tokens: int):
        params = self.params(temperature=0, max_tokens=tokens, ignore_eos=True)
        return self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    def _adapted(self, result: dict) -> dict:
        """With the default thread count, also the count the kernels settled on (thread_adapt.c)."""
        from fastdeploy.backends.cpu import native

        if getattr(self.llm.llm_engine.backend, "adaptive_threads", False):
            result["adapted_threads"] = native._native.adaptive_state()["threads"]
        return result

    def prefill(self, prompt: list[int]) -> dict:
        start = time.perf_counter()
        self._generate([prompt], 1)
        return self._adapted({"seconds": time.perf_counter() - start})

    def decode(self, prompt: list[int], tokens: int) -> dict:
        (output,) = self._generate([prompt], tokens)
        metrics = output.metrics
        return self._adapted(
            {
                "seconds": metrics.model_execute_time - metrics.first_token_time,
                "tokens": len(output.outputs.token_ids) - 1,
            }
        )

    def batch(self, prompts: list[list[int]], tokens: int) -> dict:
        start = time.perf_counter()
        outputs = self._generate(prompts, tokens)
        seconds = time.perf_counter() - start
        return self._adapted({"seconds": seconds, "tokens": sum(len(o.outputs.token_ids) for o in outputs)})


class LlamaCppEngine:
    """llama.cpp through llama-cpp-python's `Llama`: one sequence at a time (the class has no
    batched generation), greedy, threads for both prompt and generation."""

    def __init__(self, model: str, threads: int | None, options: dict[str, str]) -> None:
        from llama_cpp import Llama

        threads = threads or len(os.sched_getaffinity(0))
        self.llm = Llama(
            model_path=model,
            n_ctx=2048,
            n_batch=512,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )

    def _run(self, prompt: list[int], tokens: int) -> tuple[float, float, int]:
        """(seconds to the first token, seconds after it, tokens after it)."""
        llm = self.llm
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        token = llm.sample(temp=0.0, top_k=1)
        first = time.perf_counter()
        for _ in range(tokens - 1):
            llm.eval([token])
            token = llm.sample(temp=0.0, top_k=1)
        return first - start, time.perf_counter() - first, tokens - 1

    def prefill(self, prompt: list[int]) -> dict:
        return {"seconds": self._run(prompt, 1)[0]}

    def decode(self, prompt: list[int], tokens: int) -> dict:
        _, seconds, produced = self._run(prompt, tokens)
        return {"seconds": seconds, "tokens": produced}

    def batch(self, prompts: list[list[int]], tokens: int) -> dict:
        start = time.perf_counter()
        for prompt in prompts:
            self._run(prompt, tokens)
        return {"seconds": time.perf_counter() - start, "tokens": len(prompts) * tokens}


class TransformersEngine:
    """transformers in float32 (a GGUF is dequantised at load), left-padded batches."""

    def __init__(self, model: str, threads: int | None, options: dict[str, str]) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
        self.torch = torch
        if model.endswith(".gguf"):
            folder, name = os.path.split(model)
            self.tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            self.model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        self.model.eval()
        self.pad = self.tokenizer.eos_token_id

    def _generate(self, prompts: list[list[int]], tokens: int, streamer=None) -> float:
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        start = time.perf_counter()
        with torch.inference_mode():
            self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                pad_token_id=self.pad,
                streamer=streamer,
            )
        return time.perf_counter() - start

    def prefill(self, prompt: list[int]) -> dict:
        return {"seconds": self._generate([prompt], 1)}

    def decode(self, prompt: list[int], tokens: int) -> dict:
        class FirstTokenClock:
            """generate() calls put() with the prompt, then once per new token."""

            def __init__(self) -> None:
                self.calls = 0
                self.first_token: float | None = None

            def put(self, value) -> None:
                self.calls += 1
                if self.calls == 2:
                    self.first_token = time.perf_counter()

            def end(self) -> None:
                pass

        clock = FirstTokenClock()
        self._generate([prompt], tokens, clock)
        return {"seconds": time.perf_counter() - clock.first_token, "tokens": tokens - 1}

    def batch(self, prompts: list[list[int]], tokens: int) -> dict:
        return {"seconds": self._generate(prompts, tokens), "tokens": len(prompts) * tokens}


ENGINES = {"fastdeploy": FastDeployEngine, "llama.cpp": LlamaCppEngine, "transformers": TransformersEngine}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("engine", choices=sorted(ENGINES))
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--option", action="append", default=[], help="KEY=JSON engine argument")
    args = parser.parse_args()
    options = {key: json.loads(value) for key, value in (option.split("=", 1) for option in args.option)}
    engine = ENGINES[args.engine](args.model, args.threads, options)
    out = sys.stdout
    sys.stdout = sys.stderr  # engines' prints must not corrupt the protocol
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        out.write(json.dumps(getattr(engine, op)(**request)) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
