"""The KV block pool: fixed-size blocks, reference counts, an LRU free queue and the prefix cache.

PagedAttention's idea (Kwon et al., SOSP 2023): a sequence's KV cache is a list of fixed-size blocks
anywhere in one big pool, like virtual memory pages, so memory is wasted only in each sequence's last
block. This class only does the bookkeeping (which block ids a request owns); ``kv_cache.py`` holds the
tensors. No torch here: the simulator uses the same manager.

Prefix caching (vLLM v1's "automatic prefix caching"): a *full* block is named by the hash of
(parent block's hash, its token ids), so equal hashes mean equal whole prefixes. A new request looks its
blocks up and reuses the hits (ref count + 1) instead of recomputing them. Rules:

- only full blocks whose K/V has been written are cached (``cache_blocks`` runs after the forward pass);
- a lookup never covers the request's last token: its logits are needed to sample, so it must be computed;
- a freed block keeps its hash in the free queue and is still a hit until it is reused (evicted);
- freed blocks go to the *tail* of the free queue, a request's last block first, so the head (reused
  first) holds the least recently used blocks and a sequence's tail is evicted before its head — the
  head is the part other requests are likely to share. Blocks with no hash go to the head: they hold
  nothing worth keeping.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from minengine.core.request import Request
from minengine.utils import cdiv


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """The prefix-cache name of a full block: depends on its tokens *and* on every block before it."""
    return hash((parent_hash, tuple(token_ids)))


@dataclass
class Block:
    block_id: int
    ref_cnt: int = 0  # requests using this block right now
    block_hash: int | None = None  # set once the block is full, computed and cached
    token_ids: tuple[int, ...] = ()  # the tokens it was cached with: a hit is verified against them


class BlockManager:
    """Owns ``num_blocks`` blocks of ``block_size`` tokens and hands them to requests."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order (head = next to reuse). Cached-but-free blocks are in here too.
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached_blocks: dict[int, int] = {}  # block hash -> block id
        self._num_hashed: dict[str, int] = {}  # request id -> how many of its leading blocks are cached
        # Counters in tokens, like vLLM's prefix_cache_queries / prefix_cache_hits.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # ---- sizes ----
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by some request (vLLM's kv_cache_usage_perc)."""
        return self.num_used_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # ---- prefix cache ----
    def block_hashes(self, request: Request, num_blocks: int) -> list[int]:
        """The chained hashes of the request's first ``num_blocks`` full blocks (extended as needed)."""
        self._extend_hashes(request, num_blocks)
        return request.block_hashes[:num_blocks]

    def _extend_hashes(self, request: Request, num_blocks: int) -> None:
        hashes, bs = request.block_hashes, self.block_size
        if len(hashes) < num_blocks:
            token_ids, add = request.token_ids, hashes.append
            parent = hashes[-1] if hashes else None
            for i in range(len(hashes), num_blocks):  # hash_block_tokens, inlined
                parent = hash((parent, tuple(token_ids[i * bs : (i + 1) * bs])))
                add(parent)

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest cached prefix of a new request: (block ids, number of tokens they hold)."""
        if not self.enable_prefix_caching:
            return [], 0
        bs = self.block_size
        max_blocks = (request.num_tokens - 1) // bs  # never the last token: we need its logits
        hits: list[int] = []
        for i, h in enumerate(self.block_hashes(request, max_blocks)):
            block_id = self.cached_blocks.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tuple(
                request.token_ids[i * bs : (i + 1) * bs]
            ):
                break  # a miss (or a hash collision) ends the prefix
            hits.append(block_id)
        return hits, len(hits) * bs

    def cache_blocks(self, request: Request) -> None:
        """Register the request's full, computed blocks in the prefix cache (call after the forward pass)."""
        if not self.enable_prefix_caching:
            return
        block_table = request.block_table
        num_full = request.num_computed_tokens // self.block_size
        if num_full > len(block_table):
            num_full = len(block_table)
        start = self._num_hashed.get(request.request_id, 0)
        if num_full <= start:
            return
        bs, blocks, cached = self.block_size, self.blocks, self.cached_blocks
        hashes, token_ids = request.block_hashes, request.token_ids
        if len(hashes) < num_full:
            self._extend_hashes(request, num_full)
        for i in range(start, num_full):
            block = blocks[block_table[i]]
            h = hashes[i]
            if block.block_hash is not None or h in cached:
                continue  # already cached (a prefix hit), or the same tokens were cached by another request
            block.block_hash = h
            block.token_ids = tuple(token_ids[i * bs : (i + 1) * bs])
            cached[h] = block.block_id
        self._num_hashed[request.request_id] = num_full

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (e.g. between benchmark runs). Blocks in use keep their contents."""
        for block in self.blocks:
            block.block_hash, block.token_ids = None, ()
        self.cached_blocks.clear()
        self._num_hashed.clear()

    # ---- allocation ----
    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[int] = (), reserve: int = 0
    ) -> bool:
        """Make the request's block table cover ``num_computed_tokens + cached + num_new_tokens`` tokens.

        ``new_computed_blocks`` are prefix-cache hits of a request being admitted (from
        ``get_computed_blocks``). Returns False, changing nothing, when there are not enough free blocks
        (keeping ``reserve`` blocks free): the scheduler then preempts someone or leaves it waiting.
        """
        bs = self.block_size
        total = request.num_computed_tokens + len(new_computed_blocks) * bs + num_new_tokens
        num_new_blocks = cdiv(total, bs) - len(request.block_table) - len(new_computed_blocks)
        # Hits sitting in the free queue leave it when we take them, so they count against the free blocks.
        num_revived = (sum(1 for b in new_computed_blocks if self.blocks[b].ref_cnt == 0)
                       if new_computed_blocks else 0)
        if num_new_blocks + num_revived + reserve > len(self.free_queue):
            return False
        if self.enable_prefix_caching and not request.block_table and request.num_computed_tokens == 0:
            # an admission: count the lookup (only now, so a request that has to wait is counted once)
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += len(new_computed_blocks) * bs
            self._num_hashed[request.request_id] = len(new_computed_blocks)
        table = request.block_table
        for block_id in new_computed_blocks:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                del self.free_queue[block_id]
            block.ref_cnt += 1
            table.append(block_id)
        if num_new_blocks > 0:
            pop, blocks, cached = self.free_queue.popitem, self.blocks, self.cached_blocks
            for _ in range(num_new_blocks):  # _take_free_block, inlined
                block_id, _ = pop(last=False)
                block = blocks[block_id]
                if block.block_hash is not None:  # it was cached: evict it from the cache now
                    if cached.get(block.block_hash) == block_id:
                        del cached[block.block_hash]
                    block.block_hash, block.token_ids = None, ()
                if block.ref_cnt:
                    raise AssertionError(f"block {block_id} in the free queue with ref_cnt {block.ref_cnt}")
                block.ref_cnt = 1
                table.append(block_id)
        return True

    def free(self, request: Request) -> None:
        """Drop the request's references; blocks nobody uses go to the free queue (keeping their hash)."""
        blocks, queue = self.blocks, self.free_queue
        for block_id in reversed(request.block_table):  # the sequence's tail goes in (and out) first
            block = blocks[block_id]
            block.ref_cnt -= 1
            if block.ref_cnt <= 0:
                if block.ref_cnt:
                    raise AssertionError(f"block {block_id} freed more often than it was taken")
                queue[block_id] = None
                if block.block_hash is None:
                    queue.move_to_end(block_id, last=False)  # nothing cached: reuse it first
        request.block_table = []
        self._num_hashed.pop(request.request_id, None)

    # ---- for tests and lessons ----
    def check_invariants(self, live_requests: Sequence[Request] = ()) -> None:
        """Assert the pool's invariants (ref counts match ``live_requests`` when they are all given)."""
        for block in self.blocks:
            assert block.ref_cnt >= 0, f"negative ref count on block {block.block_id}"
            assert (block.ref_cnt == 0) == (block.block_id in self.free_queue), (
                f"block {block.block_id}: ref_cnt {block.ref_cnt} but in free queue: "
                f"{block.block_id in self.free_queue}"
            )
        assert self.num_free_blocks + sum(b.ref_cnt > 0 for b in self.blocks) == self.num_blocks
        for h, block_id in self.cached_blocks.items():
            assert self.blocks[block_id].block_hash == h, (
                f"cache maps {h} to block {block_id} with another hash"
            )
        if live_requests:
            counts = [0] * self.num_blocks
            for req in live_requests:
                for block_id in req.block_table:
                    counts[block_id] += 1
            assert counts == [b.ref_cnt for b in self.blocks], "ref counts differ from the block tables"
