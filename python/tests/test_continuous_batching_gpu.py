"""A serving engine's client on the GPU (issue #73): a continuous-batching loop over a KV cache, driving
flashcore.attention_with_kvcache the way vLLM / SGLang drive attention, checked token by token.

The engine keeps a pool of cache rows, bf16 (num_pages, page_size, 2 KV heads, head dim 128) with a free list of pages
(page sizes 1, 4 and 16), or (slots, capacity, 2, 128) with a free list of dense slots picked by cache_batch_idx.
Sequences arrive at random (prompts of 1 to 300 tokens), wait until the pool can hold their whole life (pages are
reserved, not allocated, at admission), get pages as they grow (a random free page each time, so a sequence's pages
are scattered and reused ones come back soon), decode a random number of tokens (0 to 40) and finish; their pages
(or slot) are then poisoned with NaN and go back to the free list, so a later owner's rows past its length hold NaN
(as does every row no sequence owns). The engine starts mid-flight: a few sequences already decoding, their caches
laid out by test_paged_cpu.paginate (shuffled pages; table entries past their lengths pointing at a NaN page or out
of range), the pages it left unused free.

Each step schedules like vLLM's chunked prefill: every decoding sequence one token, then the prefilling ones in
arrival order a chunk of their prompt of at most 96 tokens within a budget of 160 tokens per step (longer prompts,
and prompts that do not fit what is left of the budget, are split over several steps), and makes ONE call with
packed queries (cu_seqlens_q, max_seqlen_q) that mixes prefill chunks and decode tokens, in a shuffled order, over
the cache with per-sequence cache_seqlens and a block table (rebuilt every step, or a persistent one with a row per
slot and cache_batch_idx), causal, GQA 8 / 2, d = 128, with return_softmax_lse. Block-table entries past a sequence's
pages hold -1, an id past the pool or a page of another sequence (never read, per the C ABI). The new K/V rows of
the step (one per query row) are either appended by the call itself (k, v packed with cu_seqlens_k_new; cache_seqlens
the rows already there) or written into the pages by the test before the call (cache_seqlens then counts them).

After each call: cache_seqlens unchanged; the whole pool bit for bit equal to the test's own mirror of it (the new
rows where the test's page bookkeeping puts them, NaN everywhere else no sequence owns: nothing else was written);
every output row finite; each sequence's rows (out and LSE) against the float64 reference of its whole key history
(every row it ever appended, kept by the test apart from the cache), causal with FlashAttention's bottom-right
alignment (query i of a chunk of n after L cached rows sees keys 0 .. L + i), with the project's error rule
(test_variants_gpu.check: err <= 2 * err(baseline at bf16) + atol, LSE within 2e-3 / 1e-3). Each run also asserts
that it covered what it is for: steps mixing prefill chunks and decode tokens, prompts split over several steps,
sequences finished and their pages reused.

Runs: pages of 1, 4 and 16 rows with the call appending and with the test writing (16 sequences at most, a block
table per step), a persistent table of 32 slots with pages of 1 and 16 rows, 16 dense slots of 340 rows; 64 steps
each, 576 steps and about 8,900 sequence checks in all. Needs torch, a CUDA GPU and a libflashcore.so of 0.8 or newer
(skips otherwise, naming the reason). The engine loop itself also runs without a GPU, with the library call emulated
on the CPU (test_kvcache_v08_cpu.emulate_kvcache_v08), in shorter runs, and against mutants of the emulation that it
must catch (a read one row past a sequence's length, an append one row late).

Not covered: transformers' own continuous batching (generate_batch / ContinuousBatchingManager, attn_implementation
"paged|...") through FlashCore: the transformers adapter registers a non-paged attention function only (see
docs/python.md, transformers)."""

import math
import random
from dataclasses import dataclass, field
from typing import List, Optional

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from test_attention_gpu import _need, caps  # noqa: E402,F401  (fixtures; cuda: conftest.py)
from test_kv_fp8_cpu import emulate_kv_fp8  # noqa: E402
from test_kvcache_v08_cpu import emulate_kvcache_v08  # noqa: E402
from test_paged_cpu import paginate  # noqa: E402
from test_variants_gpu import check  # noqa: E402
from test_varlen_cpu import cu_seqlens  # noqa: E402

HEADS_Q, HEADS_KV, HEAD_DIM = 8, 2, 128
DTYPE = torch.bfloat16
E4M3 = torch.float8_e4m3fn
# An e4m3 pool's per-tensor descales (vLLM's k_scale / v_scale): N(0, 1) rows over them stay within e4m3's +-448 but
# for the rare saturated value; not powers of two, so the quantization rounds.
KV8_DESCALES = (0.0171, 0.0123)


@pytest.fixture(scope="module")
def v08(caps):
    _need(caps, DTYPE, HEAD_DIM)
    lib = _lib.load()
    if not lib.has_kvcache_serving():
        pytest.skip(f"{lib.path} (version {lib.version_string()}) predates the 0.8 serving fields")
    return caps


@dataclass
class Sequence:
    id: int
    prompt: int  # prompt tokens
    decode: int  # tokens decoded after the prompt (0: done with its last prefill chunk)
    k_hist: Optional[torch.Tensor] = None  # (max_len, Hkv, D): rows [0, length) are the rows it appended
    v_hist: Optional[torch.Tensor] = None
    length: int = 0  # rows in the cache
    pages: List[int] = field(default_factory=list)
    slot: int = -1
    chunks: int = 0  # prefill steps taken

    @property
    def total(self):
        return self.prompt + self.decode


class Engine:
    """The engine's state and its loop (module docstring). layout: "paged" (a block table rebuilt every step, one row
    per batch entry), "paged_slots" (a persistent block table, one row per slot, and cache_batch_idx) or "dense_slots"
    ((slots, capacity, Hkv, D) caches and cache_batch_idx). append: "call" (the call appends the new rows,
    cu_seqlens_k_new) or "test" (the test writes them before the call). kv8: the pool in float8_e4m3fn with per-tensor
    descales (KV8_DESCALES): the new rows are bf16, quantized by the library (append "call") or by the test as the
    library does (x / descale, nearest even, saturated); the history keeps their dequantized float32 values."""

    def __init__(self, device, *, layout, append, page_size=16, max_running=16, max_prompt=300, max_decode=40,
                 chunk=96, budget=160, pool_rows=None, warm=6, seed=0, kv8=False):
        assert layout in ("paged", "paged_slots", "dense_slots") and append in ("call", "test")
        assert max_running <= budget
        self.device, self.layout, self.append, self.kv8 = device, layout, append, kv8
        self.descales = tuple(torch.tensor(d, device=device) for d in KV8_DESCALES) if kv8 else None
        self.paged = layout != "dense_slots"
        self.page_size = page_size if self.paged else None
        self.max_running, self.max_prompt, self.max_decode = max_running, max_prompt, max_decode
        self.chunk, self.budget = chunk, budget
        self.rng = random.Random(seed)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.max_len = max_prompt + max_decode
        self.running: List[Sequence] = []
        self.waiting: List[Sequence] = []
        self.next_id = 0
        self.stats = dict(steps=0, rows=0, mixed_steps=0, split_prompts=0, finished=0, reused=0, admitted=0)
        self.freed = set()  # pages / slots a finished sequence gave back (their next owner reuses them)
        self.free_slots = list(range(max_running)) if layout != "paged" else []

        warm_seqs = [self._new_sequence() for _ in range(warm)]
        for s in warm_seqs:  # mid-flight: prompt in the cache, decoding
            s.decode = max(1, s.decode)
            s.length = s.chunks = s.prompt
        k0, v0 = (self._randn(warm, self.max_len, HEADS_KV, HEAD_DIM) for _ in range(2))
        if kv8:  # the rows as the pool holds them (e4m3 values, exact in float32)
            k0, v0 = (self._quantize(t, i).float() for i, t in enumerate((k0, v0)))
        for b, s in enumerate(warm_seqs):
            s.k_hist[:s.length], s.v_hist[:s.length] = self._history(k0[b, :s.length], v0[b, :s.length])
        if self.paged:
            self.width = -(-self.max_len // page_size)  # block-table entries per sequence
            rows = pool_rows if pool_rows is not None else max_running * 180
            spare = max(8, -(-rows // page_size) - warm * self.width)
            self.k_pool, self.v_pool, table = paginate(k0, v0, [s.length for s in warm_seqs], page_size,
                                                       spare_pages=spare, seed=seed, garbage_entries=True)
            if kv8:
                self.k_pool, self.v_pool = self.k_pool.to(E4M3), self.v_pool.to(E4M3)
            self.num_pages = self.k_pool.shape[0]
            for b, s in enumerate(warm_seqs):
                s.pages = table[b, :-(-s.length // page_size)].tolist()
            owned = {p for s in warm_seqs for p in s.pages}
            self.free = [p for p in range(self.num_pages) if p not in owned]
        else:
            self.k_pool = torch.full((max_running, self.max_len, HEADS_KV, HEAD_DIM), math.nan,
                                     dtype=torch.float32 if kv8 else DTYPE, device=device)
            self.v_pool = torch.full_like(self.k_pool, math.nan)
            if kv8:
                self.k_pool, self.v_pool = self.k_pool.to(E4M3), self.v_pool.to(E4M3)
        if layout != "paged":
            for b, s in enumerate(warm_seqs):
                s.slot = self.free_slots.pop(self.rng.randrange(len(self.free_slots)))
                if not self.paged:
                    slot = torch.tensor([[s.slot]], dtype=torch.long, device=device)
                    rows = torch.arange(s.length, device=device)[None]
                    self._write(self.k_pool, slot, rows, k0[b, :s.length].to(self.k_pool.dtype)[None])
                    self._write(self.v_pool, slot, rows, v0[b, :s.length].to(self.v_pool.dtype)[None])
        self.running = warm_seqs
        self.k_mirror, self.v_mirror = self.k_pool.clone(), self.v_pool.clone()  # what the pool must hold

    # -- bookkeeping ----------------------------------------------------------------------------------------------

    def _randn(self, *shape):
        return torch.randn(*shape, device=self.device, dtype=DTYPE, generator=self.gen)

    def _quantize(self, rows, which):
        """e4m3 of rows / descale (which: 0 K, 1 V), as the library's append stores them."""
        return (rows.float() / self.descales[which]).clamp(-448.0, 448.0).to(E4M3)

    def _history(self, k_rows, v_rows):
        """The values the attention sees for rows as the pool holds them (kv8: e4m3 values, dequantized)."""
        if not self.kv8:
            return k_rows, v_rows
        return k_rows.float() * self.descales[0], v_rows.float() * self.descales[1]

    def _bits(self, t):
        return t.view(torch.uint8) if self.kv8 else t.view(torch.int16)

    def _write(self, pool, i0, i1, rows):
        """pool[i0, i1] = rows (on the bits: float8 tensors take no index_put)."""
        self._bits(pool)[i0, i1] = self._bits(rows)

    def _poison(self, pool, idx):
        if self.kv8:
            pool.view(torch.uint8)[idx] = 0x7F  # e4m3's NaN
        else:
            pool[idx] = math.nan

    def _new_sequence(self):
        s = Sequence(self.next_id, self.rng.randint(1, self.max_prompt), self.rng.randint(0, self.max_decode))
        self.next_id += 1
        s.k_hist = torch.full((self.max_len, HEADS_KV, HEAD_DIM), math.nan,
                              dtype=torch.float32 if self.kv8 else DTYPE, device=self.device)
        s.v_hist = torch.full_like(s.k_hist, math.nan)
        return s

    def _pages_for(self, rows):
        return -(-rows // self.page_size)

    def _reserved(self):
        """Pages the running sequences will still allocate (admission reserved their whole life)."""
        return sum(self._pages_for(s.total) - len(s.pages) for s in self.running) if self.paged else 0

    def _admit(self):
        while self.waiting and len(self.running) < self.max_running:
            s = self.waiting[0]
            if self.paged and len(self.free) - self._reserved() < self._pages_for(s.total):
                break  # first come, first served: the head waits for pages
            if self.layout != "paged":
                if not self.free_slots:
                    break
                s.slot = self.free_slots.pop(self.rng.randrange(len(self.free_slots)))
                if not self.paged:
                    self.stats["reused"] += s.slot in self.freed
            self.running.append(self.waiting.pop(0))
            self.stats["admitted"] += 1

    def _allocate(self, s, rows):
        while self.paged and len(s.pages) < self._pages_for(rows):
            page = self.free.pop(self.rng.randrange(len(self.free)))
            self.stats["reused"] += page in self.freed
            s.pages.append(page)

    def _locate(self, s, positions):
        """(dim 0, dim 1) pool indices of these cache rows of s, from the test's own bookkeeping."""
        if self.paged:
            return [s.pages[p // self.page_size] for p in positions], [p % self.page_size for p in positions]
        return [s.slot] * len(positions), list(positions)

    def _finish(self, s):
        if self.paged:
            idx = torch.tensor(s.pages, dtype=torch.long, device=self.device)
            self.free += s.pages
            self.freed.update(s.pages)
        else:
            idx = torch.tensor([s.slot], dtype=torch.long, device=self.device)
            self.freed.add(s.slot)
        for t in (self.k_pool, self.v_pool, self.k_mirror, self.v_mirror):  # the engine poisons what it frees
            self._poison(t, idx)
        if s.slot >= 0:
            self.free_slots.append(s.slot)
        self.running.remove(s)
        self.stats["finished"] += 1

    def _garbage(self):
        """A block-table entry past a sequence's pages: never read."""
        return self.rng.choice((-1, self.num_pages + 7, self.rng.randrange(self.num_pages)))

    def _table_row(self, s):
        pages = [] if s is None else s.pages
        return pages + [self._garbage() for _ in range(self.width - len(pages))]

    # -- one step -------------------------------------------------------------------------------------------------

    def step(self):
        for _ in range(self.rng.choice((0, 0, 1, 1, 2, 3))):
            self.waiting.append(self._new_sequence())
        self._admit()
        budget = self.budget
        batch = []  # (sequence, new rows = query rows)
        for s in self.running:
            if s.length >= s.prompt:
                batch.append((s, 1))
                budget -= 1
        decoding = len(batch)
        for s in self.running:
            if s.length < s.prompt and budget > 0:
                n = min(s.prompt - s.length, self.chunk, budget)
                batch.append((s, n))
                budget -= n
        if not batch:
            return
        self.rng.shuffle(batch)
        self.stats["steps"] += 1
        self.stats["mixed_steps"] += 0 < decoding < len(batch)
        lens = [n for _, n in batch]
        total = sum(lens)
        self.stats["rows"] += total
        for s, n in batch:
            self._allocate(s, s.length + n)

        dev = self.device
        q = self._randn(total, HEADS_Q, HEAD_DIM)
        k_new, v_new = self._randn(total, HEADS_KV, HEAD_DIM), self._randn(total, HEADS_KV, HEAD_DIM)
        i0, i1 = [], []
        for s, n in batch:
            a, b = self._locate(s, range(s.length, s.length + n))
            i0 += a
            i1 += b
        i0, i1 = (torch.tensor(i, dtype=torch.long, device=dev) for i in (i0, i1))

        kwargs = dict(cu_seqlens_q=cu_seqlens(lens, dev), max_seqlen_q=max(lens), causal=True,
                      return_softmax_lse=True)
        # What the pool must hold at the new rows (kv8: the quantized rows).
        k_rows, v_rows = (self._quantize(k_new, 0), self._quantize(v_new, 1)) if self.kv8 else (k_new, v_new)
        if self.kv8:
            kwargs.update(k_descale=self.descales[0], v_descale=self.descales[1])
        if self.append == "call":
            seqlens = [s.length for s, _ in batch]
            kwargs.update(k=k_new, v=v_new, cu_seqlens_k_new=cu_seqlens(lens, dev))
        else:  # the engine writes the step's rows first (vLLM's reshape_and_cache), the call only reads
            self._write(self.k_pool, i0, i1, k_rows)
            self._write(self.v_pool, i0, i1, v_rows)
            seqlens = [s.length + n for s, n in batch]
        if self.layout == "paged":
            kwargs["block_table"] = torch.tensor([self._table_row(s) for s, _ in batch], dtype=torch.int32,
                                                 device=dev)
        else:
            kwargs["cache_batch_idx"] = torch.tensor([s.slot for s, _ in batch], dtype=torch.int32, device=dev)
        if self.layout == "paged_slots":
            owner = {s.slot: s for s in self.running}
            kwargs["block_table"] = torch.tensor([self._table_row(owner.get(slot)) for slot in range(self.max_running)],
                                                 dtype=torch.int32, device=dev)
        cache_seqlens = torch.tensor(seqlens, dtype=torch.int32, device=dev)
        out, lse = flashcore.attention_with_kvcache(q, self.k_pool, self.v_pool, cache_seqlens=cache_seqlens,
                                                    **kwargs)
        assert out.shape == (total, HEADS_Q, HEAD_DIM) and lse.shape == (HEADS_Q, total)
        assert cache_seqlens.tolist() == seqlens, "cache_seqlens was changed"

        # The pool: the new rows where the test's bookkeeping puts them, nothing else written.
        self._write(self.k_mirror, i0, i1, k_rows)
        self._write(self.v_mirror, i0, i1, v_rows)
        for name, got, want in (("k", self.k_pool, self.k_mirror), ("v", self.v_pool, self.v_mirror)):
            if not torch.equal(self._bits(got), self._bits(want)):
                bad = (self._bits(got) != self._bits(want)).flatten(2).any(-1).nonzero().tolist()
                raise AssertionError(f"step {self.stats['steps']}: {name} cache differs from the expected one at "
                                     f"(pool index, row) {bad[:8]} ({len(bad)} rows)")

        # Each sequence against the float64 reference of its whole key history.
        assert torch.isfinite(out).all(), "a NaN row of the pool (unowned, freed or past a length) reached the output"
        start = 0
        k_seen, v_seen = self._history(k_rows, v_rows)
        for s, n in batch:
            rows = slice(start, start + n)
            s.k_hist[s.length:s.length + n], s.v_hist[s.length:s.length + n] = k_seen[rows], v_seen[rows]
            end = s.length + n
            try:
                check(q[None, rows], s.k_hist[None, :end], s.v_hist[None, :end], out[None, rows], lse[None, :, rows],
                      causal=True)
            except AssertionError as exc:
                raise AssertionError(f"step {self.stats['steps']}, sequence {s.id} ({n} query rows after "
                                     f"{s.length} cached): {exc}") from exc
            start += n
            if s.length < s.prompt:
                s.chunks += 1
                self.stats["split_prompts"] += s.chunks == 2
            s.length = end
        for s, _ in batch:
            if s.length == s.total:
                self._finish(s)

    def run(self, steps):
        for _ in range(steps):
            self.step()
        # The run covered what it is for.
        st = self.stats
        assert st["mixed_steps"] and st["split_prompts"] and st["finished"] and st["reused"], st
        for t in (self.k_mirror, self.v_mirror):  # the test's own bookkeeping: every free page / slot is all NaN
            idx = self.free if self.paged else self.free_slots
            if idx:
                held = self._bits(t)[torch.tensor(idx, dtype=torch.long, device=self.device)]
                assert (held & 0x7F == 0x7F).all() if self.kv8 else torch.isnan(t[torch.tensor(idx, device=t.device)]).all()
        return st


# ---------------------------------------------------------------------------------------------------------------
# On the GPU.


@pytest.mark.parametrize("append", ["call", "test"])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged(v08, cuda, page_size, append):
    """A block table rebuilt every step (one row per batch entry), pages of 1, 4 and 16 rows, 16 sequences at most."""
    Engine(cuda, layout="paged", append=append, page_size=page_size, seed=page_size * 2 + (append == "test")).run(64)


@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_persistent_table(v08, cuda, page_size):
    """A persistent block table with a row per slot (vLLM's), cache_batch_idx picking the rows, 32 slots (the free
    ones' rows garbage), the call appending."""
    Engine(cuda, layout="paged_slots", append="call", page_size=page_size, max_running=32, budget=192,
           seed=40 + page_size).run(64)


def test_dense_slots(v08, cuda):
    """Dense slots (16, 340, 2, 128) picked by cache_batch_idx; a freed slot is poisoned and reused."""
    Engine(cuda, layout="dense_slots", append="call", seed=50).run(64)


@pytest.fixture(scope="module")
def kv8(v08):
    lib = _lib.load()
    if not lib.has_kv_fp8() or v08.device_backend != "sm90":
        pytest.skip(f"an e4m3 pool needs the e4m3 KV cache: {lib.path} (version {lib.version_string()}) on the "
                    f"{v08.device_backend or 'no'} backend (sm90 only)")
    return v08


@pytest.mark.parametrize("layout, append, page_size", [("paged", "call", 16), ("paged", "test", 16),
                                                       ("paged_slots", "call", 64), ("dense_slots", "call", None)])
def test_e4m3_pool(kv8, cuda, layout, append, page_size):
    """The same engine over an e4m3 pool (per-tensor descales, pages of 16 and 64 rows or dense slots): the library
    quantizes the appended bf16 rows (or the test does, as the library would), the pool bit for bit the mirror."""
    Engine(cuda, layout=layout, append=append, page_size=page_size or 16, kv8=True,
           seed=60 + (page_size or 0) + (append == "test")).run(64)


# ---------------------------------------------------------------------------------------------------------------
# The engine itself, on the CPU with the library call emulated (test_kvcache_v08_cpu.emulate_kvcache_v08): shorter
# runs, and mutants of the emulated library it must catch.

CPU_RUN = dict(max_running=8, max_prompt=120, max_decode=12, chunk=48, budget=64, warm=3)


@pytest.mark.parametrize("layout, append, page_size", [("paged", "call", 1), ("paged", "test", 16),
                                                       ("paged_slots", "call", 4), ("dense_slots", "call", None)])
def test_engine_emulated_on_cpu(monkeypatch, layout, append, page_size):
    emulate_kvcache_v08(monkeypatch)
    stats = Engine("cpu", layout=layout, append=append, page_size=page_size, seed=7, **CPU_RUN).run(32)
    assert stats["steps"] == 32


@pytest.mark.parametrize("layout, append", [("paged", "call"), ("paged", "test"), ("dense_slots", "call")])
def test_e4m3_engine_emulated_on_cpu(monkeypatch, layout, append):
    emulate_kv_fp8(monkeypatch, [])
    stats = Engine("cpu", layout=layout, append=append, page_size=16, kv8=True, seed=9, **CPU_RUN).run(32)
    assert stats["steps"] == 32


@pytest.mark.parametrize("mutant", ["reads_past_length", "appends_late"])
def test_engine_catches_a_wrong_library(monkeypatch, mutant):
    """The checks have teeth: an emulated library that reads one row past a sequence's length where that row lies in
    the sequence's last page (a NaN row: unwritten, or stale from a freed owner) or appends every new row one row
    late fails the run."""
    emulate_kvcache_v08(monkeypatch)
    launch = _ops._launch_kvcache_serving

    def wrong(lib, q, k_cache, v_cache, out, lse, causal, softmax_scale, seqused_k, **kw):
        if mutant == "reads_past_length":
            seqused_k = seqused_k + (seqused_k % k_cache.shape[1] != 0).to(seqused_k.dtype)
        else:
            seqused_k = seqused_k + 1
        return launch(lib, q, k_cache, v_cache, out, lse, causal, softmax_scale, seqused_k, **kw)

    monkeypatch.setattr(_ops, "_launch_kvcache_serving", wrong)
    if mutant == "reads_past_length":
        engine = Engine("cpu", layout="paged", append="test", page_size=16, seed=8, **CPU_RUN)
    else:
        engine = Engine("cpu", layout="dense_slots", append="call", seed=8, **CPU_RUN)
    with pytest.raises(AssertionError, match="NaN row|cache differs"):
        engine.run(4)
