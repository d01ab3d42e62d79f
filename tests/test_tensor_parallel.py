"""Tensor parallelism (issue 41): a Llama split across ranks gives the tokens of the whole model.

Two levels:

- the split itself (``models/tensor_parallel.py``), in one process: two shards run side by side in two
  threads, joined by an all-reduce over a barrier, must give the whole model's hidden states, on every
  family (o_proj and MLP biases, q/k/v biases, per-head q/k norms, GQA, a sliding window);
- the engine (``engine/tensor_parallel.py``): ``LLM(tensor_parallel_size=2)`` starts a second process,
  the ranks meet in gloo all-reduces, and greedy tokens equal one rank's through chunked prefill, the
  prefix cache, preemption and speculative decoding; each step's record carries its all-reduce time;
  closing (or dropping) the engine ends the other rank.
"""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from minengine import LLM, EngineConfig, SamplingParams
from minengine.models.attention import AttentionMetadata
from minengine.models.loader import load_model
from minengine.models.tensor_parallel import build_shard, check_divisible, shard_config, shard_weights

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park and saw a big", "One day"]
# 31 tokens, 3 more from each prompt: two full 16-token blocks shared by the four (the prefix cache's)
PREFIX = ("Once upon a time there was a little girl named Lily. She liked to play in the park with her big "
          "red ball and her dog Max. ")


class ThreadGroup:
    """An all-reduce for ranks that are threads of this process: each adds its tensor, all wait, all read
    the sum (in rank order, as a two-rank ring adds)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=30)
        self.parts: list[torch.Tensor | None] = [None] * world_size

    def rank(self, rank: int) -> _ThreadRank:
        return _ThreadRank(self, rank)


class _ThreadRank:
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank = group, rank

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        g = self.group
        g.parts[self.rank] = x.clone()
        g.barrier.wait()
        total = sum(g.parts[1:], g.parts[0].clone())
        g.barrier.wait()  # everyone has read the parts before the next layer overwrites them
        return x.copy_(total)


def _run_shards(model: torch.nn.Module, world_size: int, ids: torch.Tensor,
                meta: AttentionMetadata) -> list[torch.Tensor]:
    group = ThreadGroup(world_size)
    local = shard_config(model.config, world_size)
    shards = [build_shard(local, shard_weights(model, r, world_size), group.rank(r))
              for r in range(world_size)]
    out: list[torch.Tensor | None] = [None] * world_size
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            with torch.inference_mode():
                out[rank] = shards[rank](ids, meta.positions(), meta)
        except BaseException as e:  # noqa: BLE001 (re-raised in the test's thread)
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_two_shards_joined_by_all_reduce_give_the_whole_models_hidden_states(hf_model_dir, family):
    model = load_model(hf_model_dir(family))
    seq_lens = [40, 7]  # past mistral's 24-token window
    meta = AttentionMetadata.for_prefill(seq_lens)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (sum(seq_lens),), generator=g)
    with torch.inference_mode():
        whole = model(ids, meta.positions(), meta)
    hidden = _run_shards(model, 2, ids, meta)
    for rank_hidden in hidden:  # every rank ends the layer stack with the same, whole hidden states
        torch.testing.assert_close(rank_hidden, whole, rtol=1e-4, atol=1e-4)


def test_the_split_gives_each_rank_its_heads_and_one_bias(hf_model_dir):
    model = load_model(hf_model_dir("llama"))  # biases on q/k/v, o_proj and the MLP
    c = model.config
    shards = [shard_weights(model, r, 2) for r in range(2)]
    qkv = model.model.layers[0].self_attn.qkv_proj.weight
    q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size])
    name = "model.layers.0.self_attn.qkv_proj.weight"
    half_q, half_kv = c.q_size // 2, c.kv_size // 2
    for r, shard in enumerate(shards):  # q heads, then k heads, then v heads of this rank, in order
        expected = torch.cat([q[r * half_q:(r + 1) * half_q], k[r * half_kv:(r + 1) * half_kv],
                              v[r * half_kv:(r + 1) * half_kv]])
        assert torch.equal(shard[name], expected)
    o = "model.layers.0.self_attn.o_proj"
    assert torch.equal(torch.cat([s[f"{o}.weight"] for s in shards], 1), model.state_dict()[f"{o}.weight"])
    assert torch.equal(shards[0][f"{o}.bias"], model.state_dict()[f"{o}.bias"])
    assert not shards[1][f"{o}.bias"].any(), "a row-parallel bias is added once, by rank 0"
    assert shard_config(c, 2).num_key_value_heads == c.num_key_value_heads // 2


def test_a_size_that_does_not_divide_the_heads_is_refused_with_the_sizes_that_do(hf_model_dir):
    config = load_model(hf_model_dir("llama3")).config  # one KV head (MQA)
    with pytest.raises(ValueError, match=r"does not divide this model's 1 KV heads.*sizes that do: \[1\]"):
        check_divisible(config, 2)


# ---- the engine: two processes ----
def _greedy(llm: LLM, prompts: list[str], max_tokens: int = 24) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def one_rank_tokens() -> dict[str, list[list[int]]]:
    llm = LLM(model="tinystories-4m")
    try:
        shared = [PREFIX + p for p in PROMPTS]
        return {"plain": _greedy(llm, PROMPTS), "shared": _greedy(llm, shared)}
    finally:
        llm.close()


def test_two_ranks_give_one_ranks_tokens_and_time_their_all_reduces(one_rank_tokens):
    llm = LLM(model="tinystories-4m", tensor_parallel_size=2, max_num_batched_tokens=16, num_blocks=6,
              max_model_len=96)
    try:
        engine = llm.llm_engine
        assert "tensor_parallel: 2 ranks over gloo" in engine.runtime.describe()
        assert engine.model.config.num_attention_heads == 4  # rank 0 keeps half of the 8 heads
        # 16-token chunks, and a cache too small for all four at once: chunked prefill and preemption
        assert _greedy(llm, PROMPTS) == one_rank_tokens["plain"]
        records = engine.engine_core.step_records
        assert any(r.num_preempted for r in records), "the cache holds two of the four requests at once"
        assert any(r.num_prefill_seqs and r.num_decode_seqs for r in records), "no mixed step"
        for r in records:
            assert 0 < r.t_all_reduce < r.t_forward, r
        shared = [PREFIX + p for p in PROMPTS]
        before = len(records)
        assert _greedy(llm, shared) == one_rank_tokens["shared"]
        assert sum(r.prefix_cache_hits for r in list(engine.engine_core.step_records)[before:]) > 0
    finally:
        llm.close()
    assert not any(p.is_alive() for p in engine.worker.tp_ranks.processes)


def test_speculative_decoding_across_two_ranks_keeps_the_tokens(one_rank_tokens):
    llm = LLM(model="tinystories-4m", tensor_parallel_size=2, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    try:
        assert _greedy(llm, [PREFIX + p for p in PROMPTS]) == one_rank_tokens["shared"]
        assert sum(r.num_draft_tokens for r in llm.llm_engine.engine_core.step_records) > 0
    finally:
        llm.close()


def test_dropping_the_engine_ends_the_other_rank():
    llm = LLM(model="tinystories-4m", tensor_parallel_size=2)
    processes = list(llm.llm_engine.worker.tp_ranks.processes)
    assert all(p.is_alive() for p in processes)
    del llm
    gc.collect()
    for p in processes:
        p.join(timeout=20)
    assert not any(p.is_alive() for p in processes)
    # and the process group is gone with it: a new engine can start its own
    again = LLM(model="tinystories-4m", tensor_parallel_size=2)
    again.close()


def test_tensor_parallel_options_that_cannot_work_are_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive int"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="cannot go with compile_decode"):
        EngineConfig(tensor_parallel_size=2, compile_decode=True)
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not divide this model's 8 attention"):
        LLM(model="tinystories-4m", tensor_parallel_size=3)
    import multiprocessing

    assert not [p for p in multiprocessing.active_children() if p.name.startswith("minengine-tp-rank")]


def test_a_script_without_a_main_guard_gets_told_why_its_rank_died(tmp_path):
    """Each rank is a fresh Python process that imports the script: without ``if __name__ ==
    "__main__":`` the rank re-runs the script's top level and dies in multiprocessing's bootstrap. The
    engine must say so and end, not hang waiting for a rank that is gone."""
    import subprocess
    import sys

    script = tmp_path / "serve.py"
    script.write_text('from minengine import LLM\nLLM(model="tinystories-4m", tensor_parallel_size=2)\n')
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path)
    assert done.returncode != 0
    assert "tensor-parallel rank 1 exited" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr.splitlines()[-1]
