"""PaddleOCR-VL (`PaddleOCRVLForConditionalGeneration`): a NaViT-style SigLIP vision encoder, a 2x2
merging projector, and an ERNIE-4.5-0.3B-shaped language model with multimodal (3-D) rotary
positions. Registered as a built-in plugin."""
