"""Passes that sample their own rows: the engine's side of sampling inside captured decode steps.

When every sequence of a batch needs only the argmax or temperature / top-k / top-p
(`sampling_rules.samples_in_pass`) and the runner samples in its passes (`samples_in_pass`: it
has captured decode steps), the engine hands the pass each sequence's settings and a way to draw
its uniform (`PassSampling`). The runner replays the step's graphs (or runs the same device stage
after an eager pass), and the host reads one [rows, 2] copy: each row's token id and whether its
logits were broken (`Backend.nonfinite_rows`' test). That copy is the step's only device-to-host
transfer; nothing else of the pass is read.

Each sequence still draws one uniform per token from its own generator, as the host and device
samplers do, so a seeded request gets the same tokens whether its step was replayed, eager or
sampled on the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend
from fastdeploy.engine.fault_isolation import NonFiniteLogitsError
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.sampling_rules import samples_in_pass
from fastdeploy.model_executor.batch import PassSampling, ScheduledBatch


def pass_sampling(batch: ScheduledBatch, reasoning_budget_applies: bool) -> PassSampling | None:
    """`batch`'s settings for sampling in its pass, or None when some sequence needs the host
    (or a feature adds rows to the pass: drafts to verify, prompt positions to score)."""
    seqs = batch.seqs
    if not seqs or batch.drafts or batch.scored:
        return None
    distinct = list({id(seq.params): seq.params for seq in seqs}.values())  # often one per batch
    if not all(samples_in_pass(params, reasoning_budget_applies) for params in distinct):
        return None

    def draw(indices: list[int]) -> np.ndarray:
        return np.array([seqs[index].rng.random() for index in indices], dtype=np.float32)

    if len(distinct) == 1:  # one value per setting: no pass over the sequences
        (only,) = distinct
        settings = [_settings(only)] * len(seqs)
    else:
        by_id = {id(params): _settings(params) for params in distinct}
        settings = [by_id[id(seq.params)] for seq in seqs]
    temperature, top_k, top_p = zip(*settings, strict=True)
    return PassSampling(
        temperature=np.array(temperature, dtype=np.float32),
        top_k=np.array(top_k, dtype=np.int32),
        top_p=np.array(top_p, dtype=np.float32),
        draw=draw,
    )


def _settings(params: SamplingParams) -> tuple[float, int, float]:
    """(temperature, 0 for greedy; top-k, 0 for off; top-p) of one `SamplingParams`."""
    return 0.0 if params.greedy else params.temperature, max(params.top_k, 0), params.top_p


def landed_tokens(backend: Backend, logits: Any, sampling: PassSampling) -> list[int]:
    """The tokens the pass sampled (one host copy); raises `NonFiniteLogitsError` for broken rows.

    A row the device kernel could not sample exactly (-1: its top-p nucleus was larger than the
    kernel's candidates, see `triton_sampling`) is sampled again by `Backend.sample_top_k_top_p`
    with the same uniform, which finishes it on the host; that costs a transfer, and is rare.
    """
    ids, broken = sampling.tokens.wait()
    bad = np.flatnonzero(broken)
    if bad.size:
        raise NonFiniteLogitsError(bad.tolist())
    again = np.flatnonzero(ids < 0)
    if again.size:
        rows = sampling.drawn
        picked = backend.gather_rows(logits, backend.from_numpy(again.astype(np.int64)))
        ids[again] = backend.sample_top_k_top_p(
            picked, rows.temperature[again], rows.top_k[again], rows.top_p[again], rows.uniform[again]
        )
    return ids.tolist()
