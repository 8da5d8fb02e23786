"""Prefill/decode disaggregation: does a decode instance keep its pace while prompts pour in?

The script starts a prefill instance, a decode instance and a router pairing them, then one
mixed instance, all on loopback with the embedded model. On each layout a probe (a streamed
greedy generation) measures the time per output token (TPOT: the mean gap between its tokens):

- alone;
- under the mix: clients asking for long generations, and clients sending long prompts with
  short generations (`--load-max-tokens`: the prompts' prefill load);
- with no prefill load: the same clients, but the long prompts replaced by short ones with the
  same generations, each sent after waiting as long as a long prompt waited for its first token
  under the mix. The decode instance then decodes as many sequences, of the same lengths,
  arriving at the same pace: only the prompts' prefill is missing. This is the reference the
  goal means; the script prints the decode batch the probe saw in both (the mean number of
  sequences generating, the probe included, while it generated: from the load requests' own
  streamed tokens) so that the two can be seen to match.

The mix and no-prefill-load phases alternate `--repeats` times and the medians are compared, so
that a change in the machine's other load hits both alike. Disaggregated, every prompt token
but the last is computed by the prefill instance and its KV blocks sent; the decode instance
computes only the last one. Mixed, every prompt is computed in the passes of the probe's tokens.

    python benchmarks/disaggregation.py [--prompt-words 600] [--load-clients 2]
        [--generation-clients 1] [--generation-tokens 128] [--probe-tokens 64] [--repeats 3]

The goal is the decode instance's TPOT under the mix within 10% of its TPOT with no prefill load.
That needs the prefill and decode instances on separate cores: with `--pin` (the default where
the machine has 2 or more cores) the prefill instance runs on core 0 and the decode instance on
core 1, each with one thread (FD_CPU_THREADS=1), and the router, the load clients and the probe
on core 0 too, so that the decode instance has core 1 to itself; after them the mixed instance
runs on core 1 alone, its clients on core 0. On a 2-core machine the instances still share memory
bandwidth and caches, and the decode instance's core does its own KV receiving and block writes;
the script prints this and the machine's load average next to the figures.
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
from collections.abc import Callable

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


def start_router(prefill: str, decode: str, core: int | None) -> Process:
    port = free_port()
    command = [sys.executable, "-m", "fastdeploy", "router", "--host", HOST, "--port", str(port)]
    command += ["--prefill-workers", prefill, "--decode-workers", decode, "--uvicorn-log-level", "warning"]
    if core is not None:
        command = ["taskset", "-c", str(core), *command]
    return Process(command, port)


def long_prompt(index: int, words: int) -> str:
    """A prompt no other shares (its first words differ), so no prefix cache shortens it."""
    body = " ".join(WORDS[(index * 7 + i * 5) % len(WORDS)] for i in range(words))
    return f"Request {index}. {body}. Summarise the list above."


def cpu_seconds(pid: int) -> tuple[float, float]:
    """The CPU seconds process `pid` has used, and the seconds its threads were ready to run but
    waited for a core (other processes had it), all its threads summed (Linux /proc)."""
    used = waited = 0.0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as handle:
                on_cpu, on_queue, _ = handle.read().split()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        used, waited = used + int(on_cpu) / 1e9, waited + int(on_queue) / 1e9
    return used, waited


class Probe:
    """One streamed greedy generation: its token times, and the CPU time the serving instance
    (process `pid`) used from its first token to its last."""

    def __init__(self, url: str, tokens: int, pid: int) -> None:
        payload = {
            "prompt": "Write a long story about a lighthouse keeper.",
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        start: list[tuple[float, float]] = []
        _, self.stamps = stream_stamps(url, payload, on_first=lambda: start.append(cpu_seconds(pid)))
        if len(self.stamps) < 2:
            raise SystemExit(f"the probe streamed {len(self.stamps)} chunks")
        used, waited = cpu_seconds(pid)
        self.cpu, self.waited = used - start[0][0], waited - start[0][1]

    @property
    def tpot(self) -> float:
        """Seconds per output token (the first token excluded)."""
        return (self.stamps[-1] - self.stamps[0]) / (len(self.stamps) - 1)

    @property
    def cpu_per_token(self) -> float:
        """The instance's CPU seconds per output token (its threads' time on a core, summed): its
        TPOT had its core been its own (memory and cache contention still count in it)."""
        return self.cpu / (len(self.stamps) - 1)

    @property
    def wait_per_token(self) -> float:
        """The seconds a token the instance's threads waited for a core held by other processes."""
        return self.waited / (len(self.stamps) - 1)


def stream_stamps(
    url: str, payload: dict, client: httpx.Client | None = None, on_first: Callable[[], object] | None = None
) -> tuple[float, list[float]]:
    """When a streamed completion was sent, and the arrival times of its chunks (`on_first` is
    called at the first)."""
    sent, stamps = time.perf_counter(), []
    with (client or httpx).stream("POST", url + "/v1/completions", json=payload, timeout=3600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                stamps.append(time.perf_counter())
                if on_first is not None and len(stamps) == 1:
                    on_first()
    return sent, stamps


class Load:
    """Clients sending streamed requests until stopped: `prompts` of them long prompts with short
    generations (prefill work), `generations` of them short prompts with long generations, and
    `short` of them short prompts with the long prompts' short generations, each sent `wait`
    seconds after the last one, less the time it took to its first token."""

    def __init__(
        self, url: str, args: argparse.Namespace, prompts: int = 0, short: int = 0, wait: float = 0.0
    ) -> None:
        self.url, self.args, self.wait = url, args, wait
        self.stop = threading.Event()
        self.started = threading.Event()
        self.done = {"prompts": 0, "generations": 0, "short": 0}
        #: (sent, first token, last token, kind) of every finished request
        self.requests: list[tuple[float, float, float, str]] = []
        self.counter = 0
        self.lock = threading.Lock()
        kinds = ["prompts"] * prompts + ["generations"] * args.generation_clients + ["short"] * short
        self.threads = [threading.Thread(target=self._client, args=(kind,), daemon=True) for kind in kinds]

    def _payload(self, kind: str, index: int) -> dict:
        if kind == "prompts":
            prompt, tokens = long_prompt(index, self.args.prompt_words), self.args.load_max_tokens
        elif kind == "short":
            prompt, tokens = f"Note {index}: the weather", self.args.load_max_tokens
        else:
            prompt, tokens = f"Story {index}: once upon a time", self.args.generation_tokens
        return {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}

    def _client(self, kind: str) -> None:
        pause = 0.0
        with httpx.Client(timeout=3600) as client:
            while not self.stop.wait(pause):
                with self.lock:
                    self.counter += 1
                    index = self.counter
                self.started.set()
                sent, stamps = stream_stamps(self.url, self._payload(kind, index), client)
                with self.lock:
                    self.requests.append((sent, stamps[0], stamps[-1], kind))
                    self.done[kind] += 1
                if kind == "short":
                    pause = max(0.0, self.wait - (stamps[0] - sent))

    def first_token_wait(self, kind: str) -> float:
        """The mean time the finished requests of `kind` waited for their first token."""
        waits = [first - sent for sent, first, _, k in self.requests if k == kind]
        return statistics.mean(waits) if waits else 0.0

    def decode_batch(self, probe: Probe) -> float:
        """The mean number of sequences generating, the probe's included, at the midpoints of its
        token gaps (a request generates from its first token to its last; ask once stopped)."""
        spans = [(first, last) for _, first, last, _ in self.requests]
        middles = [(a + b) / 2 for a, b in zip(probe.stamps, probe.stamps[1:], strict=False)]
        return 1 + statistics.mean(sum(first <= m <= last for first, last in spans) for m in middles)

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


def measure(name: str, server: Process, url: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The probe alone, under the mix, and with no prefill load (the same decoding work), those
    two alternating: per phase the median TPOT, the median CPU time per token of the instance
    generating (`server`), and the mean decode batch."""
    pid = server.process.pid
    probes: dict[str, list[Probe]] = {
        "alone": [Probe(url, args.probe_tokens, pid) for _ in range(args.repeats)]
    }
    batches: dict[str, list[float]] = {"alone": [1.0], "mix": [], "no prefill load": []}
    probes["mix"], probes["no prefill load"] = [], []
    finished = {"prompts": 0, "generations": 0, "short": 0}
    for _ in range(args.repeats):
        with Load(url, args, prompts=args.load_clients) as load:
            probes["mix"].append(Probe(url, args.probe_tokens, pid))
        batches["mix"].append(load.decode_batch(probes["mix"][-1]))
        with Load(url, args, short=args.load_clients, wait=load.first_token_wait("prompts")) as reference:
            probes["no prefill load"].append(Probe(url, args.probe_tokens, pid))
        batches["no prefill load"].append(reference.decode_batch(probes["no prefill load"][-1]))
        for kind in finished:
            finished[kind] += load.done[kind] + reference.done[kind]
    figures = {
        phase: {
            "tpot": statistics.median(probe.tpot for probe in runs),
            "cpu": statistics.median(probe.cpu_per_token for probe in runs),
            "batch": statistics.mean(batches[phase]),
            "wait": statistics.median(probe.wait_per_token for probe in runs),
        }
        for phase, runs in probes.items()
    }
    for phase, values in figures.items():
        runs = " ".join(f"{probe.tpot * 1e3:.1f}/{probe.cpu_per_token * 1e3:.1f}" for probe in probes[phase])
        print(
            f"{name:>13} {phase:>15}: TPOT {values['tpot'] * 1e3:7.1f} ms, CPU {values['cpu'] * 1e3:6.1f} ms a "
            f"token, waiting for a core {values['wait'] * 1e3:6.1f} ms a token, decode batch "
            f"{values['batch']:.2f} (each run, TPOT/CPU ms: {runs})",
            flush=True,
        )
    mix, reference = figures["mix"], figures["no prefill load"]
    print(
        f"{name:>13}: under the mix TPOT {change(mix['tpot'], reference['tpot'])} and CPU a token "
        f"{change(mix['cpu'], reference['cpu'])} against no prefill load ({finished['prompts']} long prompts, "
        f"{finished['short']} short ones and {finished['generations']} long generations finished; load "
        f"average {load_average()})",
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
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="probes per phase, the phases alternating (medians are compared)",
    )
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None, help="pin to cores")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    pin = (cores >= 2 and shutil.which("taskset") is not None) if args.pin is None else args.pin
    if pin:
        os.environ["FD_CPU_THREADS"] = "1"
        os.sched_setaffinity(0, {0})  # the probe and the load clients: off the decode instance's core
    print(
        f"{cores} cores, load average {load_average()} at the start; "
        + (
            "pinned, one thread each (FD_CPU_THREADS=1): prefill instance, router, load clients and "
            "probe on core 0, decode instance alone on core 1; then, the pair stopped, the mixed "
            "instance alone on core 1"
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
        router = start_router(prefill.url, decode.url, 0 if pin else None)
        processes.append(router)
        disaggregated = measure("disaggregated", decode, router.url, args)
        decode.stop()  # the mixed instance gets the decode instance's core to itself
        prefill.stop()
        mixed_server = serve("mixed", 1 if pin else None, [])
        processes.append(mixed_server)
        mixed = measure("mixed", mixed_server, mixed_server.url, args)
    finally:
        for process in reversed(processes):
            process.stop()
    dis, mix = disaggregated["mix"], mixed["mix"]
    dis_ref, mix_ref = disaggregated["no prefill load"], mixed["no prefill load"]
    print(
        f"decode instance under the mix against no prefill load (goal: TPOT within 10%): TPOT "
        f"{change(dis['tpot'], dis_ref['tpot'])}, CPU a token {change(dis['cpu'], dis_ref['cpu'])}; one "
        f"mixed instance under the same mix: TPOT {change(mix['tpot'], mix_ref['tpot'])}, CPU a token "
        f"{change(mix['cpu'], mix_ref['cpu'])}; load average at the end {load_average()}"
    )


if __name__ == "__main__":
    main()
