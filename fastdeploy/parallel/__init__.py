"""Collectives and sharding: what a model shard needs to run on several ranks.

- `topology`: the tensor x pipeline grid and the checks of a size against a model.
- `communicator`: the collectives interface a runtime implements (`paddle_communicator`,
  `torch_communicator`, with `shm_collectives` for ranks of one host; device plugins add theirs
  through `fastdeploy_communicators`), chosen by `selection`, met through `rendezvous`.
- `model_parallel` / `sharding`: what a model shard knows about its rank, and how host weights
  are cut into shards.

This layer sits below the models and above the device backends. The rank processes that use it
are in `fastdeploy.executor`; the data-parallel replica router is in `fastdeploy.entrypoints`.
See docs/architecture.md ("Parallelism").
"""
