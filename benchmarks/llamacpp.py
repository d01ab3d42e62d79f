"""llama.cpp as the CPU yardstick: the same SmolLM2-135M weights in llama.cpp and in minengine.

    .venv/bin/python benchmarks/llamacpp.py --build  # once: fetch llama-cpp-python's sdist, cmake (~10 min)
    .venv/bin/python benchmarks/llamacpp.py          # decode, prefill, batched serving, agreement
    .venv/bin/python benchmarks/llamacpp.py --smoke  # minengine's side only, a few tokens (CI)

Why llama.cpp: it is what laptop users run, and its CPU kernels are close to the memory-bandwidth floor,
so "how far from llama.cpp" is the honest measure of a CPU engine. Everything llama.cpp here is built
from the source vendored in PyPI's ``llama-cpp-python`` sdist (its version is printed), with cmake, into
``benchmarks/out/llamacpp/`` -- never into the project's venv: ``llama-bench`` (decode and prefill, its own
timers), ``llama-server`` (batched serving with parallel slots) and ``llama-quantize``, which turns the
packaged Q4_1 file into f16 and f32 files of the *same* weights (``--allow-requantize`` dequantizes).
minengine reads the same Q4_1 file and dequantizes it the same way, so all engines hold equal weights.

Measured, 2 threads each, greedy:

- batch-1 decode step (llama-bench ``tg``; minengine: the median gap between one request's tokens) and a
  512-token prefill (llama-bench ``pp512``; minengine: the prefill step's time), each also as a multiple
  of its own floor: bytes of weights read per step / this machine's read bandwidth (measured here);
- batched serving: 32 requests at once through ``minengine bench`` against ``llama-server`` with 1, 8 and
  32 slots and against ``minengine serve``: output tokens per second;
- agreement: greedy chat answers of llama.cpp f32 and minengine fp32 for 3 prompts.

llama-server rejects nothing we send; it does end streams with ``[DONE]``. llama-cpp-python's own server
(``--python-server``, after ``--build-python``: the wheel built from the same sdist into its own venv,
``benchmarks/out/llamacpp/pyvenv``) is what ``pip install llama-cpp-python[server]`` users run. It
serialises requests behind one lock, so it is a one-at-a-time peer, not a batching one; by default it
also *interrupts* a running stream when the next request arrives (``--interrupt_requests False`` here),
and it ignores ``ignore_eos``, so its answers stop at EOS and tok/s counts the tokens it really sent.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

try:
    from benchmarks import common
except ImportError:  # run as a script
    import common  # type: ignore[no-redef]

OUT = common.ROOT / "benchmarks" / "out" / "llamacpp"
BUILD = OUT / "build"
PYVENV = OUT / "pyvenv"  # llama-cpp-python[server], built from the same sdist, never in the project's venv
SDIST_SPEC = "llama-cpp-python==0.3.36"  # the llama.cpp it vendors is the yardstick; bump deliberately
# the last: batched_yardstick.py
TOOLS = ("llama-bench", "llama-server", "llama-quantize", "llama-batched-bench")
# Not GGML_NATIVE: on a Xeon with AMX, -march=native compiles ggml's AMX matmuls, and here (a VM) their
# first tile load dies with SIGILL in a worker thread (the kernel grants AMX state per process only on
# request). So: the instruction sets this CPU lists in /proc/cpuinfo, AMX off. (Switching all of them on
# regardless died with SIGILL in llama-bench on an AMD EPYC, which has AVX-512 VNNI but not the 256-bit
# AVX-VNNI.) Decode is bandwidth-bound, so AMX costs llama.cpp little there; its prefill may be slower
# than with AMX (torch's bf16 path does use AMX).
GGML_ISA = {"AVX": "avx", "AVX2": "avx2", "FMA": "fma", "F16C": "f16c", "AVX_VNNI": "avx_vnni",
            "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni",
            "AVX512_BF16": "avx512_bf16"}  # ggml's switch -> the /proc/cpuinfo flag it needs


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """cmake switches for ggml's CPU backend on this machine (``cpuinfo``: /proc/cpuinfo's text, read here
    when not given)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["-DGGML_NATIVE=ON"]
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
        have = set(next(line for line in text.splitlines()
                        if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        have = {"avx", "avx2", "fma", "f16c"}  # not Linux: the x86-64 baseline of the last decade
    return ["-DGGML_NATIVE=OFF", *(f"-DGGML_{switch}={'ON' if flag in have else 'OFF'}"
                                   for switch, flag in GGML_ISA.items()),
            "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
MODEL = "smollm2-135m"
# its tied embedding / LM head: the matrix the machine line's kernel choice is for
SMOLLM2_LARGEST = (49152, 576)
CHAT_PROMPTS = ["What is the capital of France?", "Give me three tips for sleeping well.",
                "Explain what a CPU cache is in one paragraph."]


# ------------------------------------------------------------------------------------------- building
def build() -> None:
    """Download the sdist, unpack it, configure and build the tools (idempotent)."""
    OUT.mkdir(parents=True, exist_ok=True)
    sdists = sorted((OUT / "sdist").glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        SDIST_SPEC, "-d", str(OUT / "sdist")], check=True)
        sdists = sorted((OUT / "sdist").glob("llama_cpp_python-*.tar.gz"))
    src = OUT / sdists[-1].name.removesuffix(".tar.gz") / "vendor" / "llama.cpp"
    if not src.exists():
        with tarfile.open(sdists[-1]) as tar:
            tar.extractall(OUT, filter="data")
    # configured every time (seconds): a build configured with other switches is brought up to date
    subprocess.run(["cmake", "-S", str(src), "-B", str(BUILD), "-DCMAKE_BUILD_TYPE=Release", *cpu_flags(),
                    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON"], check=True)
    subprocess.run(["cmake", "--build", str(BUILD), "-j", str(os.cpu_count() or 2), "--target", *TOOLS],
                   check=True)


def build_python_server() -> Path:
    """pip-install llama-cpp-python[server] from the same sdist into its own venv (idempotent, ~10 min)."""
    python = PYVENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PYVENV)], check=True)
    if subprocess.run([str(python), "-c", "import llama_cpp.server"], capture_output=True).returncode != 0:
        sdist = sorted((OUT / "sdist").glob("llama_cpp_python-*.tar.gz"))
        if not sdist:
            build()  # fetches the sdist
            sdist = sorted((OUT / "sdist").glob("llama_cpp_python-*.tar.gz"))
        env = {**os.environ, "CMAKE_ARGS": " ".join([*cpu_flags(), "-DLLAMA_CURL=OFF"]),
               "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
        subprocess.run([str(python), "-m", "pip", "install", f"{sdist[-1]}[server]"], check=True, env=env)
    return python


def tool(name: str) -> Path:
    return BUILD / "bin" / name


def have_tools() -> bool:
    return all(tool(t).exists() for t in TOOLS)


def llamacpp_version() -> str:
    sdists = sorted((OUT / "sdist").glob("llama_cpp_python-*.tar.gz"))
    return sdists[-1].name.removesuffix(".tar.gz").replace("_", "-") if sdists else "?"


def gguf_files() -> dict[str, Path]:
    """q4_1 (the packaged file) and f16/f32 requantized from it (the same weights, dequantized)."""
    from minengine.models.loader import packaged_model_file

    files = {"q4_1": packaged_model_file(MODEL)}
    for kind in ("f16", "f32"):
        out = OUT / f"smollm2-135m-{kind}.gguf"
        if not out.exists():
            subprocess.run([str(tool("llama-quantize")), "--allow-requantize", str(files["q4_1"]), str(out),
                            kind.upper()], check=True, capture_output=True)
        files[kind] = out
    return files


def tensor_bytes(path: Path) -> int:
    """Bytes of all weight tensors in a GGUF file: what one decode step reads (tied LM head counted once)."""
    from gguf import GGUFReader

    return int(sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors))


# ------------------------------------------------------------------------------------------ measuring
def llama_bench(path: Path, threads: int, n_gen: int, reps: int) -> dict[str, float]:
    """llama-bench's own timers: pp512 and tg<n_gen> tokens per second (averaged over ``reps``)."""
    run = subprocess.run([str(tool("llama-bench")), "-m", str(path), "-t", str(threads), "-p", "512",
                          "-n", str(n_gen), "-r", str(reps), "-o", "json"], check=True, capture_output=True,
                         text=True)
    out = {}
    for row in json.loads(run.stdout):
        key = "prefill_tok_s" if row["n_prompt"] else "decode_tok_s"
        out[key] = float(row["avg_ts"])
    return out


def minengine_single(dtype: str, threads: int, n_gen: int, compile_decode: bool = False) -> dict[str, float]:
    """Batch-1 decode (median token gap of one request) and a 512-token prefill, from the engine's stamps.
    ``compile_decode``: the decode steps as one compiled graph (compiled when the engine starts)."""
    import minengine
    from minengine.engine.threads import set_torch_threads

    set_torch_threads(threads)
    llm = minengine.LLM(MODEL, dtype=dtype, enable_prefix_caching=False, max_num_seqs=4,
                        compile_decode=compile_decode)
    tok = llm.get_tokenizer()
    prompt = tok.encode("The history of the city begins with " * 64, add_special_tokens=False)[:512]
    params = minengine.SamplingParams(max_tokens=n_gen, temperature=0.0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompt[:16]}], params, use_tqdm=False)  # warm-up
    tokens = llm.generate([{"prompt_token_ids": prompt[:16]}], params, use_tqdm=False)[0].outputs[0].token_ids
    record = llm.request_records[-1]
    gaps = [b - a for a, b in zip(record.token_times, record.token_times[1:], strict=False)]
    prefills = []
    for _ in range(3):
        llm.generate([{"prompt_token_ids": prompt}], minengine.SamplingParams(max_tokens=1), use_tqdm=False)
        prefills.append(llm.request_records[-1].ttft)
    weights = common.weight_bytes(llm.llm_engine.model)
    out = {"decode_ms": statistics.median(gaps) * 1e3,
           "prefill_tok_s": len(prompt) / statistics.median(prefills), "weight_bytes": weights,
           "tokens": list(tokens)}
    if compile_decode:
        out["compile_seconds"] = llm.llm_engine.model_runner.compiled_decode.compile_seconds
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up")


def serve_and_bench(cmd: list[str], port: int, model: str, requests: Any) -> dict[str, Any]:
    """Start a server, run the 32 requests through ``minengine bench`` at once, stop the server."""
    from minengine.bench.client import benchmark

    url = f"http://127.0.0.1:{port}"
    log = (OUT / f"server-{port}.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_up(url, proc)
        s = benchmark(url, model=model, requests=requests, ignore_eos=True, disable_tqdm=True)
        answers = [_chat(url, model, p) for p in CHAT_PROMPTS]
        return {"output_tok_s": s.output_throughput, "completed": s.completed, "errors": s.errors[:1],
                "notes": s.notes, "tpot_ms": s.tpot.median * 1e3 if s.tpot.count else None,
                "answers": answers}
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


def _chat(url: str, model: str, prompt: str) -> str:
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 32,
            "temperature": 0}
    return httpx.post(url + "/v1/chat/completions", json=body,
                      timeout=120).json()["choices"][0]["message"]["content"]


def batched(files: dict[str, Path], threads: int, n: int, slots: list[int],
            python_server: bool = False) -> dict[str, Any]:
    from minengine.bench.datasets import random_requests
    from minengine.models.loader import load_tokenizer

    requests = random_requests(load_tokenizer(MODEL), n, 128, 64, 0.5, 0, 0)
    out: dict[str, Any] = {}
    for kind in ("f32", "f16"):
        for k in slots:
            port = _free_port()
            cmd = [str(tool("llama-server")), "-m", str(files[kind]), "-t", str(threads), "--parallel",
                   str(k), "-c", str(k * 512), "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
            out[f"llama-server {kind} x{k} slots"] = serve_and_bench(cmd, port, "smollm2", requests)
        if python_server:
            port = _free_port()
            cmd = [str(PYVENV / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(files[kind]),
                   "--model_alias", "smollm2", "--n_threads", str(threads), "--n_ctx", "2048",
                   "--interrupt_requests", "False", "--host", "127.0.0.1", "--port", str(port)]
            out[f"llama-cpp-python {kind}"] = serve_and_bench(cmd, port, "smollm2", requests)
    for dtype in ("float32", "bfloat16"):
        port = _free_port()
        cmd = [sys.executable, "-m", "minengine", "serve", "--model", MODEL, "--dtype", dtype, "--port",
               str(port), "--host", "127.0.0.1", "--threads", str(threads)]
        out[f"minengine {dtype}"] = serve_and_bench(cmd, port, MODEL, requests)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="store_true", help="build llama.cpp's tools first (idempotent)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen", type=int, default=64, help="decode tokens per measurement")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=32, help="requests of the batched workload")
    ap.add_argument("--slots", default="1,8,32", help="llama-server --parallel values")
    ap.add_argument("--skip-batched", action="store_true")
    ap.add_argument("--build-python", action="store_true",
                    help="build llama-cpp-python[server] into benchmarks/out/llamacpp/pyvenv (idempotent)")
    ap.add_argument("--python-server", action="store_true",
                    help="also serve the batched workload with llama-cpp-python's server (one at a time)")
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="skip minengine fp32 with compile_decode=True (it compiles for about a minute "
                         "first)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="minengine fp32 only, 8 tokens (no llama.cpp)")
    args = ap.parse_args(argv)
    from minengine.perf.measure import measure_read_bandwidth

    print(common.machine_line(SMOLLM2_LARGEST))
    if args.build:
        build()
    if args.build_python:
        build_python_server()
    if args.python_server and not (PYVENV / "bin" / "python").exists():
        ap.error(f"--python-server needs llama-cpp-python in {PYVENV}: run with --build-python first")
    bandwidth = measure_read_bandwidth("cpu")
    print(f"read bandwidth: {bandwidth / 1e9:.1f} GB/s")
    results: dict[str, Any] = {"bandwidth_gb_s": bandwidth / 1e9,
                               "machine": common.machine_line(SMOLLM2_LARGEST)}
    dtypes = ["float32"] if args.smoke else ["float32", "bfloat16"]
    for dtype in dtypes:
        r = minengine_single(dtype, args.threads, 8 if args.smoke else args.gen)
        r["floor_ms"] = r["weight_bytes"] / bandwidth * 1e3
        results[f"minengine {dtype}"] = r
    if args.compile and not args.smoke:
        r = minengine_single("float32", args.threads, args.gen, compile_decode=True)
        r["floor_ms"] = r["weight_bytes"] / bandwidth * 1e3
        results["minengine float32 compiled"] = r
        print("compiled decode: same greedy tokens as eager fp32:",
              r["tokens"] == results["minengine float32"]["tokens"])
    if not args.smoke:
        if not have_tools():
            print(f"llama.cpp tools missing under {BUILD}: run with --build (it takes minutes)",
                  file=sys.stderr)
        else:
            results["llama.cpp"] = llamacpp_version()
            for kind, path in gguf_files().items():
                r = llama_bench(path, args.threads, args.gen, args.reps)
                r["decode_ms"] = 1e3 / r["decode_tok_s"]
                r["weight_bytes"] = tensor_bytes(path)
                r["floor_ms"] = r["weight_bytes"] / bandwidth * 1e3
                results[f"llama.cpp {kind}"] = r
            if not args.skip_batched:
                results["batched"] = batched(gguf_files(), args.threads, args.requests,
                                             [int(x) for x in args.slots.split(",")], args.python_server)
    print(f"\n{'engine':22s} {'decode ms':>10s} {'x floor':>8s} {'prefill tok/s':>14s} {'MB/step':>8s}")
    for key, r in results.items():
        if isinstance(r, dict) and "decode_ms" in r:
            print(f"{key:22s} {r['decode_ms']:10.2f} {r['decode_ms'] / r['floor_ms']:8.2f} "
                  f"{r['prefill_tok_s']:14.0f} {r['weight_bytes'] / 1e6:8.1f}")
    ref = results.get("llama.cpp f32")
    for key in ("minengine float32", "minengine float32 compiled"):
        if ref and key in results:
            print(f"{key} / llama.cpp f32 decode: {results[key]['decode_ms'] / ref['decode_ms']:.2f}x")
    for key, r in results.get("batched", {}).items():
        print(f"{key:30s} {r['output_tok_s']:7.1f} output tok/s  ({r['completed']} done, errors "
              f"{r['errors']})")
    if "batched" in results:
        a = results["batched"].get("llama-server f32 x1 slots", {}).get("answers")
        b = results["batched"].get("minengine float32", {}).get("answers")
        if a and b:
            same = sum(x == y for x, y in zip(a, b, strict=True))
            print(f"greedy chat answers, llama.cpp f32 vs minengine fp32: {same} of {len(a)} identical")
            results["agreement"] = same
    common.save_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
