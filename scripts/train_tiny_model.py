"""Train the course's shipped model from scratch: corpus -> byte-level BPE tokenizer -> small Llama.

    .venv/bin/python scripts/train_tiny_model.py              # the shipped model (~25 min on 2 cores)
    .venv/bin/python scripts/train_tiny_model.py --quick      # a 1-minute smoke run into scripts/out/

Everything is seeded and offline: the stories come from scripts/story_corpus.py, the tokenizer is
trained with Hugging Face `tokenizers`, and the model is transformers' own LlamaForCausalLM so the
saved folder is a plain Hugging Face checkpoint that any tool can load (and that minengine's own model
code must reproduce logit for logit).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm import tqdm
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from story_corpus import generate_corpus  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|system|>", "<|user|>", "<|assistant|>"]
# Each turn is "<|role|>\n<content>\n"; an assistant turn ends with the EOS token, which is also what
# the model emits when a story is finished. Matches the format of the chat documents in the corpus.
CHAT_TEMPLATE = (
    # Newlines are written as Jinja string literals: transformers renders with trim_blocks, which would
    # eat a raw newline after a {% ... %} tag.
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ '<|endoftext|>' }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE like GPT-2/Llama-3: no unknown tokens, any UTF-8 text round-trips."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=EOS,
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def pack(token_lists: list[list[int]], seq_len: int) -> torch.Tensor:
    """Concatenate documents (each already ends in EOS) and cut into [n, seq_len + 1] windows."""
    flat = [t for ids in token_lists for t in ids]
    n = (len(flat) - 1) // seq_len
    data = torch.tensor(flat[: n * seq_len + 1], dtype=torch.long)
    return torch.stack([data[i * seq_len : (i + 1) * seq_len + 1] for i in range(n)])


@torch.no_grad()
def perplexity(model: LlamaForCausalLM, windows: torch.Tensor, batch_size: int) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size]
        out = model(input_ids=batch, labels=batch)  # HF shifts labels by one inside
        n = batch[:, 1:].numel()
        total += out.loss.item() * n
        count += n
    model.train()
    return math.exp(total / count)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "minengine" / "assets" / "tinystories-4m")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--num-docs", type=int, default=60_000)
    ap.add_argument("--num-val-docs", type=int, default=1_000)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--hidden-size", type=int, default=256)
    ap.add_argument("--intermediate-size", type=int, default=768)
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--num-heads", type=int, default=8)
    ap.add_argument("--num-kv-heads", type=int, default=2)
    ap.add_argument("--max-position-embeddings", type=int, default=2048)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=450)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run into scripts/out/quick")
    args = ap.parse_args(argv)
    if args.quick:
        args.out = ROOT / "scripts" / "out" / "quick"
        args.num_docs, args.num_val_docs, args.steps, args.warmup = 2000, 100, 30, 5
    if args.threads:
        torch.set_num_threads(args.threads)

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    started = time.perf_counter()

    print(f"Generating {args.num_docs} training stories and {args.num_val_docs} held-out ones ...")
    train_docs = generate_corpus(args.num_docs, seed=args.seed)
    val_docs = generate_corpus(args.num_val_docs, seed=args.seed + 1)  # different seed: unseen stories

    print(f"Training a byte-level BPE tokenizer (vocab {args.vocab_size}) ...")
    tokenizer = train_tokenizer(train_docs, args.vocab_size)
    encode = tokenizer(train_docs, add_special_tokens=False)["input_ids"]
    train = pack(encode, args.seq_len)
    val = pack(tokenizer(val_docs, add_special_tokens=False)["input_ids"], args.seq_len)
    num_train_tokens = train[:, :-1].numel()
    print(f"{num_train_tokens:,} training tokens in {len(train)} windows of {args.seq_len}; {len(val)} val "
          "windows")

    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        head_dim=args.hidden_size // args.num_heads,
        max_position_embeddings=args.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        initializer_range=0.02,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"Model: {num_params / 1e6:.2f}M parameters")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to 10%
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(args.seed)
    model.train()
    bar = tqdm(range(args.steps), desc="train", unit="step")
    ema = None
    for step in bar:
        idx = torch.randint(len(train), (args.batch_size,), generator=gen)
        batch = train[idx]
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr_at(step):.1e}")
    train_minutes = (time.perf_counter() - started) / 60

    val_ppl = perplexity(model, val, args.batch_size)
    print(f"Held-out perplexity: {val_ppl:.2f}  (total time {train_minutes:.1f} min)")

    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    # transformers 5 writes the template to chat_template.jinja; older tools read it from the config.
    tok_cfg_path = args.out / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text())
    tok_cfg["chat_template"] = CHAT_TEMPLATE
    tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
    GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
                     do_sample=True, temperature=0.8, top_p=0.95,
                     max_new_tokens=256).save_pretrained(args.out)

    model.eval()
    samples = []
    for prompt in ["Once upon a time, there was a little", "Tom and his dog went to the"]:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=60, do_sample=False)
        samples.append(("greedy", prompt, tokenizer.decode(out[0], skip_special_tokens=True)))
    torch.manual_seed(args.seed)
    ids = tokenizer("One day, a curious", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=60, do_sample=True, temperature=0.8, top_p=0.95)
    samples.append(("sampled (T=0.8, top-p 0.95)", "One day, a curious",
                    tokenizer.decode(out[0], skip_special_tokens=True)))
    for kind, _, text in samples:
        print(f"[{kind}] {text}")

    stats = {
        "num_parameters": num_params,
        "train_tokens": num_train_tokens,
        "tokens_seen": args.steps * args.batch_size * args.seq_len,
        "heldout_perplexity": round(val_ppl, 3),
        "train_minutes": round(train_minutes, 1),
        "machine": (f"{platform.machine()}, {torch.get_num_threads()} torch threads, "
                    f"torch {torch.__version__}"),
        "command": ("python scripts/train_tiny_model.py "
                    + " ".join(argv if argv is not None else sys.argv[1:])),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"},
    }
    (args.out / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    (args.out / "README.md").write_text(model_card(stats, config, samples))
    print(f"Saved to {args.out}")


def model_card(stats: dict, config: LlamaConfig, samples: list[tuple[str, str, str]]) -> str:
    sample_text = "\n".join(f"- *{kind}*, prompt `{prompt}`:\n  > {text}" for kind, prompt, text in samples)
    return f"""---
license: apache-2.0
language: en
library_name: transformers
pipeline_tag: text-generation
---
# tinystories-4m — the minengine course model

A {stats['num_parameters'] / 1e6:.1f}M-parameter Llama-architecture model that writes simple English
children's stories. It ships inside the `minengine` package so every lesson, lab and test of the course
runs offline on a laptop CPU. It is a teaching model: it knows nothing but its little story world.

## Architecture

| | |
|---|---|
| architecture | `LlamaForCausalLM` (RoPE, RMSNorm, SwiGLU MLP, tied embeddings) |
| layers | {config.num_hidden_layers} |
| hidden size / MLP size | {config.hidden_size} / {config.intermediate_size} |
| attention | GQA: {config.num_attention_heads} query heads share {config.num_key_value_heads} KV heads, \
head_dim {config.head_dim} |
| context | {config.max_position_embeddings} positions (trained on windows of {stats['args']['seq_len']} \
tokens) |
| vocabulary | {config.vocab_size} byte-level BPE tokens (trained with `tokenizers`) |
| weights | float32 safetensors |

KV cache per token: 2 × {config.num_hidden_layers} layers × {config.num_key_value_heads} KV heads ×
{config.head_dim} × 4 bytes = \
{2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4:,} bytes in fp32.

## Training data

Synthetic stories written by `scripts/story_corpus.py` (a seeded grammar: characters, places, small
problems, dialogue and a lesson learned), about 30% of them wrapped as chat turns
(`<|user|>` asks for a story, `<|assistant|>` tells it). No external data: the corpus, and so the
weights, are the project's own (Apache-2.0).

## Training

`{stats['command']}` — {stats['tokens_seen']:,} tokens seen (less than one pass over a
{stats['train_tokens']:,}-token corpus),
AdamW, cosine schedule, seed {stats['args']['seed']}; took {stats['train_minutes']} minutes on
{stats['machine']}.

## Evaluation

Held-out perplexity on {stats['args']['num_val_docs']} stories generated with another seed:
**{stats['heldout_perplexity']}**. It is this low because the stories come from a grammar: once the
model knows the templates, only the names, places and objects are left to guess.

## Samples

{sample_text}

## Chat format

`<|system|>` (optional), `<|user|>` and `<|assistant|>` turns, each followed by a newline; an assistant
turn ends with `<|endoftext|>`, which is also the EOS token. Use `tokenizer.apply_chat_template`.

## Limits

Tiny vocabulary of ideas, repeats story patterns, no facts about the real world. Use it to measure
inference, not to answer questions.
"""


if __name__ == "__main__":
    main()
