"""Built-in weight loaders (GGUF files, safetensors directories, ERNIE -Paddle directories, ERNIE-4.5-VL,
Qwen2.5-VL and PaddleOCR-VL directories), registered as a plugin."""

from fastdeploy.model_executor.loaders.base import WeightLoader
from fastdeploy.model_executor.loaders.ernie4_5_vl import Ernie4_5_VLLoader
from fastdeploy.model_executor.loaders.gguf_loader import GGUFLoader
from fastdeploy.model_executor.loaders.paddle_ernie import PaddleErnieLoader
from fastdeploy.model_executor.loaders.paddleocr_vl import PaddleOCRVLLoader
from fastdeploy.model_executor.loaders.qwen2_5_vl import Qwen2_5_VLLoader
from fastdeploy.model_executor.loaders.safetensors_loader import SafetensorsLoader
from fastdeploy.plugins.hookspecs import hookimpl


@hookimpl
def fastdeploy_weight_loaders() -> list[WeightLoader]:
    return [
        GGUFLoader(),
        Ernie4_5_VLLoader(),
        Qwen2_5_VLLoader(),
        PaddleOCRVLLoader(),
        PaddleErnieLoader(),
        SafetensorsLoader(),
    ]


__all__ = [
    "Ernie4_5_VLLoader",
    "GGUFLoader",
    "PaddleErnieLoader",
    "PaddleOCRVLLoader",
    "Qwen2_5_VLLoader",
    "SafetensorsLoader",
    "WeightLoader",
]
