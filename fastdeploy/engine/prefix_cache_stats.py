"""How much the prefix cache saves: prompt tokens and requests looked up, and those served from it.

Recorded once per request sample, when the scheduler first admits it (a preempted sequence that is
admitted again recomputes without counting twice). The server exports the totals as FastDeploy's
`fastdeploy:hit_token_rate`, `fastdeploy:hit_req_rate` and `fastdeploy:prefix_cache_token_num`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fastdeploy.engine.totals import summed_fields


@dataclass
class PrefixCacheStats:
    """Totals since the engine started (all zero while prefix caching is off)."""

    queried_tokens: int = 0
    hit_tokens: int = 0
    queried_requests: int = 0
    hit_requests: int = 0

    @classmethod
    def summed(cls, parts: Iterable[PrefixCacheStats]) -> PrefixCacheStats:
        """The totals of several engines (data-parallel replicas behind one server)."""
        return summed_fields(cls, parts)

    def record(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.queried_tokens += prompt_tokens
        self.hit_tokens += cached_tokens
        self.queried_requests += 1
        self.hit_requests += cached_tokens > 0

    @property
    def hit_token_rate(self) -> float:
        """Share of looked-up prompt tokens served from the cache (0 before any lookup)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def hit_request_rate(self) -> float:
        """Share of looked-up requests that found at least one cached block."""
        return self.hit_requests / self.queried_requests if self.queried_requests else 0.0
