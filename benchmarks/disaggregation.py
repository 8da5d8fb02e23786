"""Prefill/decode disaggregation: does a decode instance keep its pace while prompts pour in?

The script starts a prefill instance, a decode instance and a router pairing them, then one
mixed instance, all on loopback with the embedded model. For each layout it streams a greedy
generation (the probe) and measures its time per output token (TPOT: the mean gap between its
tokens) three times: alone; beside clients asking for long generations (decode work, no prefill
load); and under the mix, those clients plus clients sending long prompts with short generations
(the prefill load). Disaggregated, the prompts are computed by the prefill instance and only
their last block by the decode instance; mixed, every prompt is computed in the same passes as
the probe's tokens.

    python benchmarks/disaggregation.py [--prompt-words 600] [--load-clients 2]
        [--generation-clients 1] [--generation-tokens 128] [--probe-tokens 64] [--repeats 2]

The goal is the decode instance's TPOT under the mix within 10% of its TPOT with no prefill load.
That needs the prefill and decode instances on separate cores: with `--pin` (the default where
the machine has 2 or more cores) the prefill instance runs on core 0 and the decode instance on
core 1, and after them the mixed instance on core 1, each with one thread (FD_CPU_THREADS=1). On
a 2-core machine they still share memory bandwidth and caches, and the load clients, the probe
and the router run on whatever core is free; the script prints this and the machine's load
average next to the figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import threading
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from router import HOST, Process, free_port  # noqa: E402  (benchmarks/router.py: server processes)

WORDS = [
    "river",
    "mountain",
    "lantern",
    "copper",
    "orchard",
    "harbor",
    "meadow",
    "violin",
    "compass",
    "thunder",
    "marble",
    "glacier",
    "saffron",
    "pillow",
    "cobalt",
    "whisper",
    "tundra",
    "falcon",
    "ember",
    "quartz",
    "willow",
    "canyon",
    "beacon",
    "velvet",
]


def serve(role: str, core: int | None, extra: list[str]) -> Process:
    port = free_port()
    command = [sys.executable, "-m", "fastdeploy", "serve", "--host", HOST, "--port", str(port)]
    command += ["--max-model-len", "2048", "--max-num-seqs", "8", "--block-size", "16"]
    command += ["--splitwise-role", role, "--uvicorn-log-level", "warning", *extra]
    if core is not None:
        command = ["taskset", "-c", str(core), *command]
    return Process(command, port)


def start_router(prefill: str, decode: str) -> Process:
    port = free_port()
    command = [sys.executable, "-m", "fastdeploy", "router", "--host", HOST, "--port", str(port)]
    command += ["--prefill-workers", prefill, "--decode-workers", decode, "--uvicorn-log-level", "warning"]
    return Process(command, port)


def long_prompt(index: int, words: int) -> str:
    """A prompt no other shares (its first words differ), so no prefix cache shortens it."""
    body = " ".join(WORDS[(index * 7 + i * 5) % len(WORDS)] for i in range(words))
    return f"Request {index}. {body}. Summarise the list above."


def probe_tpot(url: str, tokens: int) -> float:
    """Seconds per output token of one streamed greedy generation (first token excluded)."""
    payload = {
        "prompt": "Write a long story about a lighthouse keeper.",
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    stamps = []
    with httpx.stream("POST", url + "/v1/completions", json=payload, timeout=3600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                stamps.append(time.perf_counter())
    if len(stamps) < 2:
        raise SystemExit(f"the probe streamed {len(stamps)} chunks")
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def probe_median(url: str, args: argparse.Namespace) -> float:
    return statistics.median(probe_tpot(url, args.probe_tokens) for _ in range(args.repeats))


class Load:
    """Clients sending requests until stopped: `prompts` of them long prompts with short
    generations (prefill work), `generations` of them short prompts with long generations
    (decode work beside the probe's)."""

    def __init__(self, url: str, prompts: int, generations: int, args: argparse.Namespace) -> None:
        self.url, self.args = url, args
        self.stop = threading.Event()
        self.started = threading.Event()
        self.done = {"prompts": 0, "generations": 0}
        self.counter = 0
        self.lock = threading.Lock()
        kinds = ["prompts"] * prompts + ["generations"] * generations
        self.threads = [threading.Thread(target=self._client, args=(kind,), daemon=True) for kind in kinds]

    def _payload(self, kind: str, index: int) -> dict:
        if kind == "prompts":
            prompt, tokens = long_prompt(index, self.args.prompt_words), self.args.load_max_tokens
        else:
            prompt, tokens = f"Story {index}: once upon a time", self.args.generation_tokens
        return {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}

    def _client(self, kind: str) -> None:
        with httpx.Client(timeout=3600) as client:
            while not self.stop.is_set():
                with self.lock:
                    self.counter += 1
                    index = self.counter
                self.started.set()
                client.post(self.url + "/v1/completions", json=self._payload(kind, index)).raise_for_status()
                with self.lock:
                    self.done[kind] += 1

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        if self.threads:
            self.started.wait()
            time.sleep(0.5)  # let the first requests reach the engines before the probe starts
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def finished(self) -> str:
        return f"{self.done['prompts']} long prompts and {self.done['generations']} long generations finished"


def measure(name: str, url: str, args: argparse.Namespace) -> dict[str, float]:
    """The probe's TPOT alone, beside long generations only (no prefill load), and under the mix
    of long prompts and long generations."""
    figures = {"alone": probe_median(url, args)}
    with Load(url, 0, args.generation_clients, args):
        figures["no prefill load"] = probe_median(url, args)
    with Load(url, args.load_clients, args.generation_clients, args) as load:
        figures["mix"] = probe_median(url, args)
    print(
        f"{name:>13}: TPOT alone {figures['alone'] * 1e3:7.1f} ms; beside {args.generation_clients} long "
        f"generation(s), no prefill load {figures['no prefill load'] * 1e3:7.1f} ms; under the mix "
        f"{figures['mix'] * 1e3:7.1f} ms ({change(figures['mix'], figures['no prefill load'])} against no "
        f"prefill load, {change(figures['mix'], figures['alone'])} against alone; {load.finished()} "
        f"meanwhile; load average {load_average()})",
        flush=True,
    )
    return figures


def change(value: float, reference: float) -> str:
    return f"{(value / reference - 1) * 100:+.1f}%"


def load_average() -> str:
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--prompt-words", type=int, default=600, help="words per load prompt (~1.3 tokens each)"
    )
    parser.add_argument("--load-clients", type=int, default=2, help="clients sending long prompts at once")
    parser.add_argument("--load-max-tokens", type=int, default=4, help="tokens each long prompt generates")
    parser.add_argument(
        "--generation-clients", type=int, default=1, help="clients asking for long generations at once"
    )
    parser.add_argument("--generation-tokens", type=int, default=128, help="tokens each long generation has")
    parser.add_argument("--probe-tokens", type=int, default=64, help="tokens the probe generates")
    parser.add_argument("--repeats", type=int, default=2, help="probes per phase (the median is printed)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None, help="pin to cores")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    pin = (cores >= 2 and shutil.which("taskset") is not None) if args.pin is None else args.pin
    if pin:
        os.environ["FD_CPU_THREADS"] = "1"
    print(
        f"{cores} cores, load average {load_average()} at the start; "
        + (
            "pinned, one thread each (FD_CPU_THREADS=1): prefill instance on core 0, decode instance "
            "on core 1; then, the pair stopped, the mixed instance alone on core 1. The router, the "
            "load clients and the probe are not pinned (they share both cores)"
            if pin
            else "not pinned: every instance shares every core, so prefill work slows the decode instance too"
        ),
        flush=True,
    )
    # a SIGTERM (a timeout) unwinds through the `finally` below, so no server outlives the script
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    processes: list[Process] = []
    try:
        prefill = serve("prefill", 0 if pin else None, [])
        processes.append(prefill)
        decode = serve("decode", 1 if pin else None, [])
        processes.append(decode)
        router = start_router(prefill.url, decode.url)
        processes.append(router)
        disaggregated = measure("disaggregated", router.url, args)
        decode.stop()  # the mixed instance gets the decode instance's core to itself
        prefill.stop()
        mixed_server = serve("mixed", 1 if pin else None, [])
        processes.append(mixed_server)
        mixed = measure("mixed", mixed_server.url, args)
    finally:
        for process in reversed(processes):
            process.stop()
    print(
        f"decode instance TPOT under the mix: {change(disaggregated['mix'], disaggregated['no prefill load'])} "
        f"against no prefill load (goal: within 10%), {change(disaggregated['mix'], disaggregated['alone'])} "
        f"against the probe alone; one mixed instance under the same mix: "
        f"{change(mixed['mix'], mixed['no prefill load'])} and {change(mixed['mix'], mixed['alone'])}; "
        f"load average at the end {load_average()}"
    )


if __name__ == "__main__":
    main()
