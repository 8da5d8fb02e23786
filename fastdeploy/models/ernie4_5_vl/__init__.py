"""ERNIE-4.5-VL (`Ernie4_5_VLMoeForConditionalGeneration`): vision tower, resampler, and the MoE text
model with modality-routed experts and 3-D rotary positions. Registered as a built-in plugin."""
