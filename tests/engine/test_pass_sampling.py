"""The engine's side of passes that sample themselves: which batches may, the uniforms each
sequence draws, and how the one host copy of (token, broken) lands."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy.backends.conformance import numpy_reference
from fastdeploy.backends.types import PendingTokens
from fastdeploy.engine.fault_isolation import NonFiniteLogitsError
from fastdeploy.engine.pass_sampling import landed_tokens, pass_sampling
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.sequence import Sequence
from fastdeploy.model_executor.batch import ScheduledBatch


def sequence(seq_id: int, params: SamplingParams, seed: int) -> Sequence:
    return Sequence(seq_id, str(seq_id), 0, [1, 2, 3], params, 8, np.random.default_rng([seed, 0]), 0.0)


def batch_of(*params: SamplingParams) -> ScheduledBatch:
    batch = ScheduledBatch()
    for index, p in enumerate(params):
        batch.add(sequence(index, p, 100 + index), 1)
    return batch


GREEDY = SamplingParams(temperature=0)
DRAWN = SamplingParams(temperature=0.5, top_k=-1, top_p=0.9)


def test_only_batches_whose_every_row_needs_nothing_from_the_host_sample_in_the_pass():
    assert pass_sampling(batch_of(GREEDY, DRAWN), False) is not None
    for host_bound in (
        SamplingParams(temperature=0.5, repetition_penalty=1.2),
        SamplingParams(temperature=0.5, min_p=0.1),
        SamplingParams(temperature=0, logprobs=2),
        SamplingParams(temperature=0, min_tokens=2),
        SamplingParams(temperature=0, bad_words=["x"]),
    ):
        assert pass_sampling(batch_of(GREEDY, host_bound), False) is None, host_bound
    reasoning = SamplingParams(temperature=0, reasoning_max_tokens=4)
    assert pass_sampling(batch_of(reasoning), False) is not None
    assert pass_sampling(batch_of(reasoning), True) is None  # a forced end of thinking
    drafted = batch_of(GREEDY)
    drafted.drafts[0] = [5]
    assert pass_sampling(drafted, False) is None
    assert pass_sampling(ScheduledBatch(), False) is None


def test_rows_carry_each_setting_and_draw_one_uniform_per_drawn_sequence():
    batch = batch_of(GREEDY, DRAWN, SamplingParams(temperature=1.5, top_k=7))
    sampling = pass_sampling(batch, False)
    rows = sampling.rows([0, 1, 2])
    assert rows.greedy.tolist() == [True, False, False]
    assert rows.temperature.tolist() == [0.0, 0.5, 1.5]
    assert rows.top_k.tolist() == [0, 0, 7]
    assert rows.top_p.tolist() == pytest.approx([1.0, 0.9, 1.0])
    assert rows.kernel_temperature.tolist() == [1.0, 0.5, 1.5]
    # each drawn sequence's first uniform from its own generator; the greedy one draws none
    expected = [np.float32(np.random.default_rng([seed, 0]).random()) for seed in (101, 102)]
    assert rows.uniform.tolist() == [0.0, *expected]
    assert batch.seqs[0].rng.random() == np.random.default_rng([100, 0]).random()  # not advanced


class HostBackend:
    """The three backend calls `landed_tokens` makes, on host arrays."""

    def gather_rows(self, x, indices):
        return x[indices]

    def from_numpy(self, array):
        return array

    def sample_top_k_top_p(self, logits, temperatures, top_k, top_p, uniforms):
        return np.array(
            [
                numpy_reference.sample_top_k_top_p(row, t, k, p, u)
                for row, t, k, p, u in zip(logits, temperatures, top_k, top_p, uniforms, strict=True)
            ]
        )


def landed(ids, broken, logits):
    sampling = pass_sampling(batch_of(GREEDY, DRAWN), False)
    sampling.rows([0, 1])
    sampling.tokens = PendingTokens(None, lambda: (np.array(ids, np.int64), np.array(broken)))
    return landed_tokens(HostBackend(), logits, sampling), sampling


def test_landed_tokens_are_the_copy_and_a_row_the_kernel_left_is_finished_on_the_host():
    logits = np.zeros((2, 4), np.float32)
    assert landed([3, 1], [False, False], logits)[0] == [3, 1]
    # row 1 came back -1: a flat row of 4 tokens at top-p 0.9 keeps all 4; inverse CDF in
    # vocabulary order picks the token whose cumulative share passes the row's uniform
    tokens, sampling = landed([3, -1], [False, False], logits)
    uniform = float(sampling.drawn.uniform[1])
    assert tokens == [3, int(uniform * 4)]


def test_broken_rows_fail_the_pass_with_their_rows():
    with pytest.raises(NonFiniteLogitsError) as error:
        landed([3, 1], [False, True], np.zeros((2, 4), np.float32))
    assert error.value.rows == [1]
