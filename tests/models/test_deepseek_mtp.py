"""DeepSeek-V3's multi-token-prediction layer as the "mtp" speculative proposer.

Its drafts are checked against an independent float reference: the MTP module's equations from
the DeepSeek-V3 paper written here in torch (enorm / hnorm / eh_proj / shared head), around
transformers' own DeepSeek-V3 decoder layer holding the MTP block's weights, fed by
transformers' final hidden states of the main model. Greedy output is the same with and
without MTP, and the acceptance counts reach the request metrics and the engine totals.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tiny_deepseek as deepseek

from fastdeploy import LLM, SamplingParams
from fastdeploy.backends.cuda.backend import CudaBackend
from fastdeploy.errors import InvalidArgumentError, UnsupportedModelError

# the cuda backend's Triton kernels run on the host in Triton's interpreter, which `triton.jit`
# reads when the kernel modules are imported (triton's own: before transformers imports it)
os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch", reason="the reference MTP module runs in torch")
modeling = pytest.importorskip(
    "transformers.models.deepseek_v3.modeling_deepseek_v3", reason="the reference layers are transformers'"
)

NAME = "v3"
K = 3


class ReferenceMTP:
    """The MTP module of the DeepSeek-V3 paper (section 2.2) at depth 1, in float32."""

    def __init__(self, directory: str, weights: dict[str, np.ndarray]) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        self.main = AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.float32, attn_implementation="eager"
        )
        self.main.eval()
        config = AutoConfig.from_pretrained(directory)
        config._attn_implementation = "eager"
        index = config.num_hidden_layers
        prefix = f"model.layers.{index}."
        own = {k[len(prefix) :]: torch.from_numpy(v) for k, v in weights.items() if k.startswith(prefix)}
        self.layer = modeling.DeepseekV3DecoderLayer(config, index)
        state = {
            k: v
            for k, v in own.items()
            if k.split(".")[0] in ("self_attn", "input_layernorm", "post_attention_layernorm")
        }
        state.update({k: v for k, v in own.items() if k.startswith(("mlp.gate.", "mlp.shared_experts."))})
        experts = range(config.n_routed_experts)
        state["mlp.experts.gate_up_proj"] = torch.stack(
            [
                torch.cat([own[f"mlp.experts.{e}.gate_proj.weight"], own[f"mlp.experts.{e}.up_proj.weight"]])
                for e in experts
            ]
        )
        state["mlp.experts.down_proj"] = torch.stack(
            [own[f"mlp.experts.{e}.down_proj.weight"] for e in experts]
        )
        self.layer.load_state_dict(state, strict=True)
        self.layer.eval()
        self.rotary = modeling.DeepseekV3RotaryEmbedding(config)
        self.eps = config.rms_norm_eps
        self.own = own

    def _norm(self, x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def drafts(self, tokens: list[int], k: int) -> list[int]:
        """k drafts after `tokens`: position i takes (h_i, t_{i+1}) for i <= n-2 with h the main
        model's final hidden states; further positions take the MTP's own output and its draft."""
        own = self.own
        with torch.no_grad():
            hidden = self.main.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]  # h_0..h_{n-2}
            priors, nexts, out = list(hidden), list(tokens[1:]), []
            for _ in range(k):
                length = len(nexts)
                embedded = self._norm(own["embed_tokens.weight"][torch.tensor(nexts)], own["enorm.weight"])
                prior = self._norm(torch.stack(priors), own["hnorm.weight"])
                x = torch.cat([embedded, prior], dim=-1) @ own["eh_proj.weight"].T
                positions = torch.arange(length)[None]
                mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
                y = self.layer(
                    x[None],
                    attention_mask=mask,
                    position_ids=positions,
                    position_embeddings=self.rotary(x[None], positions),
                )[0]
                logits = self._norm(y[-1], own["shared_head.norm.weight"]) @ own["shared_head.head.weight"].T
                draft = int(torch.argmax(logits))
                out.append(draft)
                priors.append(y[-1])
                nexts.append(draft)
        return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[str, dict[str, np.ndarray]]:
    directory = tmp_path_factory.mktemp("v3-mtp")
    return str(directory), deepseek.write_checkpoint(directory, NAME)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, checkpoint) -> ReferenceMTP:
    directory = tmp_path_factory.mktemp("v3-hf")
    deepseek.write_checkpoint(directory, NAME, mtp=False)
    return ReferenceMTP(str(directory), checkpoint[1])


def _recording(llm: LLM) -> list[tuple[list[int], list[int]]]:
    """Every (sequence tokens, drafts) the MTP proposer hands out, as it runs."""
    proposer = llm.llm_engine.spec_decoder.proposer
    real = proposer.propose
    calls: list[tuple[list[int], list[int]]] = []

    def propose(seqs, lengths):
        proposals = real(seqs, lengths)
        calls.extend((list(s.token_ids), list(p.token_ids)) for s, p in zip(seqs, proposals, strict=True))
        return proposals

    proposer.propose = propose
    return calls


def test_mtp_drafts_equal_the_reference_module_and_greedy_output_is_unchanged(checkpoint, reference):
    params = SamplingParams(temperature=0, max_tokens=deepseek.NEW_TOKENS, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in deepseek.PROMPTS]
    plain = LLM(model=checkpoint[0], max_model_len=deepseek.MAX_MODEL_LEN)
    expected = [o.outputs.token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    llm = LLM(
        model=checkpoint[0],
        max_model_len=deepseek.MAX_MODEL_LEN,
        speculative_config={"method": "mtp", "num_speculative_tokens": K},
    )
    calls = _recording(llm)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs.token_ids for o in outputs] == expected
    assert calls, "the MTP proposer never drafted"
    assert max(len(d) for _, d in calls) == K
    for tokens, drafts in calls:
        assert drafts, tokens
        assert drafts == reference.drafts(tokens, len(drafts)), tokens
    stats = llm.llm_engine.spec_decoder.stats
    assert stats.num_draft_tokens == sum(len(d) for _, d in calls)
    assert 0 <= stats.num_accepted_tokens <= stats.num_draft_tokens
    # each request reports its own share, as with the other proposers
    assert sum(o.metrics.spec_num_draft_tokens for o in outputs) == stats.num_draft_tokens
    assert sum(o.metrics.spec_num_accepted_tokens for o in outputs) == stats.num_accepted_tokens
    # again: the long prompt's blocks come from the prefix cache, so the MTP layer never gets the
    # target's hidden states there (zeros stand in); drafts may differ, the output may not
    (again,) = llm.generate([prompts[2]], params, use_tqdm=False)
    assert again.num_cached_tokens > 0
    assert again.outputs.token_ids == expected[2]


@pytest.fixture(scope="module")
def transformers_tokens(tmp_path_factory) -> list[list[int]]:
    directory = tmp_path_factory.mktemp("v3-hf-greedy")
    deepseek.write_checkpoint(directory, NAME, mtp=False)
    return deepseek.transformers_greedy(directory, deepseek.PROMPTS)


@pytest.mark.parametrize(
    ("device", "kernels", "count", "new_tokens"),
    [
        ("torch-cpu", "reference", len(deepseek.PROMPTS), deepseek.NEW_TOKENS),
        # the interpreted Triton kernels take seconds a step: two prompts, a few tokens
        ("torch-cpu", "triton", 2, 5),
        pytest.param("cuda", "triton", len(deepseek.PROMPTS), deepseek.NEW_TOKENS, marks=pytest.mark.gpu),
    ],
)
def test_mtp_on_the_cuda_backends_code_keeps_transformers_tokens(
    device, kernels, count, new_tokens, checkpoint, reference, transformers_tokens, monkeypatch
):
    """MTP on the cuda backend's code: the verify passes attend over the target's latent cache,
    the MTP layer over its own; drafts still equal the reference module's and the output
    transformers'."""
    if device == "cuda":
        reason = CudaBackend.unavailable_reason()
        if reason is not None:
            pytest.skip(f"no usable NVIDIA GPU: {reason}")
    if kernels == "triton":
        pytest.importorskip("triton", reason="the Triton kernels need triton (the test extra installs it)")
    monkeypatch.setenv("FD_CUDA_KERNELS", kernels)
    llm = LLM(
        model=checkpoint[0],
        device=device,
        dtype="float32",
        max_model_len=deepseek.MAX_MODEL_LEN,
        speculative_config={"method": "mtp", "num_speculative_tokens": K},
    )
    calls = _recording(llm)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in deepseek.PROMPTS[:count]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs.token_ids for o in outputs] == [t[:new_tokens] for t in transformers_tokens[:count]]
    assert calls, "the MTP proposer never drafted"
    for tokens, drafts in calls:
        assert drafts == reference.drafts(tokens, len(drafts)), tokens
    assert llm.llm_engine.spec_decoder.stats.num_draft_tokens == sum(len(d) for _, d in calls)


def test_mtp_on_a_checkpoint_without_mtp_layers_is_refused(tmp_path):
    deepseek.write_checkpoint(tmp_path, "v2lite")
    with pytest.raises(UnsupportedModelError, match="num_nextn_predict_layers"):
        LLM(
            model=str(tmp_path),
            max_model_len=32,
            speculative_config={"method": "mtp", "num_speculative_tokens": 2},
        )


def test_mtp_on_a_model_without_mtp_layers_is_refused():
    with pytest.raises(InvalidArgumentError, match="multi-token-prediction"):
        LLM(max_model_len=64, speculative_config={"method": "mtp", "num_speculative_tokens": 2})
