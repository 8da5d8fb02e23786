"""Prefill/decode disaggregation: does a decode instance keep its pace while prompts pour in?

The script starts a prefill instance, a decode instance and a router pairing them, and one mixed
instance, all on loopback with the embedded model. For each layout it streams a long greedy
generation (the probe) and measures its time per output token (TPOT: the mean gap between its
tokens), first with nothing else running, then while clients keep sending long prompts with
short generations (the prefill load). Disaggregated, the prompts are computed by the prefill
instance and only their last block by the decode instance; mixed, every prompt is computed in
the same passes as the probe's tokens.

    python benchmarks/disaggregation.py [--prompt-words 600] [--load-clients 2] [--probe-tokens 64]

The goal is the decode instance's TPOT under load within 10% of its TPOT without. That needs the
prefill and decode instances on separate cores: with `--pin` (the default where the machine has
2 or more cores) the prefill instance runs on core 0 and the decode instance and the mixed
instance on core 1, each with one thread (FD_CPU_THREADS=1). On a 2-core machine they still share
memory bandwidth and caches, and the load clients and the router run on whatever core is free;
the script prints this next to the figures.
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
    with httpx.stream("POST", url + "/v1/completions", json=payload, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                stamps.append(time.perf_counter())
    if len(stamps) < 2:
        raise SystemExit(f"the probe streamed {len(stamps)} chunks")
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


class Load:
    """Clients sending long prompts with short generations until stopped."""

    def __init__(self, url: str, clients: int, words: int, max_tokens: int) -> None:
        self.url, self.words, self.max_tokens = url, words, max_tokens
        self.stop = threading.Event()
        self.started = threading.Event()
        self.done = 0
        self.counter = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        with httpx.Client(timeout=600) as client:
            while not self.stop.is_set():
                with self.lock:
                    self.counter += 1
                    index = self.counter
                payload = {
                    "prompt": long_prompt(index, self.words),
                    "max_tokens": self.max_tokens,
                    "temperature": 0,
                }
                self.started.set()
                client.post(self.url + "/v1/completions", json=payload).raise_for_status()
                with self.lock:
                    self.done += 1

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        self.started.wait()
        time.sleep(0.5)  # let the first prompts reach the engines before the probe starts
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def measure(name: str, url: str, args: argparse.Namespace) -> tuple[float, float, int]:
    idle = statistics.median(probe_tpot(url, args.probe_tokens) for _ in range(args.repeats))
    with Load(url, args.load_clients, args.prompt_words, args.load_max_tokens) as load:
        loaded = statistics.median(probe_tpot(url, args.probe_tokens) for _ in range(args.repeats))
    print(
        f"{name:>16}: TPOT idle {idle * 1e3:7.1f} ms, under prefill load {loaded * 1e3:7.1f} ms "
        f"({(loaded / idle - 1) * 100:+.1f}%; {load.done} load requests finished meanwhile)",
        flush=True,
    )
    return idle, loaded, load.done


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--prompt-words", type=int, default=600, help="words per load prompt (~1.3 tokens each)"
    )
    parser.add_argument("--load-clients", type=int, default=2, help="clients sending long prompts at once")
    parser.add_argument("--load-max-tokens", type=int, default=4, help="tokens each load request generates")
    parser.add_argument("--probe-tokens", type=int, default=64, help="tokens the probe generates")
    parser.add_argument("--repeats", type=int, default=2, help="probes per phase (the median is printed)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None, help="pin to cores")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    pin = (cores >= 2 and shutil.which("taskset") is not None) if args.pin is None else args.pin
    os.environ["FD_CPU_THREADS"] = "1" if pin else os.environ.get("FD_CPU_THREADS", "")
    if not os.environ["FD_CPU_THREADS"]:
        del os.environ["FD_CPU_THREADS"]
    print(
        f"{cores} cores; "
        + (
            "prefill instance on core 0, decode and mixed instances on core 1, one thread each; the load "
            "clients and the router share the cores with them"
            if pin
            else "all instances share every core (no pinning): prefill work slows the decode instance too"
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
    growth = disaggregated[1] / disaggregated[0] - 1
    print(
        f"decode instance TPOT under prefill load: {growth * 100:+.1f}% (goal: within 10%); "
        f"one mixed instance: {(mixed[1] / mixed[0] - 1) * 100:+.1f}%"
    )


if __name__ == "__main__":
    main()
