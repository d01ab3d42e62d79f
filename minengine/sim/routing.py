"""Prefix-aware routing over engine replicas, and a simulator whose router sees each request.

Each replica has its own KV cache, so a prefix cached on replica 0 is worth nothing to a request sent to
replica 1. Round-robin and least-loaded routing spread requests that share a system prompt over every
replica: each replica computes (and stores) that prompt once, and when the replicas' caches are too
small for all the prompts in use, they keep evicting each other's. A *prefix-aware* (cache-aware)
router — SGLang's router, llm-d's and NVIDIA Dynamo's KV-aware routing — remembers which replica it
sent each prefix to and sends the next request with that prefix there too, unless that replica is much
busier than the least loaded one (then balance wins and the prefix gets a second home).

The router does not look inside the replicas' caches: like SGLang's router it keeps its own
approximate map (block hash -> replica it last routed that block to), updated on every decision, so it
knows about prefixes whose prefill has not finished yet.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from minengine.core.block_manager import hash_block_tokens
from minengine.core.request import Request
from minengine.sim.instance import EventLoop, SimInstance, least_loaded, round_robin
from minengine.sim.simulator import SimResult, Simulator, collect_result, make_request
from minengine.sim.workload import RequestSpec

RequestRouter = Callable[[Request, Sequence[SimInstance]], SimInstance]


def prompt_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the prompt's full blocks (the prefix cache's own names for them)."""
    hashes: list[int] = []
    for i in range(len(token_ids) // block_size):
        hashes.append(hash_block_tokens(hashes[-1] if hashes else None,
                                        token_ids[i * block_size:(i + 1) * block_size]))
    return hashes


class PrefixAwareRouter:
    """Send a request where the longest run of its leading blocks was sent before.

    ``load_slack``: how many more unfinished requests than the least loaded replica the prefix's replica
    may have and still win (0 would be least-loaded routing with prefix tie-breaks; a large value keeps
    every prefix on one replica however hot it is). ``max_entries`` bounds the router's map (LRU).
    """

    def __init__(self, block_size: int, load_slack: int = 8, max_entries: int = 1_000_000) -> None:
        if block_size < 1 or load_slack < 0 or max_entries < 1:
            raise ValueError("need block_size >= 1, load_slack >= 0 and max_entries >= 1")
        self.block_size, self.load_slack, self.max_entries = block_size, load_slack, max_entries
        self.owner: OrderedDict[int, str] = OrderedDict()  # block hash -> replica name
        self.num_prefix_routed = 0  # decisions made by a prefix match
        self.num_balanced = 0  # prefix matched, but the replica was too busy

    def matched_blocks(self, hashes: Sequence[int], name: str) -> int:
        """How many leading blocks of ``hashes`` the router last sent to replica ``name``."""
        n = 0
        for h in hashes:
            if self.owner.get(h) != name:
                break
            n += 1
        return n

    def __call__(self, request: Request, instances: Sequence[SimInstance]) -> SimInstance:
        hashes = prompt_block_hashes(request.prompt_token_ids, self.block_size)
        lightest = min(instances, key=lambda inst: inst.load)
        best, best_n = lightest, 0
        for inst in instances:
            n = self.matched_blocks(hashes, inst.name)
            if n > best_n or (n == best_n and n > 0 and inst.load < best.load):
                best, best_n = inst, n
        if best_n and best.load > lightest.load + self.load_slack:
            best = lightest
            self.num_balanced += 1
        elif best_n:
            self.num_prefix_routed += 1
        for h in hashes:
            self.owner[h] = best.name
            self.owner.move_to_end(h)
        while len(self.owner) > self.max_entries:
            self.owner.popitem(last=False)
        return best


ROUTER_NAMES = ("round_robin", "least_loaded", "prefix_aware")


def make_request_router(name: str, block_size: int, **kwargs: Any) -> RequestRouter:
    """A router that sees the request: ``prefix_aware`` or one of the simulator's load-only routers."""
    if name == "prefix_aware":
        return PrefixAwareRouter(block_size, **kwargs)
    if kwargs:
        raise TypeError(f"router {name!r} takes no options, got {sorted(kwargs)}")
    if name == "round_robin":
        pick = round_robin()
    elif name == "least_loaded":
        pick = least_loaded()
    else:
        raise ValueError(f"unknown router {name!r}; use one of {', '.join(ROUTER_NAMES)}")
    return lambda request, instances: pick(instances)


class RoutedSimulator(Simulator):
    """``Simulator`` with ``num_replicas`` replicas behind a router that sees each request's prompt.

    ``RoutedSimulator("llama-3.1-8b", "h100", num_replicas=4, router="prefix_aware").run(workload)``;
    ``router_options`` go to the router (``load_slack`` for ``prefix_aware``). After ``run``,
    ``last_router`` is the router used (its counters say how often the prefix decided).
    """

    def __init__(self, model: Any = "llama-2-7b", gpu: Any = "h100", *, num_replicas: int = 2,
                 router: str = "prefix_aware", router_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        if router not in ROUTER_NAMES:
            raise ValueError(f"unknown router {router!r}; use one of {', '.join(ROUTER_NAMES)}")
        super().__init__(model, gpu, num_replicas=num_replicas, **kwargs)
        self.router_name = router
        self.router_options = dict(router_options or {})
        make_request_router(router, self.config.block_size, **self.router_options)  # validate now
        self.last_router: RequestRouter | None = None

    def describe(self) -> str:
        return f"{super().describe()}, {self.router_name} routing"

    def run(self, workload: Sequence[RequestSpec]) -> SimResult:
        specs = self._validate(workload)
        instances = [self._instance(f"replica-{i}") for i in range(self.num_replicas)]
        router = make_request_router(self.router_name, self.config.block_size, **self.router_options)
        self.last_router = router
        loop, records = EventLoop(), []

        def arrive(i: int) -> None:
            req = make_request(specs[i], i)
            records.append(req.record)
            inst = router(req, instances)
            inst.add_request(req)
            self._kick(loop, inst, lambda inst, finished: None)

        self._arrivals(loop, specs, arrive)
        loop.run()
        return collect_result(records, instances, self.describe())


def cache_hit_rate(result: SimResult) -> float:
    """Prompt tokens served from the prefix caches / prompt tokens, over all replicas' steps."""
    queries = sum(s.prefix_cache_queries for s in result.steps)
    hits = sum(s.prefix_cache_hits for s in result.steps)
    return hits / queries if queries else 0.0
