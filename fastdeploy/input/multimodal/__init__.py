"""Multimodal input: decoding images and videos, turning them into vision-encoder patches, and
expanding their placeholders in the prompt (see docs/multimodal.md)."""
