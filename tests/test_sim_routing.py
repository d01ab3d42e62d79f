"""Prefix-aware routing: same prefix, same replica (unless it is too busy); higher cluster hit rate."""

from __future__ import annotations

import pytest

from minengine.core.request import Request
from minengine.core.sampling_params import SamplingParams
from minengine.sim.routing import (
    PrefixAwareRouter,
    RoutedSimulator,
    cache_hit_rate,
    make_request_router,
    prompt_block_hashes,
)
from minengine.sim.workload import synthetic_workload


class FakeInstance:
    def __init__(self, name: str, load: int = 0) -> None:
        self.name, self.load = name, load


def request(ids: list[int], rid: str = "r") -> Request:
    return Request(rid, ids, SamplingParams(max_tokens=1))


def test_block_hashes_chain_and_ignore_the_partial_block():
    a = prompt_block_hashes(list(range(40)), 16)
    b = prompt_block_hashes([99] + list(range(1, 40)), 16)
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]  # the first block's change reaches the second
    assert prompt_block_hashes(list(range(40)) + [7], 16) == a


def test_prefix_router_sticks_to_a_prefix_and_balances_when_busy():
    insts = [FakeInstance("a"), FakeInstance("b"), FakeInstance("c")]
    router = PrefixAwareRouter(block_size=4, load_slack=2)
    prefix = [5] * 8
    first = router(request(prefix + [1, 2]), insts)
    first.load += 1
    second = router(request(prefix + [3, 4]), insts)
    assert second is first and router.num_prefix_routed == 1
    other = router(request([9] * 8 + [1]), insts)
    assert other is not first  # no match: the least loaded replica
    first.load = 10  # far busier than the others: balance wins, the prefix gets a second home
    third = router(request(prefix + [6]), insts)
    assert third is not first and router.num_balanced == 1
    fourth = router(request(prefix + [7]), insts)  # the router now remembers the new home
    assert fourth is third


def test_router_names_and_validation():
    with pytest.raises(ValueError, match="unknown router"):
        make_request_router("random", 16)
    with pytest.raises(TypeError):
        make_request_router("round_robin", 16, load_slack=3)
    with pytest.raises(ValueError):
        PrefixAwareRouter(0)
    rr = make_request_router("round_robin", 16)
    insts = [FakeInstance("a"), FakeInstance("b")]
    assert [rr(request([1]), insts).name for _ in range(3)] == ["a", "b", "a"]
    with pytest.raises(ValueError, match="unknown router"):
        RoutedSimulator("llama-3.1-8b", "h100", router="nope")


def test_prefix_aware_routing_raises_the_cluster_hit_rate():
    work = synthetic_workload(200, rate=20, input_len=1200, output_len=16, prefix_len=1000, num_prefixes=8,
                              seed=0)
    rates = {}
    for router in ("round_robin", "prefix_aware"):
        sim = RoutedSimulator("llama-3.1-8b", "h100", num_replicas=4, router=router, num_blocks=400)
        result = sim.run(work)
        assert len(result.requests) == 200 and all(r.finish_reason == "length" for r in result.requests)
        rates[router] = cache_hit_rate(result)
    bound = sum(w.prefix_len for w in work) / sum(w.prompt_len for w in work)
    assert rates["prefix_aware"] > rates["round_robin"] + 0.1
    assert rates["prefix_aware"] <= bound
