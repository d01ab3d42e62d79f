"""Block pool and prefix cache: unit cases plus a hypothesis state machine over random operations.

The state machine plays the model's part with a fake KV store: "computing" tokens writes their ids into
the slots the block table points at. So the strongest property can be checked directly: every token a
request counts as computed is really in its blocks, whether written by itself or found in the cache.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from minengine.core.block_manager import BlockManager, hash_block_tokens
from minengine.core.request import Request

BS = 4


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens)


def _admit(bm: BlockManager, req: Request, num_new: int | None = None) -> bool:
    """What the scheduler does for a waiting request: look up the cache, allocate the rest."""
    hits, cached = bm.get_computed_blocks(req)
    n = req.num_tokens - cached if num_new is None else num_new
    if not bm.allocate_slots(req, n, hits):
        return False
    req.num_computed_tokens = cached
    return True


def _compute(bm: BlockManager, req: Request, n: int) -> None:
    req.num_computed_tokens += n
    bm.cache_blocks(req)


def test_prefix_hit_shares_full_blocks_and_never_the_last_token():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = _req("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert _admit(bm, a)
    _compute(bm, a, 10)
    b = _req("b", list(range(8)) + [99, 98])
    hits, cached = bm.get_computed_blocks(b)
    assert hits == a.block_table[:2] and cached == 8
    # exactly 2 full blocks: the 2nd block would hold the last token, so only the 1st is reused
    c = _req("c", list(range(8)))
    assert bm.get_computed_blocks(c) == (a.block_table[:1], 4)
    assert _admit(bm, b)
    assert [bm.blocks[i].ref_cnt for i in a.block_table] == [2, 2, 1]
    assert bm.prefix_cache_queries == 20 and bm.prefix_cache_hits == 8
    bm.check_invariants([a, b])


def test_uncomputed_blocks_are_not_cached():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = _req("a", list(range(12)))
    assert _admit(bm, a)
    _compute(bm, a, 6)  # a chunk: only block 0 is full and written
    assert bm.get_computed_blocks(_req("b", list(range(12))))[1] == 4


def test_freed_blocks_keep_hash_and_tail_is_evicted_first():
    bm = BlockManager(num_blocks=6, block_size=BS)
    a = _req("a", list(range(13)))  # 3 full blocks + 1 token -> 4 blocks
    assert _admit(bm, a)
    _compute(bm, a, 13)
    table = list(a.block_table)
    bm.free(a)
    assert bm.num_used_blocks == 0
    # the partial (unhashed) last block is reused first, then the never-used ones, then a's tail
    order = list(bm.free_queue)
    assert order[0] == table[3] and order[-3:] == [table[2], table[1], table[0]]
    # still a full hit after being freed
    assert bm.get_computed_blocks(_req("b", list(range(13))))[1] == 12
    # a 4-block request must evict one cached block: a's last full block goes, its head stays
    c = _req("c", [50 + i for i in range(16)])
    assert _admit(bm, c)
    assert bm.get_computed_blocks(_req("d", list(range(13))))[1] == 8
    bm.check_invariants([c])


def test_allocation_failure_changes_nothing():
    bm = BlockManager(num_blocks=3, block_size=BS)
    a = _req("a", list(range(8)))
    assert _admit(bm, a)
    before = (list(a.block_table), bm.num_free_blocks)
    assert not bm.allocate_slots(a, 13)  # 4 blocks > 3
    assert (list(a.block_table), bm.num_free_blocks) == before


def test_hash_collision_is_not_a_hit():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = _req("a", list(range(9)))
    assert _admit(bm, a)
    _compute(bm, a, 9)
    # forge: make b's first block hash equal a's although the tokens differ
    b = _req("b", [7, 7, 7, 7, 7])
    b.block_hashes.append(a.block_hashes[0])
    assert bm.get_computed_blocks(b) == ([], 0)


def test_disabled_prefix_caching_never_hits():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = _req("a", list(range(9)))
    assert _admit(bm, a)
    _compute(bm, a, 9)
    assert bm.get_computed_blocks(_req("b", list(range(9)))) == ([], 0) and not bm.cached_blocks


# ------------------------------------------------------------------------------------------------
# State machine
# ------------------------------------------------------------------------------------------------
class BlockManagerMachine(RuleBasedStateMachine):
    """Random admissions (small alphabet: prefixes collide often), chunks, decodes, frees."""

    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(num_blocks=12, block_size=BS)
        self.kv: dict[int, list[int | None]] = {b: [None] * BS for b in range(12)}  # fake K/V: token ids
        self.live: list[Request] = []
        self.prefixes: dict[int, tuple[int, ...]] = {}  # every hash seen -> the whole prefix it names
        self.n = 0

    def _write(self, req: Request, start: int, end: int) -> None:
        for p in range(start, end):
            self.kv[req.block_table[p // BS]][p % BS] = req.token_ids[p]

    def _record_hashes(self, req: Request) -> None:
        parent = None
        for i in range(req.num_tokens // BS):
            parent = hash_block_tokens(parent, req.token_ids[i * BS : (i + 1) * BS])
            self.prefixes[parent] = tuple(req.token_ids[: (i + 1) * BS])

    @rule(
        target=requests, tokens=st.lists(st.integers(0, 1), min_size=1, max_size=20), chunk=st.integers(1, 12)
    )
    def admit(self, tokens, chunk):
        req = _req(f"r{self.n}", tokens)
        self.n += 1
        hits, cached = self.bm.get_computed_blocks(req)
        n = min(req.num_tokens - cached, chunk)
        if not self.bm.allocate_slots(req, n, hits):
            return None
        req.num_computed_tokens = cached
        self._write(req, cached, cached + n)
        _compute(self.bm, req, n)
        self.live.append(req)
        self._record_hashes(req)
        return req

    @rule(req=requests, chunk=st.integers(1, 12), token=st.integers(0, 1))
    def step(self, req, chunk, token):
        """The next chunk of a prefill, or (prompt done) append a sampled token and decode it."""
        if req is None or req not in self.live:
            return
        if req.num_computed_tokens == req.num_tokens:
            req.token_ids.append(token)
            self._record_hashes(req)
        n = min(chunk, req.num_tokens - req.num_computed_tokens)
        if not self.bm.allocate_slots(req, n):
            return
        start = req.num_computed_tokens
        self._write(req, start, start + n)
        _compute(self.bm, req, n)

    @rule(req=consumes(requests))
    def free(self, req):
        if req is not None and req in self.live:
            self.bm.free(req)
            self.live.remove(req)
            req.num_computed_tokens = 0

    @invariant()
    def pool_is_consistent(self):
        self.bm.check_invariants(self.live)  # ref counts >= 0 and == table counts, free <=> unreferenced
        assert self.bm.num_free_blocks + self.bm.num_used_blocks == self.bm.num_blocks
        if not self.live:
            assert self.bm.num_used_blocks == 0

    @invariant()
    def cached_blocks_hold_their_tokens(self):
        for h, block_id in self.bm.cached_blocks.items():
            assert self.kv[block_id] == list(self.prefixes[h][-BS:])
            assert self.bm.blocks[block_id].token_ids == self.prefixes[h][-BS:]

    @invariant()
    def computed_tokens_are_in_the_blocks(self):
        for req in self.live:
            for p in range(req.num_computed_tokens):
                assert self.kv[req.block_table[p // BS]][p % BS] == req.token_ids[p]


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
