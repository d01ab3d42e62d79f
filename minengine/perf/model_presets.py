"""Offline model presets for the KV-cache calculator.

Each preset is the part of the model's public Hugging Face ``config.json`` that the KV cache and the
weights depend on, copied key for key, so a preset goes through the same parser as a downloaded file.
``num_params`` is the total parameter count (from the model card / safetensors metadata; for the dense
models it also equals what ``kvcalc.estimate_num_params`` computes from the config, and a test checks
that). Hub ids are given so ``--model meta-llama/Llama-3.1-8B`` resolves offline.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-2-7b-hf config.json; 6,738,415,616 params. This is the seeds' "7B, 32 layers,
    # hidden 4096" model: MHA, so the seeds' hidden-size formula is exact for it.
    "llama-2-7b": {
        "hf_id": "meta-llama/Llama-2-7b-hf",
        "num_params": 6_738_415_616,
        "config": {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
                   "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
                   "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "float16"},
    },
    # meta-llama/Llama-2-13b-hf config.json; 13,015,864,320 params.
    "llama-2-13b": {
        "hf_id": "meta-llama/Llama-2-13b-hf",
        "num_params": 13_015_864_320,
        "config": {"model_type": "llama", "num_hidden_layers": 40, "hidden_size": 5120,
                   "intermediate_size": 13824, "num_attention_heads": 40, "num_key_value_heads": 40,
                   "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "float16"},
    },
    # meta-llama/Llama-2-70b-hf config.json (GQA, 8 KV heads); 68,976,648,192 params.
    "llama-2-70b": {
        "hf_id": "meta-llama/Llama-2-70b-hf",
        "num_params": 68_976_648_192,
        "config": {"model_type": "llama", "num_hidden_layers": 80, "hidden_size": 8192,
                   "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
                   "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "float16"},
    },
    # meta-llama/Llama-3.1-8B config.json; 8,030,261,248 params. 128 KiB of bf16 KV per token.
    "llama-3.1-8b": {
        "hf_id": "meta-llama/Llama-3.1-8B",
        "num_params": 8_030_261_248,
        "config": {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
                   "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
                   "torch_dtype": "bfloat16"},
    },
    # meta-llama/Llama-3.1-70B config.json; 70,553,706,496 params.
    "llama-3.1-70b": {
        "hf_id": "meta-llama/Llama-3.1-70B",
        "num_params": 70_553_706_496,
        "config": {"model_type": "llama", "num_hidden_layers": 80, "hidden_size": 8192,
                   "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
                   "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"},
    },
    # meta-llama/Llama-3.1-405B config.json; 405,853,388,800 params.
    "llama-3.1-405b": {
        "hf_id": "meta-llama/Llama-3.1-405B",
        "num_params": 405_853_388_800,
        "config": {"model_type": "llama", "num_hidden_layers": 126, "hidden_size": 16384,
                   "intermediate_size": 53248, "num_attention_heads": 128, "num_key_value_heads": 8,
                   "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"},
    },
    # mistralai/Mistral-7B-v0.1 config.json: every layer uses a 4,096-token sliding window (the Mistral 7B
    # paper's SWA); 7,241,732,096 params.
    "mistral-7b": {
        "hf_id": "mistralai/Mistral-7B-v0.1",
        "num_params": 7_241_732_096,
        "config": {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
                   "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096,
                   "torch_dtype": "bfloat16"},
    },
    # mistralai/Mistral-7B-v0.3 config.json: the window was dropped (sliding_window null); vocab 32768;
    # 7,248,023,552 params.
    "mistral-7b-v0.3": {
        "hf_id": "mistralai/Mistral-7B-v0.3",
        "num_params": 7_248_023_552,
        "config": {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
                   "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "vocab_size": 32768, "max_position_embeddings": 32768, "sliding_window": None,
                   "torch_dtype": "bfloat16"},
    },
    # mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts, top-2; KV like Mistral-7B without the window;
    # 46,702,792,704 params (all experts are resident, so all count for memory).
    "mixtral-8x7b": {
        "hf_id": "mistralai/Mixtral-8x7B-v0.1",
        "num_params": 46_702_792_704,
        "config": {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
                   "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                   "max_position_embeddings": 32768, "sliding_window": None, "torch_dtype": "bfloat16"},
    },
    # Qwen/Qwen2.5-7B config.json: 4 KV heads (GQA 7:1), qkv bias; sliding_window is present but
    # use_sliding_window is false, so every layer is full attention; 7,615,616,512 params.
    "qwen2.5-7b": {
        "hf_id": "Qwen/Qwen2.5-7B",
        "num_params": 7_615_616_512,
        "config": {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
                   "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
                   "vocab_size": 152064, "max_position_embeddings": 131072, "sliding_window": 131072,
                   "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": False,
                   "torch_dtype": "bfloat16"},
    },
    # Qwen/Qwen2.5-72B config.json; 72,706,203,648 params.
    "qwen2.5-72b": {
        "hf_id": "Qwen/Qwen2.5-72B",
        "num_params": 72_706_203_648,
        "config": {"model_type": "qwen2", "num_hidden_layers": 80, "hidden_size": 8192,
                   "intermediate_size": 29568, "num_attention_heads": 64, "num_key_value_heads": 8,
                   "vocab_size": 152064, "max_position_embeddings": 131072, "sliding_window": 131072,
                   "use_sliding_window": False, "max_window_layers": 80, "tie_word_embeddings": False,
                   "torch_dtype": "bfloat16"},
    },
    # Qwen/Qwen3-8B config.json: explicit head_dim 128, q/k RMSNorm; 8,190,735,360 params.
    "qwen3-8b": {
        "hf_id": "Qwen/Qwen3-8B",
        "num_params": 8_190_735_360,
        "config": {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096,
                   "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
                   "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": False,
                   "torch_dtype": "bfloat16"},
    },
    # google/gemma-2-9b config.json: head_dim 256 (not hidden/heads = 224); layers alternate a 4,096-token
    # sliding window (even layers) and full attention; embeddings tied; 9,241,705,984 params. The file
    # says torch_dtype float32 but servers run it in bf16 (see kvcalc.weight_dtype_of).
    "gemma-2-9b": {
        "hf_id": "google/gemma-2-9b",
        "num_params": 9_241_705_984,
        "config": {"model_type": "gemma2", "num_hidden_layers": 42, "hidden_size": 3584,
                   "intermediate_size": 14336, "num_attention_heads": 16, "num_key_value_heads": 8,
                   "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
                   "sliding_window": 4096, "tie_word_embeddings": True, "torch_dtype": "float32"},
    },
    # google/gemma-3-27b-it config.json (text_config): 5 sliding layers (1,024-token window) per full
    # layer, head_dim 128 (hidden/heads would be 168). ~27.4 B params including the ~0.4 B SigLIP vision
    # encoder that is loaded with it (HF model page).
    "gemma-3-27b": {
        "hf_id": "google/gemma-3-27b-it",
        "num_params": 27_400_000_000,
        "config": {"model_type": "gemma3", "torch_dtype": "bfloat16",
                   "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 62, "hidden_size": 5376,
                                   "intermediate_size": 21504, "num_attention_heads": 32,
                                   "num_key_value_heads": 16, "head_dim": 128, "vocab_size": 262208,
                                   "max_position_embeddings": 131072, "sliding_window": 1024,
                                   "sliding_window_pattern": 6}},
    },
    # deepseek-ai/DeepSeek-V3 config.json: MLA caches one 512-dim latent + a 64-dim decoupled RoPE key per
    # token and layer (576 values, no K/V pair, shared by all 128 heads). 671,026,404,352 params: the
    # technical report's "671B", counted from this config with transformers' DeepseekV3 on the meta device
    # (the hub files add a 14 B multi-token-prediction module); weights stored in fp8 (e4m3). MoE: 256
    # routed experts (8 per token) and 1 shared, 2,048 wide, in all but the first 3 (dense) layers.
    "deepseek-v3": {
        "hf_id": "deepseek-ai/DeepSeek-V3",
        "num_params": 671_026_404_352,
        "config": {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
                   "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512,
                   "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "q_lora_rank": 1536,
                   "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
                   "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "intermediate_size": 18432,
                   "vocab_size": 129280, "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
                   "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                           "weight_block_size": [128, 128]}},
    },
    # microsoft/Phi-3-mini-4k-instruct config.json: MHA (32 KV heads); its config sets a 2,047-token
    # sliding window on every layer; 3,821,079,552 params.
    "phi-3-mini": {
        "hf_id": "microsoft/Phi-3-mini-4k-instruct",
        "num_params": 3_821_079_552,
        "config": {"model_type": "phi3", "num_hidden_layers": 32, "hidden_size": 3072,
                   "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 32,
                   "vocab_size": 32064, "max_position_embeddings": 4096, "sliding_window": 2047,
                   "torch_dtype": "bfloat16"},
    },
}
