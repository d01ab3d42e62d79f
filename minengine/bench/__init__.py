"""The load-test client (``minengine bench``), usable from notebooks:

    from minengine.bench import run_benchmark
    summary = await run_benchmark("http://127.0.0.1:8000", num_prompts=50, request_rate=4, ignore_eos=True)

It returns a ``RunSummary`` (``minengine.metrics``) like the engine's own runs, so client-side and
engine-side numbers share one table and one set of plots. Names load lazily, so ``minengine --help``
does not import httpx.
"""

from __future__ import annotations

from minengine._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        [
            "BenchmarkSummary",
            "StreamResult",
            "arrival_offsets",
            "benchmark",
            "build_payload",
            "chunk_text",
            "iter_sse_json",
            "run_benchmark",
            "save_result",
            "stream_request",
        ],
        "minengine.bench.client",
    ),
    **dict.fromkeys(["SampleRequest", "jsonl_requests", "random_requests"], "minengine.bench.datasets"),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
