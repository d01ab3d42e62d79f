"""The shipped model: complete HF folder, small, loads offline, matches transformers, writes English."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

import minengine
from minengine.models import AttentionMetadata, allocate_kv_cache

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "minengine" / "assets" / minengine.DEFAULT_MODEL
sys.path.insert(0, str(ROOT / "scripts"))

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def model():
    return minengine.load_model()  # the default is the shipped model, offline


@pytest.fixture(scope="module")
def tokenizer():
    return minengine.load_tokenizer()


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()


def test_folder_is_a_complete_small_hf_checkpoint():
    for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", "README.md"]:
        assert (MODEL_DIR / name).is_file(), name
    total = sum(p.stat().st_size for p in MODEL_DIR.rglob("*") if p.is_file())
    assert total <= 20 * 1024 * 1024, f"shipped model is {total / 2**20:.1f} MiB"

    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]  # GQA
    assert cfg["max_position_embeddings"] >= 1024
    assert 1_000 <= cfg["vocab_size"] <= 8_000
    tok_cfg = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == "<|endoftext|>" and "<|assistant|>" in tok_cfg["chat_template"]


def test_model_card_states_corpus_command_time_and_perplexity():
    card = (MODEL_DIR / "README.md").read_text()
    stats = json.loads((MODEL_DIR / "training_stats.json").read_text())
    assert "scripts/train_tiny_model.py" in card and "story_corpus.py" in card
    assert f"{stats['heldout_perplexity']}" in card and f"{stats['train_minutes']} minutes" in card
    assert 1.0 < stats["heldout_perplexity"] < 10.0
    assert 2e6 <= stats["num_parameters"] <= 10e6


def test_tokenizer_has_chat_template_and_eos(tokenizer, model):
    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.eos_token_id in model.config.eos_token_ids
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Tell me a story."}],
                                         tokenize=False, add_generation_prompt=True)
    assert text == "<|user|>\nTell me a story.\n<|assistant|>\n"
    # byte-level BPE: any text round-trips, including characters it never saw in training
    sample = "Zoë paid 5€ — naïve café!"
    assert tokenizer.decode(tokenizer.encode(sample)) == sample


def test_logits_match_transformers(model, hf_model, tokenizer):
    ids = tokenizer.encode("Once upon a time, there was a little fox named Max. He lived near the sea.")
    with torch.no_grad():
        ours = model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)),
                                          AttentionMetadata.for_prefill([len(ids)])))
        ref = hf_model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


def greedy(model, prompt: list[int], max_new_tokens: int, block_size: int = 16) -> list[int]:
    """Prefill once, then one-token decode steps through the paged KV cache (no stopping at EOS)."""
    cfg = model.config
    n_blocks = (len(prompt) + max_new_tokens) // block_size + 1
    caches = allocate_kv_cache(cfg.num_hidden_layers, n_blocks, block_size, cfg.num_key_value_heads,
                               cfg.head_dim, model.dtype)
    table = list(range(n_blocks))[::-1]  # deliberately not in order
    tokens, new = list(prompt), list(prompt)
    out: list[int] = []
    with torch.no_grad():
        while len(out) < max_new_tokens:
            meta = AttentionMetadata.build([len(new)], [len(tokens)], [table], block_size)
            hidden = model(torch.tensor(new), meta.positions(), meta, caches)
            next_id = int(model.compute_logits(hidden[meta.last_token_indices()]).argmax(-1))
            out.append(next_id)
            tokens.append(next_id)
            new = [next_id]
    return out


def test_greedy_generation_matches_hf_generate_for_64_tokens(model, hf_model, tokenizer):
    for prompt in ["Once upon a time, there was a",
                   "<|user|>\nTell me a story about a cat.\n<|assistant|>\n"]:
        ids = tokenizer.encode(prompt)
        ours = greedy(model, ids, 64)
        ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=64, min_new_tokens=64, do_sample=False,
                                pad_token_id=tokenizer.eos_token_id)[0, len(ids):].tolist()
        assert ours == ref
        assert len(set(ours)) >= 16, "the continuation should be varied text, not a loop"


def _english_vocabulary() -> set[str]:
    from story_corpus import generate_corpus

    return {w.lower() for doc in generate_corpus(3000, seed=99) for w in re.findall(r"[A-Za-z']+", doc)}


@pytest.mark.parametrize("sampled", [False, True])
def test_continuations_read_as_english_sentences(model, hf_model, tokenizer, sampled):
    torch.manual_seed(0)
    ids = tokenizer("One day, a curious little", return_tensors="pt").input_ids
    out = hf_model.generate(ids, max_new_tokens=120, do_sample=sampled, temperature=0.8, top_p=0.95,
                            pad_token_id=tokenizer.eos_token_id)
    text = tokenizer.decode(out[0], skip_special_tokens=True)
    words = [w.lower() for w in re.findall(r"[A-Za-z']+", text)]
    known = _english_vocabulary()
    assert len(words) >= 40, text
    assert sum(w in known for w in words) / len(words) >= 0.95, text
    assert len(re.findall(r"[a-z][.!?]", text)) >= 3, f"expected several sentences: {text}"
    assert len(set(words)) >= 25, text
