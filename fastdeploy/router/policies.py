"""Which healthy worker a request goes to (`--policy`).

- `least-outstanding`: the worker with the fewest requests in flight through this router; ties
  go round-robin.
- `prefix-affinity`: a prompt that starts like a recent one goes to the worker that served it
  (whose prefix cache likely holds that prefix) unless that worker has more than `--prefix-slack`
  requests more in flight than the least busy; otherwise as `least-outstanding`. The same rule as
  the server's in-process replicas, on the prompt's text in blocks of characters.
- `round-robin`: each worker in turn.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.load_balancing import LeastLoaded, PrefixAffinity, RoundRobin

if TYPE_CHECKING:  # the command line reads POLICY_NAMES without importing the HTTP client
    from fastdeploy.router.workers import Worker

POLICY_NAMES = ("least-outstanding", "prefix-affinity", "round-robin")


class Policy(Protocol):
    #: whether `choose` reads the request (else the router does not parse bodies for it)
    reads_request: bool

    def choose(self, workers: Sequence[Worker], request: Any) -> Worker:
        """One of `workers` (never empty) for `request` (the parsed JSON body, or None)."""


def _outstanding(worker: Worker) -> int:
    return worker.outstanding


class LeastOutstanding:
    reads_request = False

    def __init__(self) -> None:
        self._least = LeastLoaded()

    def choose(self, workers: Sequence[Worker], request: Any) -> Worker:
        return self._least.choose(workers, _outstanding)


class RoundRobinPolicy:
    reads_request = False

    def __init__(self) -> None:
        self._turn = RoundRobin()

    def choose(self, workers: Sequence[Worker], request: Any) -> Worker:
        return self._turn.choose(workers, _outstanding)


class PrefixAffinityPolicy:
    reads_request = True

    def __init__(self, block_chars: int, slack: int) -> None:
        self._least = LeastLoaded()
        self._affinity: PrefixAffinity[Worker] = PrefixAffinity(block_chars, slack=slack)

    def choose(self, workers: Sequence[Worker], request: Any) -> Worker:
        least = self._least.choose(workers, _outstanding)
        return self._affinity.choose(prompt_text(request), workers, _outstanding, least)


def prompt_text(request: Any) -> str:
    """What a prefix cache would see first: a completion's prompt (the first of a list), or a
    chat's messages in order. Token-id prompts are joined as text, so they share prefixes too."""
    if not isinstance(request, dict):
        return ""
    if "messages" in request:
        return json.dumps(request["messages"], separators=(",", ":"), ensure_ascii=False, default=str)
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, list):
        return ",".join(str(token) for token in prompt)
    return prompt if isinstance(prompt, str) else ""


def make_policy(name: str, prefix_block_chars: int = 128, prefix_slack: int = 2) -> Policy:
    """The policy called `name` (one of POLICY_NAMES)."""
    if name == "least-outstanding":
        return LeastOutstanding()
    if name == "round-robin":
        return RoundRobinPolicy()
    if name == "prefix-affinity":
        return PrefixAffinityPolicy(prefix_block_chars, prefix_slack)
    raise InvalidArgumentError(
        f"--policy: unknown policy {name!r} (expected one of {', '.join(POLICY_NAMES)})"
    )
