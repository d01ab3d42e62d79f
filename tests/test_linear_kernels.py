"""The Linear layers' library on a CPU (``models/linear_kernels.py``): switching keeps parameters, tied
weights and the state dict; oneDNN gives F.linear's results; the rule that picks it; training still works;
and the engine's greedy tokens are the same with either library (and oneDNN on prepacked weights) on
three model families."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
import torch.nn.functional as F

from minengine.config import EngineConfig
from minengine.core.sampling_params import SamplingParams
from minengine.engine.llm import LLM
from minengine.models import linear_kernels
from minengine.models.loader import build_random_model

pytestmark = pytest.mark.skipif(not linear_kernels.onednn_available(), reason="this torch has no oneDNN")
CFG = dict(architectures=["LlamaForCausalLM"], vocab_size=64, hidden_size=32, intermediate_size=64,
           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
           tie_word_embeddings=True)


def test_apply_swaps_the_class_and_keeps_every_parameter() -> None:
    model = build_random_model(CFG, device="cpu", dtype=torch.float32, seed=0, std=0.2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = {id(p) for p in model.parameters()}
    assert linear_kernels.apply(model, "onednn") == 9  # 2 layers x (qkv, o, gate_up, down) + lm_head
    assert all(isinstance(m, linear_kernels.KernelLinear) for m in model.modules()
               if isinstance(m, torch.nn.Linear))
    assert {id(p) for p in model.parameters()} == ids
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert model.lm_head.one_row == model.lm_head.many_rows == "onednn"
    assert linear_kernels.apply(model, "torch") == 9 and model.lm_head.many_rows == "torch"
    with pytest.raises(ValueError, match="unknown linear kernel"):
        linear_kernels.apply(model, "blas")


@pytest.mark.parametrize("rows", [1, 7, 130])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("one_row", ["onednn", "gemv"])
def test_kernels_give_f_linear_results(rows: int, bias: bool, one_row: str) -> None:
    from minengine.models import cpu_kernels

    assert cpu_kernels.load(), cpu_kernels.build_error()
    layer = torch.nn.Linear(100, 40, bias=bias)  # 100: not a multiple of the GEMV's 16- and 64-float steps
    x = torch.randn(rows, 100)
    expected = F.linear(x, layer.weight, layer.bias)
    linear_kernels.apply(layer, one_row, "onednn")
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
        if rows == 1:  # the GEMV keeps any leading shape
            torch.testing.assert_close(layer(x.view(1, 1, 100)), expected.view(1, 1, 40), rtol=1e-5,
                                       atol=1e-5)


@pytest.mark.parametrize("rows", [7, 130])
def test_prepacked_weights_give_f_linear_results_and_follow_the_weight(rows: int) -> None:
    """oneDNN's packed copy gives F.linear's results; a weight changed in place (load_state_dict) is
    repacked before the next call, and another matrix passed to ``run`` is used as it is, not the pack."""
    layer = torch.nn.Linear(100, 40, bias=True)
    x = torch.randn(rows, 100)
    linear_kernels.apply(layer, "torch", "onednn", prepack=True)
    assert layer.packed is not None and layer.packed.is_mkldnn  # oneDNN's opaque blocked layout
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    first_pack = layer.packed
    new = {"weight": torch.randn(40, 100), "bias": torch.randn(40)}
    layer.load_state_dict(new)  # copies in place: the same Parameter, a newer version
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), F.linear(x, new["weight"], new["bias"]), rtol=1e-5, atol=1e-5)
        assert layer.packed is not first_pack
        rows_of = layer.weight[:8]  # e.g. an LM head over some vocabulary rows
        torch.testing.assert_close(layer.run(x, rows_of, None), F.linear(x, rows_of), rtol=1e-5, atol=1e-5)
    linear_kernels.apply(layer, "torch", "onednn")  # applied again without: the copy is dropped
    assert layer.packed is None
    with pytest.raises(ValueError, match="oneDNN for many rows"):
        linear_kernels.apply(layer, "torch", "torch", prepack=True)


def test_gemv_rejects_what_it_cannot_do() -> None:
    from minengine.models import cpu_kernels

    cpu_kernels.load()
    with pytest.raises(RuntimeError, match="float32 only"):
        torch.ops.minengine.gemv(torch.randn(1, 8).double(), torch.randn(4, 8).double(), None)
    with pytest.raises(RuntimeError, match="one row"):
        torch.ops.minengine.gemv(torch.randn(2, 8), torch.randn(4, 8), None)


def test_training_falls_back_to_f_linear() -> None:
    layer = torch.nn.Linear(16, 8)
    linear_kernels.apply(layer, "onednn")
    x = torch.randn(3, 16, requires_grad=True)
    layer(x).sum().backward()  # the oneDNN op has no backward: the layer must not call it here
    assert layer.weight.grad is not None and x.grad is not None


def test_the_rule_switches_only_for_a_clear_win() -> None:
    many = linear_kernels.MANY_ROWS

    def times(onednn: tuple[float, float], gemv: float | None = None) -> dict[str, float]:
        """Each kernel's speed-up over F.linear (whose time is 1) at one row and at many."""
        t = {"torch@1": 1.0, f"torch@{many}": 1.0, "onednn@1": 1 / onednn[0], f"onednn@{many}": 1 / onednn[1]}
        if gemv is not None:
            t["gemv@1"] = 1 / gemv
        return t

    amd = linear_kernels.decide(times((2.2, 1.6), 2.6))  # AMD EPYC, measured
    assert (amd.one_row, amd.many_rows) == ("gemv", "onednn")
    tie = linear_kernels.decide(times((1.05, 1.0), 1.1))  # nothing clearly faster: keep the default
    assert (tie.one_row, tie.many_rows, tie.kernel) == ("torch", "torch", "torch")
    split = linear_kernels.decide(times((2.0, 0.8)))  # faster GEMV, slower prefill
    assert (split.one_row, split.many_rows) == ("onednn", "torch")
    choice = linear_kernels.choose(build_random_model(CFG, device="cpu", dtype=torch.float32, seed=0))
    assert choice.one_row in linear_kernels.ONE_ROW_KERNELS and choice.many_rows in linear_kernels.KERNELS
    assert {"torch@1", "onednn@1", "gemv@1", f"torch@{many}", f"onednn@{many}"} == set(choice.times)
    assert "linear layers:" in choice.describe()
    assert linear_kernels.choose(
        build_random_model(CFG, device="cpu", dtype=torch.bfloat16, seed=0)).kernel == "torch"



def test_kernels_are_timed_in_turn_and_keep_their_fastest_round() -> None:
    """A burst of load over several consecutive calls must not decide the choice (it once made the GEMV
    look barely faster than F.linear, and the choice is kept for the machine): the kernels take turns,
    round by round, in reverse order every other round, and each keeps its fastest round."""
    clock, order = [0.0], []
    cost = {"a": 1.0, "b": 2.0, "c": 3.0}

    def call(name: str) -> None:
        order.append(name)
        timed = len(order) - len(cost)  # after the warm-up calls
        clock[0] += cost[name] * (10 if 1 <= timed <= 5 else 1)  # a burst over five calls in a row

    calls = {name: (lambda n=name: call(n)) for name in cost}
    best = linear_kernels._fastest_times(calls, rounds=4, clock=lambda: clock[0])
    assert best == cost
    assert order == ["a", "b", "c"] + ["a", "b", "c", "c", "b", "a"] * 2


def test_timings_are_measured_once_per_machine(tmp_path, monkeypatch) -> None:
    """The timings go into a file beside the kernels' build; a later process (here: a cleared cache)
    decides from the file without timing anything; a damaged file is timed again."""
    from minengine.models import cpu_kernels

    if not cpu_kernels.load():
        pytest.skip(f"the CPU kernels are not built here: {cpu_kernels.build_error()}")
    path = tmp_path / cpu_kernels.TIMINGS_FILE
    monkeypatch.setattr(linear_kernels, "_timings_paths", lambda: [path])
    shape = (384, 96)
    try:
        linear_kernels._choose_for.cache_clear()
        first = linear_kernels._choose_for(shape, 1)
        assert json.loads(path.read_text()) == {"384x96@1": first.times}
        timed: list[int] = []

        def fake_timing(calls, rounds: int = 7) -> dict[str, float]:  # noqa: ANN001
            timed.append(1)
            return dict.fromkeys(calls, 1.0)

        monkeypatch.setattr(linear_kernels, "_fastest_times", fake_timing)
        linear_kernels._choose_for.cache_clear()
        assert linear_kernels._choose_for(shape, 1) == first and not timed  # read back, not re-timed
        linear_kernels._choose_for.cache_clear()
        other = linear_kernels._choose_for(shape, 2)  # another thread count is timed on its own
        assert timed and (other.one_row, other.many_rows) == ("torch", "torch")
        assert set(json.loads(path.read_text())) == {"384x96@1", "384x96@2"}
        path.write_text("{not json")
        timed.clear()
        linear_kernels._choose_for.cache_clear()
        assert linear_kernels._choose_for(shape, 1).times == {k: 1.0 for k in first.times} and timed
    finally:
        linear_kernels._choose_for.cache_clear()


def test_a_user_who_cannot_write_beside_the_build_keeps_timings_in_their_cache(tmp_path, monkeypatch) -> None:
    """A hub's students load the administrator's build: what they time goes to their own cache and is
    read back from there; timings beside the build, where there are some, come first."""
    from minengine.models import cpu_kernels

    if not cpu_kernels.load():
        pytest.skip(f"the CPU kernels are not built here: {cpu_kernels.build_error()}")
    build = tmp_path / "venv" / "share" / "minengine" / "kernels" / "minengine_cpu_kernels_abc"
    build.mkdir(parents=True)
    monkeypatch.delenv(cpu_kernels.ENV_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(cpu_kernels, "build_folder", lambda: build)
    beside = build / cpu_kernels.TIMINGS_FILE
    mine = tmp_path / "xdg" / "minengine" / "kernels" / build.name / cpu_kernels.TIMINGS_FILE
    assert linear_kernels._timings_paths() == [beside, mine]
    real_access = os.access
    monkeypatch.setattr(os, "access",
                        lambda p, mode: real_access(p, mode) and not str(p).startswith(str(build)))
    shape = (384, 96)
    try:
        linear_kernels._choose_for.cache_clear()
        first = linear_kernels._choose_for(shape, 1)
        assert not beside.exists() and json.loads(mine.read_text()) == {"384x96@1": first.times}
        monkeypatch.setattr(linear_kernels, "_fastest_times",
                            lambda calls, rounds=7: pytest.fail("timed again"))
        linear_kernels._choose_for.cache_clear()
        assert linear_kernels._choose_for(shape, 1) == first  # the next process reads the user's file
        shared = {k: 2.0 for k in first.times}
        beside.write_text(json.dumps({"384x96@1": shared}))  # the administrator timed this shape too
        linear_kernels._choose_for.cache_clear()
        assert linear_kernels._choose_for(shape, 1).times == shared
    finally:
        linear_kernels._choose_for.cache_clear()
    monkeypatch.setenv(cpu_kernels.ENV_DIR, str(build.parent))  # one named folder: nothing else is used
    assert linear_kernels._timings_paths() == [beside]


def test_config_checks_the_name() -> None:
    with pytest.raises(ValueError, match="linear_kernel"):
        EngineConfig(linear_kernel="mkl")
    with pytest.raises(ValueError, match="prepack_weights must be"):
        EngineConfig(prepack_weights="yes")
    with pytest.raises(ValueError, match="cannot go with linear_kernel='torch'"):
        EngineConfig(prepack_weights=True, linear_kernel="torch")


def test_prepacking_by_default_only_where_the_copy_fits(hf_model_dir, monkeypatch) -> None:
    """The default packs unless the copy would take over a quarter of the available memory (a hub's pod);
    True insists regardless."""
    model = build_random_model(CFG, device="cpu", dtype=torch.float32, seed=0)
    need = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.Linear)
               and m is not model.lm_head) + model.lm_head.weight.numel() * 4  # the tied matrix once
    assert linear_kernels.prepack_fits(model, available=4 * need) == (True, "")
    fits, why = linear_kernels.prepack_fits(model, available=4 * need - 4)
    assert not fits and "more than a quarter" in why
    monkeypatch.setattr(linear_kernels, "_available_memory", lambda: 1 << 10)  # 1 KiB left
    small = LLM(hf_model_dir("llama"), linear_kernel="onednn", max_model_len=64)
    choice = small.llm_engine.linear_kernel
    assert not choice.prepacked and "weights not prepacked" in choice.describe()
    assert small.llm_engine.model.lm_head.packed is None
    insisted = LLM(hf_model_dir("llama"), linear_kernel="onednn", prepack_weights=True, max_model_len=64)
    assert (insisted.llm_engine.linear_kernel.prepacked
            and insisted.llm_engine.model.lm_head.packed is not None)


def test_available_memory_counts_a_cgroup_limit(tmp_path) -> None:
    """A hub pod's limit is in its memory cgroup, not in /proc/meminfo (which shows the whole node)."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n")
    assert linear_kernels._available_memory(str(tmp_path)) == 32 << 30  # no cgroup files: the node's
    v2 = tmp_path / "sys/fs/cgroup"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text(str(1 << 30))
    assert linear_kernels._available_memory(str(tmp_path)) == 32 << 30  # unlimited
    (v2 / "memory.max").write_text(str(2 << 30))
    assert linear_kernels._available_memory(str(tmp_path)) == 1 << 30  # 2 GiB limit, 1 GiB used
    (v2 / "memory.max").unlink()
    v1 = v2 / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text(str(4 << 30))
    (v1 / "memory.usage_in_bytes").write_text(str(3 << 30))
    assert linear_kernels._available_memory(str(tmp_path)) == 1 << 30
    assert linear_kernels._available_memory(str(tmp_path / "nowhere")) is None


def test_prepacking_is_refused_where_it_cannot_run(hf_model_dir) -> None:
    with pytest.raises(ValueError, match="prepack_weights=True is for fp32 on a CPU"):
        LLM(hf_model_dir("llama"), dtype="bfloat16", prepack_weights=True, max_model_len=64)
    bf16 = LLM(hf_model_dir("llama"), dtype="bfloat16", max_model_len=64)  # None: nothing to pack, no error
    assert not bf16.llm_engine.linear_kernel.prepacked
    assert getattr(bf16.llm_engine.model.lm_head, "packed", None) is None


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3"])
def test_engine_tokens_are_the_same_with_either_library(hf_model_dir, torch_one_thread, family: str) -> None:
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 512) for _ in range(4 + 9 * i)] for i in range(5)]
    common = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = {}
    for kernel, prepack in [("torch", None), ("onednn", None), ("onednn", False)]:
        llm = LLM(hf_model_dir(family), linear_kernel=kernel, prepack_weights=prepack, **common)
        choice = llm.llm_engine.linear_kernel
        assert choice.kernel == kernel and choice.prepacked == (kernel == "onednn" and prepack is None)
        lm_head = llm.llm_engine.model.lm_head
        assert (lm_head.packed is not None) == choice.prepacked
        outs[kernel, prepack] = [o.outputs[0].token_ids
                                 for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outs["onednn", None] == outs["onednn", False] == outs["torch", None]
    timed = LLM(hf_model_dir(family), **common)  # whatever this machine picks, the GEMV included
    assert [o.outputs[0].token_ids
            for o in timed.generate(prompts, params, use_tqdm=False)] == outs["torch", None]
