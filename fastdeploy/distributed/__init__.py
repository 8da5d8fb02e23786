"""Running one model on several ranks: tensor, pipeline and data parallelism, on one or more hosts.

- `topology`: the tensor x pipeline grid and the checks of a size against a model.
- `communicator`: the collectives interface a runtime implements (`paddle_communicator`,
  `torch_communicator`; device plugins add theirs through `fastdeploy_communicators`).
- `model_parallel` / `sharding`: what a model shard knows about its rank, and how host weights
  are cut into shards.
- `executor` / `worker` / `processes` / `placement` / `rendezvous`: the engine's rank processes,
  their launch on one host or several, and their supervision.
- `pipeline`: micro-batches in flight across pipeline stages.
- `replicas` / `serving`: the server's data-parallel replicas.

See docs/architecture.md ("Parallelism") for the design and docs/plugins.md for the interface.
"""
