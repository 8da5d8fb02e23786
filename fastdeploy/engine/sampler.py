"""Turns one step's logits into tokens: penalties, bans, temperature, top-k/top-p/min-p, sampling.

Runs on host numpy arrays. Work that applies to every row (greedy argmax, bans) is vectorised;
random sampling loops over rows, each with its sequence's own random generator, so a seeded
request draws the same tokens whatever shares its batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdeploy.backends.base import Backend, Capability
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.sampling_rules import device_samplable, greedy_without_extras, no_penalties
from fastdeploy.engine.sequence import Sequence

_NEG_INF = np.float32(-np.inf)
#: top-p first looks among this many best tokens before sorting the whole vocabulary
_TOP_P_CANDIDATES = 256


@dataclass
class BannedTokens:
    """Per-sequence token bans computed by the engine (min_tokens, bad words)."""

    row: int
    token_ids: list[int]
    #: the setting behind each ban, as a user would recognise it ("bad_words ['x']") -> its tokens
    reasons: dict[str, list[int]] = field(default_factory=dict)


def apply_penalties(logits: np.ndarray, seq: Sequence) -> None:
    """Repetition (prompt + output), frequency and presence (output) penalties, in place on one row."""
    params = seq.params
    if params.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(seq.token_ids, dtype=np.int64))
        values = logits[seen]
        logits[seen] = np.where(
            values > 0, values / params.repetition_penalty, values * params.repetition_penalty
        )
    if params.frequency_penalty or params.presence_penalty:
        outputs = seq.output_token_ids
        if outputs:
            ids, counts = np.unique(np.asarray(outputs, dtype=np.int64), return_counts=True)
            logits[ids] -= params.frequency_penalty * counts + params.presence_penalty


def _top_p_keep(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest set of most likely tokens whose mass reaches top_p."""
    if probs.size > _TOP_P_CANDIDATES:
        candidates = np.argpartition(-probs, _TOP_P_CANDIDATES)[:_TOP_P_CANDIDATES]
        if probs[candidates].sum() < top_p:
            candidates = np.arange(probs.size)
    else:
        candidates = np.arange(probs.size)
    order = candidates[np.argsort(-probs[candidates], kind="stable")]
    cumulative = np.cumsum(probs[order])
    cutoff = int(np.searchsorted(cumulative, top_p)) + 1
    return order[: min(cutoff, order.size)]


def filtered_distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(candidate token ids, their probabilities summing to 1) after temperature, top-k, min-p and
    top-p: the distribution a non-greedy sequence samples from (speculative decoding's rejection
    sampler compares two of them)."""
    scaled = logits.astype(np.float64) / params.temperature
    if params.top_k > 0 and params.top_k < scaled.size:
        candidates = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
    else:
        candidates = np.flatnonzero(np.isfinite(scaled))
    values = scaled[candidates]
    probs = np.exp(values - values.max())
    probs /= probs.sum()
    if params.min_p > 0:
        keep = probs >= params.min_p * probs.max()
        candidates, probs = candidates[keep], probs[keep]
        probs /= probs.sum()
    if params.top_p < 1.0:
        keep = _top_p_keep(probs, params.top_p)
        candidates, probs = candidates[keep], probs[keep]
        probs = probs / probs.sum()
    return candidates, probs


def sample_row(logits: np.ndarray, seq: Sequence) -> int:
    """Draw one token for a non-greedy sequence from its processed logits row."""
    candidates, probs = filtered_distribution(logits, seq.params)
    cumulative = np.cumsum(probs)
    choice = int(np.searchsorted(cumulative, seq.rng.random() * cumulative[-1], side="right"))
    return int(candidates[min(choice, candidates.size - 1)])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def top_logprobs(row_logprobs: np.ndarray, chosen: int, count: int) -> dict[int, float]:
    """{token: logprob} of the `count` most likely tokens plus the chosen one."""
    best = np.argpartition(-row_logprobs, count)[:count] if count else np.empty(0, np.int64)
    result = {int(token): float(row_logprobs[token]) for token in best}
    result[chosen] = float(row_logprobs[chosen])
    return result


def sample(logits: np.ndarray, seqs: list[Sequence], bans: list[BannedTokens]) -> list[int]:
    """One token per row of `logits` [rows, vocab] for the matching sequences."""
    for ban in bans:
        logits[ban.row, ban.token_ids] = _NEG_INF
    for row, seq in enumerate(seqs):
        if not no_penalties(seq.params):
            apply_penalties(logits[row], seq)
    tokens = logits.argmax(axis=-1).tolist()
    for row, seq in enumerate(seqs):
        if not seq.params.greedy:
            tokens[row] = sample_row(logits[row], seq)
        record_logprobs(seq, logits[row], tokens[row])
    return tokens


def record_logprobs(seq: Sequence, logits: np.ndarray, token: int) -> None:
    """Note `token`'s logprob under the logits row it was drawn from: its top-k entry
    (`SamplingParams.logprobs`) and its share of the cumulative logprob, when the sequence keeps them."""
    if seq.params.logprobs is None and seq.cumulative_logprob is None:
        return
    row_logprobs = log_softmax(logits)
    if seq.cumulative_logprob is not None:
        seq.cumulative_logprob += float(row_logprobs[token])
    if seq.params.logprobs is not None:
        if seq.logprobs is None:
            seq.logprobs = []
        seq.logprobs.append(top_logprobs(row_logprobs, token, seq.params.logprobs))


def sample_tokens(backend: Backend, logits: Any, seqs: list[Sequence], bans: list[BannedTokens]) -> list[int]:
    """One token per sampling sequence: on the device when the backend samples there and every
    row needs only temperature / top-k / top-p, else on the host with the full sampler.

    Either way each sequence draws its uniform from its own generator, one per token.
    """
    distinct_params = {id(seq.params): seq.params for seq in seqs}.values()  # often one per batch
    if not bans and all(greedy_without_extras(params) for params in distinct_params):
        return np.asarray(backend.argmax_rows(logits)).tolist()
    if (
        backend.supports(Capability.DEVICE_SAMPLING)
        and not bans
        and all(device_samplable(p) for p in distinct_params)
    ):
        params = [seq.params for seq in seqs]
        tokens = backend.sample_top_k_top_p(
            logits,
            np.array([p.temperature for p in params], dtype=np.float32),
            np.array([max(p.top_k, 0) for p in params], dtype=np.int32),
            np.array([p.top_p for p in params], dtype=np.float32),
            np.array([seq.rng.random() for seq in seqs], dtype=np.float32),
        )
        return [int(token) for token in np.asarray(tokens)]
    return sample(backend.to_numpy(logits), seqs, bans)
