"""Disaggregated serving: a prefill pool and a decode pool, with the KV cache sent between them.

DistServe (Zhong et al., OSDI 2024) and Splitwise (Patel et al., ISCA 2024) put the two phases on
different GPUs: prefill instances only run prompts, decode instances only generate, so a long prompt can
never stall a decode step (no prefill-decode interference) and each pool is sized for its own SLO (TTFT
for prefill, TPOT for decode). The price is a second copy of the weights and a KV-cache transfer per
request.

Here a request's life is:

1. it arrives at a prefill instance (chosen by the router) as a request with ``max_tokens=1``: that
   instance's real scheduler prefills it (chunked or not) and samples the first token (TTFT ends here);
2. its prompt's KV cache crosses the link: ``prompt tokens x KV bytes per token / link bandwidth +
   latency`` (the prefill instance frees its blocks at once; real systems hold them until the transfer
   ends, which matters only when the link is slow);
3. a decode instance receives a second request, the prompt plus that first token, through the
   scheduler's public seam ``add_request(request, num_computed_tokens=prompt_len)`` (vLLM's
   KV-connector idea: the prompt's KV is already there), and generates the remaining
   ``output_len - 1`` tokens. The first inter-token gap includes the transfer and any wait for a
   decode slot, as users would see it.

Every instance has its own ``Scheduler`` and ``BlockManager`` (decode instances with prefix caching off:
their KV arrives over the link) and keeps true records of what *it* did; the user's view of a request
(arrival and TTFT from the prefill side, the rest from the decode side) is merged from the two at the
end, without touching either instance's state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from minengine.config import EngineConfig
from minengine.core.records import RequestRecord
from minengine.core.request import Request
from minengine.perf.hardware import Accelerator
from minengine.perf.roofline import CostModel
from minengine.sim.instance import EventLoop, SimInstance, make_router
from minengine.sim.simulator import SimResult, SimulatorBase, collect_result, make_request
from minengine.sim.workload import RequestSpec

# A 400 Gb/s InfiniBand NDR port moves 50 GB/s: one NIC per GPU, as in DistServe's and Splitwise's clusters.
DEFAULT_LINK_BANDWIDTH = 50e9  # bytes/s
DEFAULT_LINK_LATENCY_S = 1e-4  # set-up and first-byte latency of one RDMA transfer (an assumption)


class DisaggregatedCluster(SimulatorBase):
    """``num_prefill`` prefill instances and ``num_decode`` decode instances of one model on one GPU type.

    ``link_bandwidth`` is in bytes/s (the CLI's ``--link-gb-per-s`` is GB/s). Engine options apply to both
    pools; ``prefill_kwargs`` / ``decode_kwargs`` override them per pool (e.g. a larger token budget for
    prefill).
    """

    def __init__(self, model: Any = "llama-2-7b", gpu: str | Accelerator = "h100", num_prefill: int = 1,
                 num_decode: int = 1, config: EngineConfig | None = None, *,
                 cost_model: CostModel | None = None, link_bandwidth: float = DEFAULT_LINK_BANDWIDTH,
                 link_latency_s: float = DEFAULT_LINK_LATENCY_S, router: str = "round_robin",
                 dtype: str | None = None, prefill_kwargs: dict[str, Any] | None = None,
                 decode_kwargs: dict[str, Any] | None = None, **engine_kwargs: Any) -> None:
        if num_prefill < 1 or num_decode < 1:
            raise ValueError(f"need at least one prefill and one decode instance, got "
                             f"{num_prefill}:{num_decode}")
        if not link_bandwidth > 0 or link_latency_s < 0:
            raise ValueError("link bandwidth must be > 0 and link latency >= 0")
        if engine_kwargs.get("speculative_config") is not None or (
                config is not None and config.speculative_config is not None):
            raise ValueError("the disaggregated simulator does not model speculative decoding; simulate "
                             "its decode instances with Simulator(..., speculative_config=..., "
                             "acceptance_rate=...)")
        self._setup(model, gpu, config, cost_model, dtype, engine_kwargs)
        if self.cost_model.pipeline_parallel_size > 1:
            raise ValueError("the disaggregated simulator does not model pipeline parallelism; use "
                             "tensor_parallel_size for its pools, or Simulator for a pipelined replica")
        self.prefill_config = dataclasses.replace(self.config, **(prefill_kwargs or {}))
        decode = {"enable_prefix_caching": False, **(decode_kwargs or {})}
        self.decode_config = dataclasses.replace(self.config, **decode)
        self.num_prefill, self.num_decode = num_prefill, num_decode
        self.link_bandwidth, self.link_latency_s = link_bandwidth, link_latency_s
        self.router_name = router
        make_router(router)

    def transfer_time(self, num_tokens: int) -> float:
        """Seconds to send ``num_tokens`` tokens of KV cache from a prefill to a decode instance."""
        kv_bytes = num_tokens * self.cost_model.model.kv_bytes_per_token
        return kv_bytes / self.link_bandwidth + self.link_latency_s

    def describe(self) -> str:
        c = self.config
        chunk = f"chunked prefill {c.max_num_batched_tokens}" if c.enable_chunked_prefill else "no chunking"
        return (f"disaggregated {self.num_prefill}P:{self.num_decode}D {self.cost_model.model.name} on "
                f"{self.cost_model.accelerator.name}: {chunk}, link {self.link_bandwidth / 1e9:g} GB/s, "
                f"{self.num_blocks * c.block_size:,} KV tokens per instance")

    def run(self, workload: Sequence[RequestSpec]) -> SimResult:
        specs = self._validate(workload)
        prefill = [self._instance(f"prefill-{i}", self.prefill_config) for i in range(self.num_prefill)]
        decode = [self._instance(f"decode-{i}", self.decode_config) for i in range(self.num_decode)]
        route_prefill, route_decode = make_router(self.router_name), make_router(self.router_name)
        loop = EventLoop()
        prefill_records: list[RequestRecord] = []
        decode_records: dict[int, RequestRecord] = {}
        self.executor.reset()

        def arrive(i: int) -> None:
            req = make_request(specs[i], i, max_tokens=1)
            prefill_records.append(req.record)
            inst = route_prefill(prefill)
            inst.add_request(req)
            self._kick(loop, inst, prefill_done)

        def prefill_done(inst: SimInstance, finished: list[Request]) -> None:
            for req in finished:
                spec = specs[int(req.request_id)]
                if spec.output_len == 1:
                    continue  # done: the prefill's token was the whole answer
                target = route_decode(decode)
                target.incoming += 1
                loop.at(loop.now + self.transfer_time(spec.prompt_len),
                        lambda req=req, spec=spec, target=target: deliver(req, spec, target))

        def deliver(req: Request, spec: RequestSpec, target: SimInstance) -> None:
            target.incoming -= 1
            i = int(req.request_id)
            moved = make_request(spec, i)  # the whole output budget; its first token is already known
            moved.append_output_token(req.token_ids[-1], req.record.token_times[0])
            if spec.max_tokens is not None:
                # its true length stays with the executor (RequestSpec.max_tokens)
                self.executor.eos_at[moved.request_id] = spec.output_len
            decode_records[i] = moved.record
            target.add_request(moved, num_computed_tokens=spec.prompt_len)
            self._kick(loop, target, lambda inst, finished: None)

        self._arrivals(loop, specs, arrive)
        loop.run()
        records = [merge_records(r, decode_records.get(i)) for i, r in enumerate(prefill_records)]
        return collect_result(records, prefill + decode, self.describe())


def merge_records(prefill: RequestRecord, decode: RequestRecord | None) -> RequestRecord:
    """The user's view of a disaggregated request: queueing, cache hits and the first token from the
    prefill instance, every later token and the finish from the decode instance."""
    if decode is None:
        return prefill
    return dataclasses.replace(
        decode,
        arrival_time=prefill.arrival_time,
        first_scheduled_time=prefill.first_scheduled_time,
        num_cached_tokens=prefill.num_cached_tokens,
        num_preemptions=prefill.num_preemptions + decode.num_preemptions,
        token_times=list(decode.token_times),
    )
