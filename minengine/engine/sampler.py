"""Logits -> next tokens: greedy, temperature, top-k, top-p, with a random generator per seeded request.

Order of operations (as in vLLM and HF): divide by temperature, keep the top-k logits, keep the
smallest set of tokens whose probability reaches top-p, renormalise, draw. A request with
``SamplingParams.seed`` owns a ``torch.Generator`` seeded once, so its draws depend only on its own
logits, never on which other requests shared the batch (or on preemptions: the generator keeps its
state while the request waits). Unseeded requests share one generator seeded by ``EngineConfig.seed``.
"""

from __future__ import annotations

import torch

from minengine.core.request import Request
from minengine.core.sampling_params import SamplingParams
from minengine.engine.rejection_sampler import greedy_verify, rejection_sample


class Sampler:
    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._generators: dict[str, torch.Generator] = {}  # request id -> its own generator

    def generator_for(self, request: Request) -> torch.Generator:
        seed = request.sampling_params.seed
        if seed is None:
            return self.generator
        gen = self._generators.get(request.request_id)
        if gen is None:
            gen = self._generators[request.request_id] = torch.Generator(device=self.device).manual_seed(seed)
        return gen

    def free(self, request_id: str) -> None:
        """Forget a finished request's generator."""
        self._generators.pop(request_id, None)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """logits [M, vocab] (fp32) of M requests -> M token ids."""
        if not requests:
            return []
        tokens = logits.argmax(dim=-1)  # greedy rows are done; the others are overwritten below
        rows = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
        if rows:
            probs = self.probabilities(logits[rows], [requests[i].sampling_params for i in rows])
            for j, i in enumerate(rows):
                draw = torch.multinomial(probs[j], 1, generator=self.generator_for(requests[i]))
                tokens[i] = draw[0]
        return tokens.tolist()

    @torch.inference_mode()
    def verify(self, logits: torch.Tensor, requests: list[Request],
               drafts: dict[str, list[int]]) -> list[int | list[int]]:
        """A step with drafts (speculative decoding): a request with k drafts owns k + 1 consecutive rows
        of ``logits`` and gets back the list of tokens the target keeps (``rejection_sampler``: its
        distribution, unchanged); the others get one token from their row, as ``__call__`` gives."""
        out: list[int | list[int]] = []
        plain_rows, plain_at = [], []
        row = 0
        for request in requests:
            own = drafts.get(request.request_id)
            if not own:
                plain_rows.append(row)
                plain_at.append(len(out))
                out.append(-1)  # filled in below, with the other single-row requests
                row += 1
                continue
            rows = logits[row : row + len(own) + 1]
            row += len(own) + 1
            params = request.sampling_params
            if params.greedy:
                out.append(greedy_verify(own, rows))
            else:
                probs = self.probabilities(rows, [params] * rows.shape[0])
                out.append(rejection_sample(own, probs, None, self.generator_for(request)))
        if plain_rows:
            tokens = self(logits[plain_rows], [requests[i] for i in plain_at])
            for i, token in zip(plain_at, tokens, strict=True):
                out[i] = token
        return out

    @staticmethod
    def probabilities(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """[R, vocab] logits -> [R, vocab] probabilities after temperature, top-k and top-p.

        Each filter touches only the rows that use it: one batched ``topk`` (to the largest k asked for)
        finds every top-k row's threshold, and only top-p rows are sorted, never the whole batch.
        """
        device, vocab = logits.device, logits.shape[1]
        temperature = torch.tensor([p.temperature for p in params], device=device, dtype=logits.dtype)
        logits = logits / temperature.unsqueeze(1)
        k_rows = [i for i, p in enumerate(params) if 0 < p.top_k < vocab]
        if k_rows:
            ks = torch.tensor([params[i].top_k for i in k_rows], device=device)
            rows = torch.tensor(k_rows, device=device)
            top = logits[rows].topk(int(ks.max()), dim=-1).values  # [r, max k], descending
            k_th = top.gather(1, (ks - 1).unsqueeze(1))  # each row's k-th largest logit
            logits[rows] = logits[rows].masked_fill(logits[rows] < k_th, float("-inf"))
        p_rows = [i for i, p in enumerate(params) if p.top_p < 1]
        if p_rows:
            rows = torch.tensor(p_rows, device=device)
            top_p = torch.tensor([params[i].top_p for i in p_rows], device=device, dtype=logits.dtype)
            sub = logits[rows]
            sorted_logits, order = sub.sort(dim=-1, descending=True)
            sorted_probs = sorted_logits.softmax(dim=-1)
            # drop a token when the tokens before it already reach top_p (the first token always stays)
            before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop_sorted = before >= top_p.unsqueeze(1)
            drop_sorted[:, 0] = False  # even a top_p that rounds to 0 keeps the most likely token
            drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
            logits[rows] = sub.masked_fill(drop, float("-inf"))
        return logits.softmax(dim=-1)
