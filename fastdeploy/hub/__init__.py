"""Model ids (`org/name`, `org/name:QUANT`) downloaded from a model hub into its local cache:
Hugging Face through `huggingface_hub`, ModelScope and AIStudio through their SDKs
(`FD_MODEL_SOURCE`)."""
