"""Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`): windowed vision tower, patch merger, and the
Qwen2 language model with multimodal (3-D) rotary positions. Registered as a built-in plugin."""
