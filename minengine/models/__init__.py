"""Models: config, paged attention, the Llama-family decoder, the loader, and the GGUF reader."""

from minengine.models.attention import AttentionMetadata, KVCache, allocate_kv_cache, paged_attention
from minengine.models.config import SUPPORTED_ARCHITECTURES, ModelConfig
from minengine.models.errors import (
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedModelError,
    WeightMismatchError,
)
from minengine.models.llama import LlamaForCausalLM
from minengine.models.loader import (
    DEFAULT_MODEL,
    list_shipped_models,
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
    resolve_model_path,
)
from minengine.models.packaged import PACKAGED_MODELS, ModelPackageMissingError

__all__ = [
    "DEFAULT_MODEL",
    "PACKAGED_MODELS",
    "SUPPORTED_ARCHITECTURES",
    "AttentionMetadata",
    "KVCache",
    "LlamaForCausalLM",
    "ModelConfig",
    "ModelLoadError",
    "ModelNotFoundError",
    "ModelPackageMissingError",
    "UnsupportedModelError",
    "WeightMismatchError",
    "allocate_kv_cache",
    "list_shipped_models",
    "load_model",
    "load_tokenizer",
    "paged_attention",
    "resolve_device",
    "resolve_dtype",
    "resolve_model_path",
]
