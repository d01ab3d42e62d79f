"""``minengine generate "prompt"``: stream one completion to the terminal, then show its timing.

Text goes to stdout as each token arrives (flushed every time, so you see the pause before the first
token -- TTFT -- and then the stream -- ITL); the timing line goes to stderr so that
``minengine generate ... > story.txt`` keeps the file clean:

    TTFT 9.8 ms | mean ITL 3.1 ms | 64 tokens in 0.21 s = 304.8 tok/s (decode 323.2 tok/s)

By default the model runs in this process (``AsyncLLM``); with ``--base-url`` the same request goes to
a running OpenAI-compatible server and is timed from the client's side of the wire.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from minengine.cli.serve import add_backend_flags, backend_options
from minengine.cli.validators import positive_int


def add_generate_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="stream a completion to the terminal, then print TTFT, ITL and tokens/s",
        description='Stream tokens as they are generated. Example: minengine generate "Once upon a time" '
        "--max-tokens 64 --seed 1",
    )
    parser.add_argument("prompt", help="the prompt text (with --chat: the user message)")
    parser.add_argument(
        "--model",
        default=None,
        help="smollm2-135m, tinystories-4m, an HF folder or hub id (default: smollm2-135m when installed)",
    )
    parser.add_argument("--max-tokens", type=positive_int, default=128)
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 = greedy (default: the model's generation_config.json, else 1)",
    )
    parser.add_argument("--top-p", type=float, default=None, help="default: generation_config.json, else 1")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    parser.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    parser.add_argument("--device", default=None, help="cpu, cuda, mps (default: best available)")
    add_backend_flags(parser)
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--compile-decode", action="store_true",
                        help="CPU: run decode steps as one torch.compile'd graph (compiles first, ~1 min)")
    parser.add_argument("--speculative", choices=["ngram"], default=None,
                        help="speculative decoding: draft by n-gram lookup in the prompt and output, verify "
                             "in the decode steps (the output stays what it would be without)")
    parser.add_argument("--num-speculative-tokens", type=positive_int, default=3, help="drafts per step")
    parser.add_argument("--prompt-lookup-max", type=positive_int, default=None,
                        help="longest n-gram to match (default 5, as vLLM)")
    parser.add_argument("--prompt-lookup-min", type=positive_int, default=None,
                        help="shortest n-gram to match (default: --prompt-lookup-max)")
    parser.add_argument("--base-url", default=None, help="stream from this OpenAI-compatible server instead")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="for --base-url")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    if not args.prompt:
        return _fail("the prompt is empty")
    if args.temperature is not None and args.temperature < 0:
        return _fail(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        return _fail(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.speculative and args.base_url:
        return _fail("--speculative runs in this process's engine; a server decides its own (drop one)")
    try:
        if args.base_url:
            record = asyncio.run(_stream_remote(args))
        else:
            record = asyncio.run(_stream_local(args))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except Exception as e:  # model not found, bad option, server error: one line, no traceback
        from minengine.models.errors import ModelLoadError

        if isinstance(e, (ModelLoadError, ValueError, TypeError, RuntimeError, OSError)):
            return _fail(str(e))
        raise
    print(file=sys.stderr)
    print(timing_line(record), file=sys.stderr)
    return 0


def timing_line(record: Any) -> str:
    """TTFT, mean ITL and throughput of one request, from its RequestRecord."""
    n = record.num_output_tokens or len(record.token_times)
    if not record.token_times:
        return "no tokens were generated"
    itls = record.itls
    e2e = record.e2e or 0.0
    line = f"TTFT {1000 * record.ttft:.1f} ms"
    line += f" | mean ITL {1000 * sum(itls) / len(itls):.1f} ms" if itls else " | mean ITL n/a"
    line += f" | {n} tokens in {e2e:.2f} s = {n / e2e:.1f} tok/s" if e2e > 0 else f" | {n} tokens"
    decode = record.token_times[-1] - record.token_times[0]
    if n > 1 and decode > 0:
        line += f" (decode {(n - 1) / decode:.1f} tok/s)"
    drafted = getattr(record, "num_draft_tokens", 0)
    if drafted:
        accepted = record.num_accepted_tokens
        line += f" | drafts accepted {accepted}/{drafted} ({100 * accepted / drafted:.0f} %)"
    return line


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()  # one token at a time, or the terminal shows the stream in lumps


async def _stream_local(args: argparse.Namespace) -> Any:
    import torch

    from minengine.core.sampling_params import RequestOutputKind, SamplingParams
    from minengine.engine.async_llm import AsyncLLM

    if args.threads:
        torch.set_num_threads(args.threads)
    options: dict[str, Any] = {"device": args.device} if args.device else {}
    if args.compile_decode:
        options["compile_decode"] = True
    if args.speculative:
        options["speculative_config"] = {"method": args.speculative,
                                         "num_speculative_tokens": args.num_speculative_tokens,
                                         "prompt_lookup_max": args.prompt_lookup_max,
                                         "prompt_lookup_min": args.prompt_lookup_min}
    options |= backend_options(args)
    from minengine.models.loader import cli_default_model

    model = args.model or cli_default_model()
    print(f"loading {model} ...", file=sys.stderr, flush=True)
    llm = AsyncLLM(model=model, **options)
    try:
        engine = llm.engine
        print(f"minengine: {engine.runtime.describe()}", file=sys.stderr, flush=True)
        defaults = generation_defaults(getattr(engine.model, "model_path", None))
        params = SamplingParams(
            temperature=args.temperature
            if args.temperature is not None
            else defaults.get("temperature", 1.0),
            top_p=args.top_p if args.top_p is not None else defaults.get("top_p", 1.0),
            max_tokens=args.max_tokens,
            seed=args.seed,
            ignore_eos=args.ignore_eos,
            output_kind=RequestOutputKind.DELTA,  # the terminal prints each piece as it comes
        )
        prompt: Any = args.prompt
        if args.chat:
            tokenizer = engine.tokenizer
            if tokenizer is None or not getattr(tokenizer, "chat_template", None):
                raise ValueError("this model has no chat template; drop --chat")
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": args.prompt}], tokenize=False, add_generation_prompt=True
            )
            prompt = {"prompt_token_ids": list(tokenizer.encode(text, add_special_tokens=False))}
        record = None
        async for out in llm.generate(prompt, params):
            _write(out.outputs[0].delta_text)
            record = out.record
        return record
    finally:
        await llm.shutdown()


async def _stream_remote(args: argparse.Namespace) -> Any:
    import httpx

    from minengine.bench.client import build_payload, first_model, normalize_base_url, stream_request

    base = normalize_base_url(args.base_url)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        model = args.model or await first_model(client, base, headers)
        endpoint = "chat" if args.chat else "completions"
        extra = {"seed": args.seed} if args.seed is not None else {}
        if args.top_p is not None:
            extra["top_p"] = args.top_p
        payload = build_payload(
            endpoint,
            model,
            args.prompt,
            args.max_tokens,
            ignore_eos=args.ignore_eos,
            temperature=args.temperature,
            extra_body=extra,
        )
        path = "/v1/chat/completions" if args.chat else "/v1/completions"
        result = await stream_request(client, base + path, payload, headers=headers, on_text=_write)
    if result.error:
        raise RuntimeError(result.error)
    return result.record


def generation_defaults(model_path: str | Path | None) -> dict[str, float]:
    """temperature / top_p from the model's generation_config.json (what the model's authors suggest)."""
    if model_path is None:
        return {}
    try:
        config = json.loads((Path(model_path) / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(config[k]) for k in ("temperature", "top_p") if isinstance(config.get(k), (int, float))}


def _fail(message: str) -> int:
    print(f"minengine generate: error: {message}", file=sys.stderr)
    return 2

