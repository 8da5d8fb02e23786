"""Writes tests/fixtures/rope_reference.json: transformers' rotary inverse frequencies per `rope_scaling`.

The engine computes its own rotary tables (fastdeploy/model_executor/rope.py); this fixture
holds transformers' values for the same configurations so the test needs no torch. Regenerate:

    HF_HUB_OFFLINE=1 /work/refenv/bin/python tools/make_rope_reference.py
"""

from __future__ import annotations

import json
import os

import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "rope_reference.json")
BASE = {"hidden_size": 512, "num_attention_heads": 8, "max_position_embeddings": 8192}
_LONGROPE = {
    "rope_type": "longrope",
    "factor": 4.0,
    "original_max_position_embeddings": 2048,
    "short_factor": [1.0 + 0.05 * i for i in range(32)],
    "long_factor": [1.0 + 0.9 * i for i in range(32)],
}
CASES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
    "yarn_betas": {
        "rope_type": "yarn",
        "factor": 2.0,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "original_max_position_embeddings": 4096,
    },
    # DeepSeek-style: the attention factor is the ratio of two mscales
    "yarn_mscale": {
        "rope_type": "yarn",
        "factor": 40.0,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    },
    "yarn_untruncated": {
        "rope_type": "yarn",
        "factor": 4.0,
        "truncate": False,
        "original_max_position_embeddings": 2048,
    },
    "longrope_short": _LONGROPE,
    "longrope_long": _LONGROPE,
}
#: the context the engine runs a case with, where it decides the frequencies (LongRoPE: long
#: factors beyond original_max_position_embeddings); transformers gets it as `seq_len`
ENGINE_POSITIONS = {"longrope_short": 2048, "longrope_long": 8192}


def main() -> None:
    cases = {}
    for name, scaling in CASES.items():
        theta = 500000.0
        config = LlamaConfig(**BASE, rope_parameters={"rope_theta": theta, **scaling})
        engine_positions = ENGINE_POSITIONS.get(name)
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](
            config, "cpu", seq_len=engine_positions
        )
        cases[name] = {
            "rope_theta": theta,
            "head_dim": BASE["hidden_size"] // BASE["num_attention_heads"],
            "max_position_embeddings": BASE["max_position_embeddings"],
            "engine_max_positions": engine_positions or BASE["max_position_embeddings"],
            "rope_scaling": scaling,
            "inv_freq": [float(x) for x in inv_freq.double().tolist()],
            "attention_factor": float(attention_factor),
        }
    meta = {"generator": "tools/make_rope_reference.py", "transformers_version": transformers.__version__}
    with open(OUT, "w", encoding="utf-8") as handle:
        json.dump({"metadata": meta, "cases": cases}, handle, indent=1)


if __name__ == "__main__":
    main()
