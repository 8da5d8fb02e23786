"""Where a scheduled batch runs: in the engine's process, or on rank processes.

- `rank_executor`: the engine's side of tensor / pipeline parallelism: starts the ranks, sends
  them batches, supervises them;
- `worker`: a rank process's loop; `protocol`: the messages between the two;
- `processes` / `forkserver` / `forkserver_process`: starting and reaping rank processes;
- `placement` / `startup`: which ranks run on which host, and building the executor.
"""
