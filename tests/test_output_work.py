"""Outputs without quadratic work (issue 13, item 3): a DELTA or FINAL_ONLY step touches O(1) of a
request's tokens and text, whatever the output's length. Work is counted, never timed."""

from __future__ import annotations

import random

import pytest
from hf_utils import byte_tokenizer

from minengine.core.sampling_params import RequestOutputKind, SamplingParams
from minengine.engine.detokenizer import IncrementalDetokenizer
from minengine.engine.llm_engine import LLMEngine
from minengine.models.loader import build_random_model

pytestmark = pytest.mark.usefixtures("torch_one_thread")

_TINY = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1, vocab_size=512, max_position_embeddings=1024,
             tie_word_embeddings=True)


class CountingList(list):
    """A list that counts the elements read out of it by indexing, slicing, iteration and copies."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.touched = 0

    def __getitem__(self, i):  # type: ignore[override]
        out = list.__getitem__(self, i)
        self.touched += len(out) if isinstance(i, slice) else 1
        return out

    def __iter__(self):
        self.touched += len(self)
        return list.__iter__(self)

    def copy(self) -> list:
        self.touched += len(self)
        return list(list.__iter__(self))


@pytest.fixture(scope="module")
def model():
    return build_random_model(_TINY, seed=0, std=0.3)


def _run(model, kind: RequestOutputKind, output_len: int, batch: int = 3) -> tuple[int, int, list]:
    """Elements of the requests' token lists read by the engine over a whole run, the run's steps, and
    the final outputs."""
    engine = LLMEngine(model=model, tokenizer=byte_tokenizer(), max_num_seqs=batch, block_size=16,
                       enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True, output_kind=kind,
                            stop=["never in a random stream"])
    requests = [engine.add_request(str(i), [3 + i, 40, 41, 42], params) for i in range(batch)]
    for r in requests:
        r.token_ids = CountingList(r.token_ids)
    steps, final = 0, []
    while engine.has_unfinished_requests():
        final += [o for o in engine.step() if o.finished]
        steps += 1
    return sum(r.token_ids.touched for r in requests), steps, final


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY])
def test_a_step_touches_a_constant_number_of_tokens(model, kind):
    short, s_steps, _ = _run(model, kind, 40)
    long, l_steps, final = _run(model, kind, 320)
    per_step = (long - short) / (l_steps - s_steps)  # the prompts' and the final copies' share drops out
    # a decode reads its newest token for the forward and the detokenizer: ~2 per request per step; the one
    # final copy of each output (FINAL_ONLY) adds 3 x 280 / 280 steps = 3 per step at most
    assert per_step <= 3 * 2 + (3 if kind is RequestOutputKind.FINAL_ONLY else 0), per_step
    assert all(len(o.outputs[0].token_ids) == (320 if kind is RequestOutputKind.FINAL_ONLY else 1)
               for o in final)


def test_cumulative_outputs_do_copy_everything(model):
    """The same counter sees the O(L) copy when a request asks for it (so the test above can fail)."""
    short, s_steps, _ = _run(model, RequestOutputKind.CUMULATIVE, 40)
    long, l_steps, _ = _run(model, RequestOutputKind.CUMULATIVE, 320)
    assert (long - short) / (l_steps - s_steps) > 3 * 100  # ~ 3 requests x mean output length per step


def test_a_delta_stream_never_builds_the_whole_text(model, monkeypatch):
    reads = []
    text = IncrementalDetokenizer.output_text

    def counted(self):
        reads.append(len(self._pieces))
        return text.fget(self)

    monkeypatch.setattr(IncrementalDetokenizer, "output_text", property(counted))
    _, steps, final = _run(model, RequestOutputKind.DELTA, 200)
    assert steps >= 200 and len(final) == 3
    assert len(reads) <= 3  # at most once per request (at its end), not once per step


# ---- the detokenizer's text, against the plain O(L) algorithm it replaced ----------------------------


class _PlainDetokenizer:
    """The previous implementation: the whole text in one string, searched from the new piece."""

    def __init__(self, tokenizer, stop: list[str]) -> None:
        self.tokenizer, self.tokens, self.prefix_offset, self.read_offset = tokenizer, [], 0, 0
        self.output_text, self.num_emitted, self.stop, self.stopped = "", 0, stop, False
        self.stop_buffer = max((len(s) for s in stop), default=1) - 1

    def update(self, token: int, final: bool = False) -> str | None:
        if not final:
            self.tokens.append(token)
        if self.stopped:
            return None
        decode = self.tokenizer.decode
        prefix = decode(self.tokens[self.prefix_offset : self.read_offset])
        full = decode(self.tokens[self.prefix_offset :])
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return None
        start = len(self.output_text)
        self.output_text += full[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        best = None
        for s in self.stop:
            i = self.output_text.find(s, max(0, start - len(s) + 1))
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        self.output_text, self.stopped = self.output_text[: best[0]], True
        return best[1]

    def get_delta(self, finished: bool) -> str:
        end = len(self.output_text) if finished or self.stopped else len(self.output_text) - self.stop_buffer
        if end <= self.num_emitted:
            return ""
        delta, self.num_emitted = self.output_text[self.num_emitted : end], end
        return delta


@pytest.mark.parametrize("seed", range(12))
def test_detokenizer_gives_the_plain_algorithms_deltas_and_stops(seed):
    rng = random.Random(seed)
    tok = byte_tokenizer()
    text = "".join(rng.choice(["a", "b", "ab", " ", "é", "🙂", "日本", "\n", "xyz"]) for _ in range(300))
    ids = tok.encode(text)
    stop = [text[i : i + rng.randint(1, 6)] for i in rng.sample(range(100, 290), rng.randint(0, 3))]
    ours, plain = IncrementalDetokenizer(tok, [], stop=stop), _PlainDetokenizer(tok, stop)
    ours_deltas, plain_deltas = [], []
    for j, t in enumerate(ids):
        a, b = ours.update([t]), plain.update(t)
        last = j == len(ids) - 1
        if last and a is None:
            a, b = ours.flush(), plain.update(t, final=True)
        assert a == b
        finished = a is not None or last
        ours_deltas.append(ours.get_delta(finished))
        plain_deltas.append(plain.get_delta(finished))
        if a is not None:
            break
    assert ours_deltas == plain_deltas and ours.output_text == plain.output_text
    assert ours.emitted_text == "".join(ours_deltas)
    assert len(ours.tokens) <= 8  # the decode window, not the whole output


def test_stop_string_spanning_pieces_is_cut_and_never_streamed():
    tok = byte_tokenizer()
    detok = IncrementalDetokenizer(tok, [], stop=["STOP"])
    streamed = ""
    for t in tok.encode("one two STOP three"):
        stop = detok.update([t])
        streamed += detok.get_delta(stop is not None)
        if stop:
            break
    assert stop == "STOP" and streamed == "one two " == detok.output_text
