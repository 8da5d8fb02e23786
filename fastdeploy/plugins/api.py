"""The public surface for plugin authors: everything a third-party package may import from fastdeploy.

A plugin (a model architecture, a weight or tokenizer loader, a reasoning or tool-call parser, a
device backend) imports fastdeploy names from this module only, as pytest plugins import from
`pytest` and not `_pytest`. The built-in models and the example packages under `plugins/` follow
the same rule, and `tests/plugins/test_public_api.py` fails when one of them reaches past it.
Anything not listed in `__all__` is internal and may change without notice; docs/plugins.md
documents every name here with its shapes.

The names are defined where the engine uses them and re-exported here: this module is an index
and defines nothing itself.
"""

from fastdeploy.backends.base import Backend
from fastdeploy.backends.capabilities import Capability
from fastdeploy.backends.conformance import (
    ALL_CHECKS,
    CAPABILITY_CHECKS,
    OP_CHECKS,
    PLATFORM_CHECKS,
    build_backend,
)
from fastdeploy.backends.fused import AttentionBlock, MLPBlock
from fastdeploy.backends.fused import attention_block as lora_attention_block
from fastdeploy.backends.fused import mlp_block as lora_mlp_block
from fastdeploy.backends.lora import LayerLoRA, LoRAStack
from fastdeploy.backends.ops import DeviceOps
from fastdeploy.backends.platform import Platform
from fastdeploy.backends.types import (
    BackendOptions,
    BatchLayout,
    GroupedBatch,
    KVCacheSpec,
    PendingTokens,
    layer_batch,
)
from fastdeploy.config import ModelConfig
from fastdeploy.entrypoints.backend_conformance import check_greedy_generation
from fastdeploy.errors import (
    DistributedInitError,
    EngineDeadError,
    InvalidArgumentError,
    PluginError,
    UnsupportedModelError,
    WeightLoadError,
)
from fastdeploy.formats.ggml_tensor import GGMLTensor
from fastdeploy.formats.mxfp4 import mxfp4_experts_to_ggml
from fastdeploy.formats.weight_only import WeightOnlyTensor
from fastdeploy.input.multimodal.errors import MediaError
from fastdeploy.input.multimodal.inputs import MultiModalItem, MultiModalPrompt
from fastdeploy.input.multimodal.media import MediaPolicy, load_image, load_video
from fastdeploy.input.multimodal.options import ProcessorOptions
from fastdeploy.input.tokenizer import Tokenizer, TokenizerLoader, require_text
from fastdeploy.kv_layout import KVLayout
from fastdeploy.logger import get_logger
from fastdeploy.model_executor.loaders.base import WeightLoader
from fastdeploy.model_executor.loaders.safetensors_loader import SafetensorsLoader
from fastdeploy.model_executor.rope import interleaved_to_half_rows, rope_tables
from fastdeploy.models.base import (
    CausalLM,
    KVCacheGroup,
    LoRAProjection,
    check_weight_names,
    check_weight_shapes,
)
from fastdeploy.parallel.communicator import Communicator, RendezvousInfo
from fastdeploy.parallel.kv_transfer import KVOffer, KVReceiver, KVTransport, TransferError, TransferResult
from fastdeploy.parallel.model_parallel import ModelParallel
from fastdeploy.parallel.sharding import take_columns, take_head_rows, take_rows
from fastdeploy.plugins.hookspecs import hookimpl
from fastdeploy.reasoning.base import ReasoningParser, ReasoningSplit
from fastdeploy.reasoning.tool_calls import ToolCallExtraction, tool_call
from fastdeploy.text_utils import partial_suffix_length
from fastdeploy.tool_calling.json_scan import CallDraft, scan_call
from fastdeploy.tool_calling.parser import ParsedAnswer, ToolCallParser

__all__ = [
    # registering
    "hookimpl",
    # device backends
    "Backend",
    "Platform",
    "DeviceOps",
    "Capability",
    "BackendOptions",
    "BatchLayout",
    "KVCacheSpec",
    "PendingTokens",
    "AttentionBlock",
    "MLPBlock",
    "LayerLoRA",
    "LoRAStack",
    "lora_attention_block",
    "lora_mlp_block",
    # models
    "CausalLM",
    "GroupedBatch",
    "KVCacheGroup",
    "LoRAProjection",
    "ModelConfig",
    "check_weight_names",
    "check_weight_shapes",
    "interleaved_to_half_rows",
    "layer_batch",
    "rope_tables",
    # parallelism: a model's shard, and the collectives a device plugin implements
    "ModelParallel",
    "take_columns",
    "take_head_rows",
    "take_rows",
    "Communicator",
    "RendezvousInfo",
    # prefill/decode disaggregation: the KV transport a device plugin may supply
    "KVTransport",
    "KVReceiver",
    "KVOffer",
    "KVLayout",
    "TransferError",
    "TransferResult",
    # checkpoints
    "GGMLTensor",
    "mxfp4_experts_to_ggml",
    "SafetensorsLoader",
    "WeightLoader",
    "WeightOnlyTensor",
    # tokenizers
    "Tokenizer",
    "TokenizerLoader",
    "require_text",
    # multimodal processors (hook fastdeploy_multimodal_processors)
    "MediaError",
    "MediaPolicy",
    "MultiModalItem",
    "MultiModalPrompt",
    "ProcessorOptions",
    "load_image",
    "load_video",
    # parsers
    "ReasoningParser",
    "ReasoningSplit",
    "ToolCallExtraction",
    "ToolCallParser",
    "ParsedAnswer",
    "CallDraft",
    "scan_call",
    "partial_suffix_length",
    "tool_call",
    # errors and logging
    "DistributedInitError",
    "EngineDeadError",
    "InvalidArgumentError",
    "PluginError",
    "UnsupportedModelError",
    "WeightLoadError",
    "get_logger",
    # conformance
    "ALL_CHECKS",
    "PLATFORM_CHECKS",
    "OP_CHECKS",
    "CAPABILITY_CHECKS",
    "build_backend",
    "check_greedy_generation",
]
