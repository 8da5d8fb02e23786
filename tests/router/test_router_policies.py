"""The router's policies and the shared choice rules, on stand-in workers (no processes)."""

from __future__ import annotations

import json

import pytest

from fastdeploy.errors import InvalidArgumentError
from fastdeploy.load_balancing import LeastLoaded, PrefixAffinity, RoundRobin
from fastdeploy.router.policies import make_policy, prompt_text
from fastdeploy.router.workers import Worker


def workers(*outstanding: int) -> list[Worker]:
    return [
        Worker(f"http://127.0.0.1:{8000 + i}", healthy=True, outstanding=n) for i, n in enumerate(outstanding)
    ]


def test_least_outstanding_picks_the_least_busy_and_rotates_ties():
    pool = workers(3, 1, 2)
    policy = make_policy("least-outstanding")
    assert policy.choose(pool, None) is pool[1]
    pool[1].outstanding = 5
    assert policy.choose(pool, None) is pool[2]
    idle = workers(0, 0, 0)
    assert [policy.choose(idle, None) for _ in range(4)] == [idle[0], idle[1], idle[2], idle[0]]


def test_round_robin_ignores_load():
    pool = workers(9, 0)
    policy = make_policy("round-robin")
    assert [policy.choose(pool, None) for _ in range(4)] == [pool[0], pool[1], pool[0], pool[1]]


def test_round_robin_keeps_turning_when_a_worker_drops_out():
    turn = RoundRobin()
    assert [turn.choose("abc", len) for _ in range(2)] == ["a", "b"]
    assert turn.choose("ab", len) == "a"  # the third turn, over the two that are left


def test_prefix_affinity_follows_a_shared_system_prompt_unless_that_worker_is_much_busier():
    pool = workers(0, 0)
    policy = make_policy("prefix-affinity", prefix_block_chars=16, prefix_slack=2)
    system = {"role": "system", "content": "You are a terse assistant who answers in one word."}
    first = policy.choose(pool, {"messages": [system, {"role": "user", "content": "Capital of France?"}]})
    other = pool[1] if first is pool[0] else pool[0]
    first.outstanding = 2  # busier, but within the slack: the cached prefix wins
    assert policy.choose(pool, {"messages": [system, {"role": "user", "content": "Largest ocean?"}]}) is first
    assert policy.choose(pool, {"prompt": "Something else entirely, with no shared start"}) is other
    first.outstanding = 3  # now more than 2 above the other worker
    assert policy.choose(pool, {"messages": [system, {"role": "user", "content": "Tallest peak?"}]}) is other


def test_prefix_affinity_skips_a_remembered_worker_that_is_not_available():
    healthy, gone = workers(0, 0)
    affinity = PrefixAffinity(block=4)
    assert affinity.choose("abcdefgh", [gone], len_of_zero, gone) is gone
    assert affinity.choose("abcdefgh-more", [healthy], len_of_zero, healthy) is healthy


def len_of_zero(_: object) -> int:
    return 0


def test_prefix_keys_are_whole_blocks_of_characters_or_tokens():
    affinity = PrefixAffinity(block=3, max_blocks=2)
    assert affinity._prefix_keys("abcdefgh") == ["abc", "abcdef"]
    assert affinity._prefix_keys([1, 2, 3, 4, 5, 6, 7]) == [(1, 2, 3), (1, 2, 3, 4, 5, 6)]
    assert affinity._prefix_keys("ab") == []


def test_prefix_affinity_forgets_the_oldest_prefixes_beyond_its_memory():
    a, b = workers(0, 0)
    affinity = PrefixAffinity(block=2, max_blocks=1, memory=2)
    affinity.choose("aa", [a, b], len_of_zero, a)
    affinity.choose("bb", [a, b], len_of_zero, b)
    affinity.choose("cc", [a, b], len_of_zero, b)  # "aa" is forgotten
    assert affinity.choose("aa", [a, b], len_of_zero, b) is b
    assert affinity.choose("cc", [a, b], len_of_zero, a) is b  # still remembered


def test_least_loaded_is_the_replica_routers_rule_too():
    chosen = LeastLoaded()
    assert chosen.choose([5, 2, 2], lambda load: load) == 2
    assert [chosen.choose(["x", "y"], lambda _: 0) for _ in range(3)] == ["x", "y", "x"]


@pytest.mark.parametrize(
    ("request_body", "text"),
    [
        ({"prompt": "Hello"}, "Hello"),
        ({"prompt": ["First", "Second"]}, "First"),
        ({"prompt": [15, 27, 3]}, "15,27,3"),
        ({"messages": [{"role": "user", "content": "Hi"}]}, json.dumps([{"role": "user", "content": "Hi"}])),
        ("not an object", ""),
        (None, ""),
    ],
)
def test_the_prompt_text_compared_for_affinity(request_body, text):
    assert prompt_text(request_body).replace(" ", "") == text.replace(" ", "")


def test_an_unknown_policy_is_refused_naming_the_flag():
    with pytest.raises(InvalidArgumentError, match="--policy: unknown policy 'fastest'"):
        make_policy("fastest")
