"""fastdeploy against llama.cpp and transformers on the embedded SmolLM2 model (or `--model PATH`,
any GGUF), interleaved in one run.

Workloads (greedy, end-of-sequence ignored, so every engine generates the same number of tokens):
  * prefill: one 512-token prompt and one new token (prompt tok/s)
  * decode:  one stream, 128 new tokens (tok/s after the first token)
  * batch:   16 prompts x 128 new tokens (output tok/s over the whole call; llama-cpp-python's
             `Llama` has no batched generation, so llama.cpp runs the prompts one after another)
Each engine runs in its own process (bench_worker.py), loaded once; the runs are interleaved
(repeat -> workload -> engine), so all engines see the same minutes of machine load, and the table
gives the median and min/max of `--repeats` runs and the ratio of medians against each peer.

Then, unless skipped:
  * contention: one CPU hog process beside the engines, decode and batch, for fastdeploy's default
    and for FD_CPU_THREADS=1 and =2 (the default must reach 0.9x the better of the two), and the peers;
  * start-up: `python -c "from fastdeploy import LLM; LLM().generate('hi')"` (one new token) from
    process start to the first token, and the same for the peers.

Peers run in the interpreters given (they need not have fastdeploy); a peer whose package does not
import there is skipped with the reason:
  --llama-cpp-python PY      an interpreter with llama-cpp-python (e.g. 0.3.36, built from source)
  --transformers-python PY   an interpreter with torch==2.13.0 transformers gguf accelerate
`--background-load N` runs everything beside N CPU hogs of its own (killed at the end, and each
stops by itself after `--hog-seconds`). `--variant LABEL:KEY=VALUE,...` adds a fastdeploy row with
those `LLM(...)` arguments; the key `checkpoint=gguf|safetensors` picks that row's weights and
keys starting with FD_ are environment variables of that row's process, e.g.
`--variant wint4:checkpoint=safetensors,quantization=wint4` runs the float32 directory quantised
at load beside the default row on the GGUF, `--variant int8:FD_CPU_ACTIVATIONS=int8` the int8
activations.

    python benchmarks/throughput.py [--model PATH] [--peers llama.cpp,transformers] [--repeats 3]
        [--checkpoint gguf|safetensors] [--background-load N] [--skip-contention] [--skip-startup]

`--exclusive` runs the whole comparison in a session of its own at the highest CPU priority (needs
root or CAP_SYS_NICE). Linux groups processes by session (autogroup scheduling, on by default) and
shares the CPUs equally between the busy groups whatever their nice values: on a shared 2-core
machine one other session's busy test leaves a two-thread engine about one core. Measured on the
ERNIE-shaped Q5_K_M, load average 2-4 from other sessions: a two-thread int8 prefill used 0.5-1.0
CPUs of its wall time without it (nice -20 alone changed nothing) and 1.9 with it.

`--device cuda` runs the GPU comparison instead (benchmarks/throughput_cuda.py; its peer is
transformers, skipped when `--peers` leaves it out).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_worker.py")
PROMPT_TEXT = (
    "The history of printing begins with woodblocks and movable type, spreads through Europe with "
    "Gutenberg's press, and reshapes science, religion and politics as books become cheap."
)
GOALS = {  # fastdeploy / llama.cpp on a 2-core AVX2 machine (issue 12)
    "prefill": 2.0,
    "decode": 1.3,
    "batch": 3.0,
}
CONTENTION_GOAL = 0.9
STARTUP_GOAL_SECONDS = 1.5

STARTUP_SNIPPETS = {
    "fastdeploy": (
        "import os\nfrom fastdeploy import LLM, SamplingParams\n"
        "LLM(model=os.environ['BENCH_MODEL']).generate('hi', SamplingParams(max_tokens=1), use_tqdm=False)\n"
    ),
    "llama.cpp": (
        "import os\nfrom llama_cpp import Llama\n"
        "Llama(model_path=os.environ['BENCH_MODEL'], verbose=False)('hi', max_tokens=1)\n"
    ),
    "transformers": (
        "import os\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "folder, name = os.path.split(os.environ['BENCH_MODEL'])\n"
        "tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)\n"
        "model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)\n"
        "model.generate(**tok('hi', return_tensors='pt'), max_new_tokens=1)\n"
    ),
}
PEER_MODULES = {"llama.cpp": "llama_cpp", "transformers": "transformers"}
#: workers log warnings only, unless the caller's environment says otherwise
QUIET_WORKERS = {"FD_LOG_LEVEL": "WARNING", "TRANSFORMERS_VERBOSITY": "error"}


@dataclass
class Engine:
    """One row: an engine in a worker process, with its interpreter, threads and options."""

    label: str
    kind: str
    python: str
    threads: int | None = None
    #: "gguf" or "safetensors" (None: --checkpoint); llama.cpp always reads the GGUF
    checkpoint: str | None = None
    options: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    process: subprocess.Popen | None = None
    #: workload -> the thread count the default settled on after each run (adaptive rows only)
    adapted: dict = field(default_factory=dict)

    def start(self, models: dict[str, str], default: str) -> None:
        checkpoint = "gguf" if self.kind == "llama.cpp" else self.checkpoint or default
        command = [self.python, WORKER, self.kind, "--model", models[checkpoint]]
        if self.threads:
            command += ["--threads", str(self.threads)]
        command += [f"--option={key}={json.dumps(value)}" for key, value in self.options.items()]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**QUIET_WORKERS, **os.environ, **self.env},
        )
        self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.label}: worker exited (code {self.process.wait()})")
        return json.loads(line)

    def run(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._read()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait(timeout=60)
            self.process = None


class Hogs:
    """N processes that each keep one CPU busy, for at most `seconds` even if nobody stops them."""

    def __init__(self, count: int, seconds: float) -> None:
        code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
        self.processes = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        self.processes = []


def make_prompts(tokenizer, count: int, length: int, first: int = 0) -> list[list[int]]:
    """`count` distinct prompts of exactly `length` token ids (documents `first`, `first + 1`, ...:
    they differ from the third token on, so no two share a KV block)."""
    prompts = []
    words = PROMPT_TEXT.split()
    for i in range(first, first + count):
        text = f"Document {i}: " + " ".join((words[i % len(words) :] + words) * (1 + length // len(words)))
        prompts.append(tokenizer.encode(text, add_special_tokens=False)[:length])
    return prompts


def requests(args: argparse.Namespace, tokenizer, repeat: int) -> dict[str, dict]:
    """The workloads of one repeat: prompts new to every engine (prefix caching is on by default,
    and a repeated prompt would be served from the cache)."""
    first = 1000 * (repeat + 1)
    batch = make_prompts(tokenizer, args.batch, args.prompt_len, first)
    return {
        "prefill": {"op": "prefill", "prompt": make_prompts(tokenizer, 1, 512, first + args.batch)[0]},
        "decode": {
            "op": "decode",
            "prompt": make_prompts(tokenizer, 1, args.prompt_len, first + 999)[0],
            "tokens": args.new_tokens,
        },
        "batch": {"op": "batch", "prompts": batch, "tokens": args.new_tokens},
    }


def rate(workload: str, request: dict, result: dict) -> float:
    """Tokens per second of one run."""
    if workload == "prefill":
        return len(request["prompt"]) / result["seconds"]
    return result["tokens"] / result["seconds"]


def peer_reason(python: str, kind: str) -> str | None:
    """Why a peer cannot run with this interpreter (None: it can)."""
    probe = subprocess.run(
        [python, "-c", f"import {PEER_MODULES[kind]}"], capture_output=True, text=True, check=False
    )
    if probe.returncode == 0:
        return None
    lines = probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"]
    return f"`import {PEER_MODULES[kind]}` failed with {python}: {lines[-1]}"


def measure(engines: list[Engine], work, workloads: list[str], repeats: int, offset: int = 0) -> dict:
    """{workload: {label: [tok/s per repeat]}}, interleaved repeat -> workload -> engine; `work(r)`
    gives repeat r's requests."""
    rates: dict[str, dict[str, list[float]]] = {w: {e.label: [] for e in engines} for w in workloads}
    for repeat in range(repeats):
        requests_now = work(offset + repeat)
        for workload in workloads:
            for engine in engines:
                result = engine.run(requests_now[workload])
                rates[workload][engine.label].append(rate(workload, requests_now[workload], result))
                if "adapted_threads" in result:
                    engine.adapted.setdefault(workload, []).append(result["adapted_threads"])
        print(f"  repeat {repeat + 1}/{repeats} done", file=sys.stderr, flush=True)
    return rates


def startup_seconds(python: str, kind: str, model: str) -> float:
    """Seconds from starting the interpreter to the first generated token."""
    code = STARTUP_SNIPPETS[kind] + "import time\nprint(time.time())\n"
    start = time.time()
    done = subprocess.run(
        [python, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "BENCH_MODEL": model},
        cwd=tempfile.gettempdir(),
    )
    return float(done.stdout.strip().splitlines()[-1]) - start


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):9.1f} ({min(values):7.1f}-{max(values):7.1f})"


LABELS = {
    "prefill": "512-token prefill (prompt tok/s)",
    "decode": "single stream, {n} new tokens (tok/s)",
    "batch": "{b} prompts x {n} new tokens (output tok/s)",
}


def print_table(title: str, rates: dict, peers: list[str], args: argparse.Namespace) -> None:
    print(f"\n{title}: median (min-max) of {args.repeats} runs, ratio = fastdeploy median / peer median")
    for workload, by_engine in rates.items():
        print(f"\n  {LABELS[workload].format(n=args.new_tokens, b=args.batch)}")
        for label, values in by_engine.items():
            ratios = "".join(
                f"   {statistics.median(values) / statistics.median(by_engine[peer]):5.2f}x {peer}"
                for peer in peers
                if peer in by_engine and peer != label and label not in peers
            )
            print(f"    {label:<28} {summary(values)}{ratios}")


def print_adapted(engines: list[Engine]) -> None:
    """The thread count each adaptive row (fastdeploy's default) settled on after each run, then forgets them."""
    for engine in engines:
        if engine.adapted:
            runs = "; ".join(f"{w} {' '.join(map(str, counts))}" for w, counts in engine.adapted.items())
            print(f"    {engine.label}: thread count after each run (FD_CPU_ADAPTIVE_THREADS): {runs}")
            engine.adapted.clear()


def print_goals(rates: dict, contention: dict | None, startup: dict | None) -> None:
    print("\nGoals (issue 12, on a 2-core AVX2 machine):")
    for workload, goal in GOALS.items():
        if "llama.cpp" in rates.get(workload, {}):
            ours = statistics.median(rates[workload]["fastdeploy"])
            ratio = ours / statistics.median(rates[workload]["llama.cpp"])
            verdict = "met" if ratio >= goal else "NOT met"
            print(f"  {workload:<8} fastdeploy / llama.cpp = {ratio:5.2f}x (goal >= {goal}x): {verdict}")
    for workload, by_engine in (contention or {}).items():
        best = max(statistics.median(by_engine[k]) for k in ("FD_CPU_THREADS=1", "FD_CPU_THREADS=2"))
        ratio = statistics.median(by_engine["fastdeploy"]) / best
        verdict = "met" if ratio >= CONTENTION_GOAL else "NOT met"
        print(
            f"  1 hog, {workload:<6} default / best of 1 and 2 threads = {ratio:4.2f}x "
            f"(goal >= {CONTENTION_GOAL}x): {verdict}"
        )
    if startup and "fastdeploy" in startup:
        seconds = statistics.median(startup["fastdeploy"])
        verdict = "met" if seconds <= STARTUP_GOAL_SECONDS else "NOT met"
        print(f"  start-up to the first token {seconds:.2f} s (goal <= {STARTUP_GOAL_SECONDS} s): {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        metavar="PATH",
        help="any GGUF file (e.g. from benchmarks/make_gguf_quants.py) instead of the embedded SmolLM2",
    )
    parser.add_argument("--peers", default="llama.cpp,transformers", help="comma list, or '' for none")
    parser.add_argument("--llama-cpp-python", default=sys.executable, metavar="PY")
    parser.add_argument("--transformers-python", default=sys.executable, metavar="PY")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", default="prefill,decode,batch")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument(
        "--checkpoint",
        choices=("gguf", "safetensors"),
        default="gguf",
        help="fastdeploy and transformers load the embedded GGUF, or a float32 Hugging Face "
        "directory written from it (llama.cpp always reads the GGUF)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: random-weight SmolLM2- and Llama-1B-shaped models on the GPU (benchmarks/throughput_cuda.py)",
    )
    parser.add_argument("--shapes", default="smollm2,1b", help="--device cuda: model shapes to run")
    parser.add_argument(
        "--stepwise",
        action="store_true",
        help="--device cuda: also run the engine with async_scheduling=False (a column of its own)",
    )
    parser.add_argument(
        "--quantizations",
        default="",
        help="--device cuda: comma list of quantization= values, a column each (e.g. wint8,wint4,fp8)",
    )
    parser.add_argument(
        "--variant", action="append", default=[], help="LABEL:KEY=VALUE,... an extra fastdeploy row"
    )
    parser.add_argument(
        "--background-load", type=int, default=0, metavar="N", help="CPU hogs for the whole run"
    )
    parser.add_argument("--hog-seconds", type=float, default=3600, help="each hog stops by itself after this")
    parser.add_argument("--skip-contention", action="store_true")
    parser.add_argument("--skip-startup", action="store_true")
    parser.add_argument(
        "--exclusive",
        action="store_true",
        help="run in a session of its own at CPU priority -20 (root): other sessions' load cannot "
        "take a share of the cores",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="also write every figure to this file (with --device cuda too)"
    )
    args = parser.parse_args()
    if args.exclusive:
        exclusive_session()
    if args.device == "cuda":
        import throughput_cuda

        args.skip_peer = "transformers" not in args.peers.split(",")
        throughput_cuda.main(args)
        return
    os.environ.setdefault("FD_LOG_LEVEL", "WARNING")  # this process's and the workers' logs

    from fastdeploy.input.gguf_tokenizer import GGUFTokenizerLoader
    from fastdeploy.model_resolver import embedded_model_path

    gguf = args.model or embedded_model_path()
    variants = [parse_variant(text) for text in args.variant]
    with tempfile.TemporaryDirectory(prefix="smollm2-float32-") as directory:
        models = {"gguf": gguf, "safetensors": directory}
        if "safetensors" in {args.checkpoint, *(v.checkpoint for v in variants)}:
            from fastdeploy.model_executor.gguf_export import export_hf_directory

            export_hf_directory(gguf, directory)
        run(args, models, variants, GGUFTokenizerLoader().load(gguf))


def exclusive_session() -> None:
    """Continues in a child process that leads a new session (so a new autogroup) at priority -20;
    the parent waits for it and exits with its status (Ctrl-C is passed on: the child is no longer
    in the terminal's process group)."""
    child = os.fork()
    if child:
        while True:
            try:
                _, status = os.waitpid(child, 0)
                sys.exit(os.waitstatus_to_exitcode(status))
            except KeyboardInterrupt:
                os.kill(child, signal.SIGINT)
    os.setsid()
    try:
        if os.path.exists("/proc/self/autogroup"):
            with open("/proc/self/autogroup", "w", encoding="ascii") as handle:
                handle.write("-20")
        else:  # no autogroups: nice values compare across sessions
            os.setpriority(os.PRIO_PROCESS, 0, -20)
    except PermissionError:
        sys.exit("--exclusive raises the run's CPU priority, which needs root or CAP_SYS_NICE")


def peer_engines(args: argparse.Namespace) -> list[Engine]:
    pythons = {"llama.cpp": args.llama_cpp_python, "transformers": args.transformers_python}
    peers = []
    for kind in filter(None, args.peers.split(",")):
        if kind not in pythons:
            sys.exit(f"--peers: unknown peer {kind!r} (known: {', '.join(pythons)})")
        reason = peer_reason(pythons[kind], kind)
        if reason:
            print(f"{kind} skipped: {reason}")
        else:
            peers.append(Engine(kind, kind, pythons[kind]))
    return peers


def variant_settings(text: str) -> tuple[str, str | None, dict[str, Any]]:
    """`LABEL:KEY=VALUE,...` -> (label, checkpoint or None, the other settings; JSON values decoded)."""
    label, _, settings = text.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return label, options.pop("checkpoint", None), options


def parse_variant(text: str) -> Engine:
    label, checkpoint, options = variant_settings(text)
    if checkpoint not in (None, "gguf", "safetensors"):
        sys.exit(f"--variant {text!r}: checkpoint must be gguf or safetensors")
    env = {key: str(options.pop(key)) for key in list(options) if key.startswith("FD_")}
    return Engine(
        f"fastdeploy {label}", "fastdeploy", sys.executable, checkpoint=checkpoint, options=options, env=env
    )


def run(args: argparse.Namespace, models: dict[str, str], variants: list[Engine], tokenizer) -> None:
    peers = peer_engines(args)
    ours = [Engine("fastdeploy", "fastdeploy", sys.executable), *variants]

    def work(repeat: int) -> dict[str, dict]:
        return requests(args, tokenizer, repeat)

    workloads = [w for w in args.workloads.split(",") if w]
    hogs = Hogs(args.background_load, args.hog_seconds) if args.background_load else None
    results: dict = {"background_load": args.background_load}
    engines = ours + peers
    try:
        for engine in engines:
            engine.start(models, args.checkpoint)
        for engine in engines:  # warm-up
            engine.run({"op": "batch", "prompts": make_prompts(tokenizer, 2, args.prompt_len), "tokens": 4})
        load = f", beside {args.background_load} CPU hogs" if args.background_load else ""
        results["rates"] = measure(engines, work, workloads, args.repeats)
        print_table(
            f"Throughput ({os.cpu_count()} CPUs{load})", results["rates"], [p.label for p in peers], args
        )
        print_adapted(engines)
        if not args.skip_contention:
            results["contention"] = contention(args, engines, peers, work, workloads, models)
        if not args.skip_startup:
            results["startup"] = startup(args, peers, models["gguf"])
    finally:
        for engine in engines:
            engine.stop()
        if hogs:
            hogs.stop()
    print_goals(results["rates"], results.get("contention"), results.get("startup"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)


def contention(args, engines, peers, work, workloads, models) -> dict:
    """decode and batch beside one extra CPU hog: fastdeploy's default, 1 and 2 threads, the peers."""
    threaded = [Engine(f"FD_CPU_THREADS={n}", "fastdeploy", sys.executable, threads=n) for n in (1, 2)]
    for engine in threaded:
        engine.start(models, args.checkpoint)
    rows = [engines[0], *threaded, *peers]
    hog = Hogs(1, args.hog_seconds)
    try:
        contended = [w for w in ("decode", "batch") if w in workloads]
        rates = measure(rows, work, contended, args.repeats, offset=args.repeats)
    finally:
        hog.stop()
        for engine in threaded:
            engine.stop()
    print_table("With one more CPU hog beside the engine", rates, [p.label for p in peers], args)
    print_adapted(rows)
    return rates


def startup(args, peers, gguf) -> dict:
    """Seconds to the first token of a fresh process, interleaved."""
    kinds = {"fastdeploy": sys.executable, **{p.label: p.python for p in peers}}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.repeats):
        for kind, python in kinds.items():
            times[kind].append(startup_seconds(python, kind, gguf))
    print(
        f"\nStart-up: process start to the first token of {os.path.basename(gguf)}, seconds, median (min-max) of {args.repeats}"
    )
    for kind, values in times.items():
        print(f"    {kind:<28} {statistics.median(values):9.2f} ({min(values):5.2f}-{max(values):5.2f})")
    return times


if __name__ == "__main__":
    main()
