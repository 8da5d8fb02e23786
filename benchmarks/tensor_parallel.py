"""Tensor parallelism on this machine: TP=1 in one process against TP=2 in two rank processes.

The model is a random-weight checkpoint of SmolLM2-135M's size and shape whose heads divide by
2 (hidden 576, 30 layers, 8 query heads of 72 dims, 4 KV heads, MLP 1536, vocabulary 49152, tied
embeddings; float32 safetensors, 0.54 GB), written to a temporary directory with SmolLM2's
tokenizer. Greedy decoding with EOS ignored, so both runs generate the same tokens:

  * start-up, cold: a fresh interpreter per build, as a script that builds one LLM is: the
    seconds from the interpreter's start to a built LLM(...) (imports included) and those of
    LLM(...) alone, and the CPU seconds of all its processes (the engine, the ranks and their
    fork server; unlike the seconds, they do not grow when others share the cores); the median
    of --startup-repeats runs, TP=1 and TP=N alternating (also for the embedded SmolLM2, TP=1
    against TP=3: its 9 heads do not divide by 2)
  * start-up floor: a fresh interpreter importing what a rank runs (`worker.preload`, paddle
    included), which a cold TP=N build waits for before its fork server forks the first rank
  * start-up, warm: LLM(...) built again in the same process, whose fork server (started by
    the first TP=N build and shared by the engines of a process) has imported paddle already,
    as for the replicas of `fastdeploy serve --data-parallel-size` or a notebook's next LLM
  * decode:   one stream, --new-tokens tokens (tokens/s after the first)
  * batch:    --batch prompts x --new-tokens tokens (output tokens/s over the whole call)

TP=1 runs one process with --threads threads (default 2); TP=2 runs two rank processes of
--threads / 2 threads each, plus the engine process that schedules and samples. The ratio
TP=2 / TP=1 is printed for each figure, and the bytes each rank all-reduces per generated token
(two row-parallel sums of `hidden` float32 values per layer, plus the embedding's) and receives
in the logits all-gather.

    python benchmarks/tensor_parallel.py [--threads 2] [--batch 8] [--new-tokens 64]
        [--startup-repeats 3] [--skip-speed] [--skip-embedded]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from fastdeploy import LLM, SamplingParams
from fastdeploy.executor.forkserver import shared_servers
from fastdeploy.model_resolver import embedded_model_path

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 72,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-05,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def write_checkpoint(directory: str) -> None:
    """Random float32 weights in SmolLM2's tensor names, its tokenizer, and CONFIG."""
    from safetensors.numpy import save_file

    from fastdeploy.model_executor.gguf_export import write_hf_metadata

    rng = np.random.default_rng(0)
    hidden, inner, head_dim = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["head_dim"]
    q, kv = CONFIG["num_attention_heads"] * head_dim, CONFIG["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (CONFIG["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (q, hidden),
                p + "self_attn.k_proj.weight": (kv, hidden),
                p + "self_attn.v_proj.weight": (kv, hidden),
                p + "self_attn.o_proj.weight": (hidden, q),
                p + "mlp.gate_proj.weight": (inner, hidden),
                p + "mlp.up_proj.weight": (inner, hidden),
                p + "mlp.down_proj.weight": (hidden, inner),
            }
        )
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, np.float32)
        else:
            tensors[name] = (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(
                np.float32
            )
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    write_hf_metadata(directory, embedded_model_path())
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(CONFIG, handle)


def allreduce_bytes_per_token() -> tuple[int, int]:
    """(bytes each rank all-reduces, bytes it receives in the logits all-gather) per generated token."""
    hidden, layers, vocab = CONFIG["hidden_size"], CONFIG["num_hidden_layers"], CONFIG["vocab_size"]
    reduced = (2 * layers + 1) * hidden * 4  # o_proj and down_proj per layer, and the embedding
    gathered = vocab // 2 * 4  # the other rank's half of the logits
    return reduced, gathered


def build(model: str | None, tp: int, threads: int, batch: int) -> LLM:
    return LLM(
        model=model, tensor_parallel_size=tp, cpu_threads=threads, max_model_len=512, max_num_seqs=batch
    )


def children_cpu_seconds() -> float:
    """CPU seconds of the ended child processes (and theirs) so far, and of the running fork
    servers with the ranks they have reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    servers = 0.0
    for server in shared_servers():
        with open(f"/proc/{server.child.pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        servers += sum(int(ticks) for ticks in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return usage.ru_utime + usage.ru_stime + servers


def measure_startup(
    model: str | None, tps: tuple[int, int], threads: int, batch: int, repeats: int
) -> list[dict]:
    """Median warm start-up seconds and CPU seconds of each of `tps`, built alternately `repeats`
    times after one build each (which starts the fork server)."""
    runs: dict[int, list[tuple[float, float]]] = {tp: [] for tp in tps}
    for repeat in range(repeats + 1):
        for tp in tps:
            children, cpu, start = children_cpu_seconds(), time.process_time(), time.perf_counter()
            llm = build(model, tp, max(1, threads // tp), batch)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            llm.shutdown()  # its processes end, so their CPU seconds are counted
            if repeat:
                runs[tp].append((seconds, cpu + children_cpu_seconds() - children))
    return [
        {
            "warm_startup_s": statistics.median(s for s, _ in runs[tp]),
            "warm_startup_cpu_s": statistics.median(c for _, c in runs[tp]),
        }
        for tp in tps
    ]


COLD = """
import sys, time
started = time.perf_counter()
from fastdeploy import LLM
before = time.perf_counter()
LLM(model=sys.argv[1] or None, tensor_parallel_size=int(sys.argv[2]), cpu_threads=int(sys.argv[3]),
    max_model_len=512, max_num_seqs=int(sys.argv[4]))
done = time.perf_counter()
print(done - started + float(sys.argv[5]), done - before)
"""


def measure_cold(
    model: str | None, tps: tuple[int, int], threads: int, batch: int, repeats: int
) -> list[dict]:
    """Median cold start-up figures of each of `tps`: a fresh interpreter per build, alternating."""
    # an interpreter's start before its first line runs, taken from a bare one
    begin = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    interpreter = time.perf_counter() - begin
    runs: dict[int, list[tuple[float, float, float]]] = {tp: [] for tp in tps}
    for _ in range(repeats):
        for tp in tps:
            children = children_cpu_seconds()
            args = [model or "", str(tp), str(max(1, threads // tp)), str(batch), str(interpreter)]
            done = subprocess.run(
                [sys.executable, "-c", COLD, *args], check=True, capture_output=True, text=True
            )
            total, llm = (float(x) for x in done.stdout.split()[-2:])
            runs[tp].append((total, llm, children_cpu_seconds() - children))
    return [
        {
            "cold_process_s": statistics.median(r[0] for r in runs[tp]),
            "cold_llm_s": statistics.median(r[1] for r in runs[tp]),
            "cold_cpu_s": statistics.median(r[2] for r in runs[tp]),
        }
        for tp in tps
    ]


RANK_IMPORTS = """
import sys, time
started = time.perf_counter()
from fastdeploy.executor import worker
worker.preload("cpu", True, sys.argv[1] or None)
print(time.perf_counter() - started + float(sys.argv[2]))
"""


def measure_rank_imports(model: str | None, repeats: int) -> float:
    """Median seconds of a fresh interpreter that imports what a rank runs (paddle included) and,
    given `model`, reads its configuration: the fork server's work before it can fork a rank, so
    no cold TP=N build can be ready sooner than this after its engine process starts it."""
    begin = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    interpreter = time.perf_counter() - begin
    runs = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", RANK_IMPORTS, model or "", str(interpreter)],
            check=True,
            capture_output=True,
            text=True,
        )
        runs.append(float(done.stdout.split()[-1]))
    return statistics.median(runs)


def startup(model: str | None, tps: tuple[int, int], args: argparse.Namespace) -> list[dict]:
    cold = measure_cold(model, tps, args.threads, args.batch, args.startup_repeats)
    warm = measure_startup(model, tps, args.threads, args.batch, args.startup_repeats)
    return [{**c, **w} for c, w in zip(cold, warm, strict=True)]


def measure_speed(model: str, tp: int, threads: int, batch: int, new_tokens: int) -> dict[str, float]:
    llm = build(model, tp, threads, batch)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(100, 132))}
    llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False
    )  # warm-up
    output = llm.generate(prompt, params, use_tqdm=False)[0]
    metrics = output.metrics
    figures = {"decode_tok_s": (new_tokens - 1) / (metrics.model_execute_time - metrics.first_token_time)}
    prompts = [{"prompt_token_ids": list(range(100 + i, 132 + i))} for i in range(batch)]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    figures["batch_tok_s"] = sum(len(o.outputs.token_ids) for o in outputs) / (time.perf_counter() - start)
    llm.shutdown()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2, help="threads of TP=1 (TP=2 ranks get half each)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--startup-repeats", type=int, default=3, help="builds per start-up figure (median)")
    parser.add_argument("--skip-speed", action="store_true", help="start-up figures only")
    parser.add_argument(
        "--skip-embedded", action="store_true", help="skip the embedded model's start-up figures"
    )
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fastdeploy-tp-bench-") as directory:
        write_checkpoint(directory)
        one, two = startup(directory, (1, 2), args)
        if not args.skip_speed:
            one.update(measure_speed(directory, 1, args.threads, args.batch, args.new_tokens))
            two.update(measure_speed(directory, 2, max(1, args.threads // 2), args.batch, args.new_tokens))
        rows.append(("random SmolLM2-size, TP=2 / TP=1", one, two))
    if not args.skip_embedded:
        one, three = startup(None, (1, 3), args)
        rows.append(("embedded SmolLM2, TP=3 / TP=1", one, three))
    print(f"{'figure':<40}{'TP=1':>12}{'TP=N':>12}{'ratio':>9}")
    for label, base, other in rows:
        print(label)
        for key in base:
            print(f"  {key:<38}{base[key]:>12.2f}{other[key]:>12.2f}{other[key] / base[key]:>9.2f}")
    reduced, gathered = allreduce_bytes_per_token()
    print(
        f"a fresh interpreter importing a rank's code (paddle included), the fork server's work "
        f"before its first rank: {measure_rank_imports(None, args.startup_repeats):.2f} s "
        "(no cold TP=N start-up can be shorter than the engine's own imports plus this)"
    )
    print(
        f"per generated token, each TP=2 rank all-reduces {reduced} bytes and gathers {gathered} bytes of logits"
    )


if __name__ == "__main__":
    main()
