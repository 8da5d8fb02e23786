"""The tensor x pipeline grid: rank coordinates, shards, and the checks of sizes against a model."""

from __future__ import annotations

import pytest

from fastdeploy.config import EngineConfig, ModelConfig
from fastdeploy.errors import InvalidArgumentError
from fastdeploy.executor.placement import Placement, check_placement, find_placement
from fastdeploy.parallel.model_parallel import ModelParallel
from fastdeploy.parallel.topology import (
    ParallelLayout,
    check_layout,
    split_evenly,
    valid_tensor_parallel_sizes,
)


def model(heads: int, kv_heads: int, layers: int = 30) -> ModelConfig:
    return ModelConfig.from_hf_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 64 * heads,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "intermediate_size": 1536,
            "vocab_size": 49152,
        }
    )


def test_split_evenly_covers_the_range_in_order():
    parts = [split_evenly(10, 4, i) for i in range(4)]
    assert parts == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]


def test_ranks_are_numbered_stage_by_stage():
    layout = ParallelLayout(tensor_parallel_size=2, pipeline_parallel_size=3)
    assert layout.world_size == 6
    assert [(layout.pp_rank(r), layout.tp_rank(r)) for r in range(6)] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)
    ]  # fmt: skip
    assert layout.tp_group(1) == [2, 3]
    assert layout.output_rank == 4
    assert [layout.stage_layers(30, s) for s in range(3)] == [range(0, 10), range(10, 20), range(20, 30)]


def test_smollm2_allows_the_sizes_that_split_9_heads_and_3_kv_heads():
    # 3 KV heads: 1 and 3 divide them; 9 is a multiple of 3 (each KV head on 3 ranks)
    assert valid_tensor_parallel_sizes(9, 3) == [1, 3, 9]
    # 4 query heads over 2 KV heads: 4 ranks replicate each KV head twice
    assert valid_tensor_parallel_sizes(4, 2) == [1, 2, 4]
    assert valid_tensor_parallel_sizes(16, 2) == [1, 2, 4, 8, 16]


@pytest.mark.parametrize(
    ("tp", "pp", "heads", "kv", "fragment"),
    [
        (2, 1, 9, 3, "tensor_parallel_size=2 does not divide the 9 attention heads of SmolLM2; sizes this model allows: 1, 3, 9"),
        (12, 1, 9, 3, "tensor_parallel_size=12 is larger than the 9 attention heads of SmolLM2"),
        (4, 1, 12, 3, "tensor_parallel_size=4 neither divides nor is a multiple of the 3 KV heads of SmolLM2 (12 query heads)"),
        (1, 31, 9, 3, "pipeline_parallel_size=31 is larger than the 30 decoder layers of SmolLM2"),
    ],
)  # fmt: skip
def test_sizes_the_model_cannot_take_fail_with_the_numbers(tp, pp, heads, kv, fragment):
    with pytest.raises(InvalidArgumentError) as error:
        check_layout(ParallelLayout(tp, pp), model(heads, kv), "SmolLM2")
    assert fragment in str(error.value)


def test_kv_heads_are_replicated_when_ranks_outnumber_them():
    layout = ParallelLayout(tensor_parallel_size=4)
    shards = [ModelParallel(layout, rank) for rank in range(4)]
    assert [p.head_shard(4) for p in shards] == [range(i, i + 1) for i in range(4)]
    # query heads 0,1 share KV head 0 and 2,3 share KV head 1: ranks 0,1 hold KV head 0
    assert [p.head_shard(2) for p in shards] == [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]


def test_intermediate_features_split_on_gguf_block_boundaries():
    shards = [ModelParallel(ParallelLayout(3), rank) for rank in range(3)]
    assert [p.feature_shard(1536) for p in shards] == [range(0, 512), range(512, 1024), range(1024, 1536)]
    # 48 features over 2 ranks cannot keep 32-wide blocks: split evenly instead
    assert [ModelParallel(ParallelLayout(2), r).feature_shard(48) for r in range(2)] == [
        range(0, 24),
        range(24, 48),
    ]


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be an int >= 1, got 0"),
        ({"pipeline_parallel_size": -2}, "pipeline_parallel_size must be an int >= 1, got -2"),
        ({"data_parallel_size": 0}, "data_parallel_size must be an int >= 1 (engine replicas), got 0"),
        ({"engine_worker_queue_port": 70000}, "engine_worker_queue_port must be a TCP port number (1-65535), got 70000"),
        ({"distributed_executor_backend": "ray"}, "distributed_executor_backend must be 'uni'"),
        ({"tensor_parallel_size": 2, "distributed_executor_backend": "uni"}, "pipeline_parallel_size = 2; use 'mp'"),
        ({"dist_init_timeout": 0}, "dist_init_timeout must be > 0 seconds"),
    ],
)  # fmt: skip
def test_engine_config_rejects_bad_parallel_settings(overrides, fragment):
    with pytest.raises(InvalidArgumentError) as error:
        EngineConfig(**overrides)
    assert fragment in str(error.value)


def test_ranks_must_divide_over_hosts_and_fit_their_devices():
    layout = ParallelLayout(tensor_parallel_size=3, pipeline_parallel_size=2)
    with pytest.raises(
        InvalidArgumentError, match=r"3 x 2 = 6 ranks cannot be split evenly over the 4 hosts"
    ):
        check_placement(Placement(("a", "b", "c", "d")), layout, None, "cpu")
    with pytest.raises(
        InvalidArgumentError, match=r"6 ranks, 6 per host, but this host has 4 cuda device\(s\)"
    ):
        check_placement(Placement(), layout, 4, "cuda")
    check_placement(Placement(("a", "b")), layout, 4, "cuda")  # 3 per host fit


def test_a_host_finds_its_place_in_ips(monkeypatch):
    monkeypatch.delenv("FD_NODE_RANK", raising=False)
    assert find_placement("127.0.0.1", None) == Placement()
    # 203.0.113.x (TEST-NET-3, for documentation) is not an address of this machine
    placement = find_placement("203.0.113.10, 127.0.0.1", 9000)
    assert (placement.hosts, placement.node_rank, placement.control_port) == (
        ("203.0.113.10", "127.0.0.1"),
        1,
        9000,
    )
    with pytest.raises(InvalidArgumentError, match="several of them are this host; set FD_NODE_RANK"):
        find_placement("127.0.0.1,127.0.0.1", None)
    with pytest.raises(InvalidArgumentError, match="none of them is an address of this host"):
        find_placement("203.0.113.10,203.0.113.11", None)
    monkeypatch.setenv("FD_NODE_RANK", "1")
    assert find_placement("127.0.0.1,127.0.0.1", None).node_rank == 1
    monkeypatch.setenv("FD_NODE_RANK", "2")
    with pytest.raises(InvalidArgumentError, match="FD_NODE_RANK=2 is outside the 2 hosts"):
        find_placement("127.0.0.1,127.0.0.1", None)


def test_cuda_ranks_take_one_visible_gpu_each(monkeypatch):
    from fastdeploy.backends.cuda.backend import CudaBackend

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,7")
    assert CudaBackend.device_count() == 3
    assert [CudaBackend.rank_environment(i) for i in range(3)] == [
        {"CUDA_VISIBLE_DEVICES": "2", "FLAGS_selected_gpus": "0"},
        {"CUDA_VISIBLE_DEVICES": "5", "FLAGS_selected_gpus": "0"},
        {"CUDA_VISIBLE_DEVICES": "7", "FLAGS_selected_gpus": "0"},
    ]
    with pytest.raises(InvalidArgumentError, match=r"4 per host, but this host has 3 cuda device\(s\)"):
        check_placement(Placement(), ParallelLayout(2, 2), CudaBackend.device_count(), "cuda")


def test_more_than_one_rank_without_paddle_says_what_to_install(monkeypatch):
    import importlib.metadata

    from fastdeploy import LLM
    from fastdeploy.errors import DistributedInitError

    real_version = importlib.metadata.version

    def without_paddle(name):
        if name.startswith("paddlepaddle"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", without_paddle)
    with pytest.raises(DistributedInitError) as error:
        LLM(tensor_parallel_size=3)
    assert "more than one rank needs the 'paddle' communicator" in str(error.value)
    assert "pip install 'fastdeploy[distributed]'" in str(error.value)
