"""Which rank holds which part of the model: the tensor x pipeline grid and its checks.

Ranks are numbered stage by stage: global rank = pp_rank * tensor_parallel_size + tp_rank, so
the ranks of one tensor-parallel group are consecutive (and stay on one host when a host runs
`tensor_parallel_size` ranks, where the all-reduces are most frequent). The checks run on the
driver before any process starts, so a size the model cannot take fails at construction with
the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastdeploy.config import ModelConfig
from fastdeploy.errors import InvalidArgumentError


def split_evenly(size: int, parts: int, index: int) -> range:
    """The `index`-th of `parts` consecutive ranges covering range(size), sizes differing by at most 1
    (the first ranges take the remainder)."""
    base, extra = divmod(size, parts)
    start = index * base + min(index, extra)
    return range(start, start + base + (1 if index < extra else 0))


def rank_name(rank: int, replica: int) -> str:
    """How logs and errors name a rank: with the replica beyond the first of `fastdeploy serve
    --data-parallel-size`, whose ranks are numbered from 0 again."""
    return f"rank {rank}" + (f" of replica {replica}" if replica else "")


@dataclass(frozen=True)
class ParallelLayout:
    """The tensor x pipeline grid of one model replica."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def distributed(self) -> bool:
        """Whether the model runs in worker processes (any size above 1)."""
        return self.world_size > 1

    def tp_rank(self, rank: int) -> int:
        return rank % self.tensor_parallel_size

    def pp_rank(self, rank: int) -> int:
        return rank // self.tensor_parallel_size

    def tp_group(self, pp_rank: int) -> list[int]:
        """Global ranks of the tensor-parallel group of pipeline stage `pp_rank`."""
        first = pp_rank * self.tensor_parallel_size
        return list(range(first, first + self.tensor_parallel_size))

    @property
    def output_rank(self) -> int:
        """The rank that hands the logits to the driver: tp rank 0 of the last stage."""
        return (self.pipeline_parallel_size - 1) * self.tensor_parallel_size

    def stage_layers(self, num_layers: int, pp_rank: int) -> range:
        """The decoder layers pipeline stage `pp_rank` holds."""
        return split_evenly(num_layers, self.pipeline_parallel_size, pp_rank)


def valid_tensor_parallel_sizes(num_heads: int, num_kv_heads: int) -> list[int]:
    """Sizes that split the query heads evenly and the KV heads evenly or by replication."""
    return [
        size
        for size in range(1, num_heads + 1)
        if num_heads % size == 0
        and (num_kv_heads % size == 0 if size <= num_kv_heads else size % num_kv_heads == 0)
    ]


def check_layout(layout: ParallelLayout, model: ModelConfig, model_name: str) -> None:
    """Raise InvalidArgumentError, with the numbers, if the model cannot be split this way."""
    tp, pp = layout.tensor_parallel_size, layout.pipeline_parallel_size
    heads, kv_heads = model.num_attention_heads, model.num_key_value_heads
    if tp > 1:
        valid = valid_tensor_parallel_sizes(heads, kv_heads)
        if tp not in valid:
            if tp > heads:
                why = f"is larger than the {heads} attention heads of {model_name}"
            elif heads % tp:
                why = f"does not divide the {heads} attention heads of {model_name}"
            else:
                why = (
                    f"neither divides nor is a multiple of the {kv_heads} KV heads of {model_name} "
                    f"({heads} query heads)"
                )
            raise InvalidArgumentError(
                f"tensor_parallel_size={tp} {why}; sizes this model allows: {', '.join(map(str, valid))}"
            )
    layers = model.num_hidden_layers
    if pp > layers:
        raise InvalidArgumentError(
            f"pipeline_parallel_size={pp} is larger than the {layers} decoder layers of {model_name}; "
            f"each stage needs at least one layer (use at most {layers})"
        )
