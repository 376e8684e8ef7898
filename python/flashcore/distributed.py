"""Ring attention over ``torch.distributed``: context parallelism for one long sequence (forward pass).

The sequence is sharded along its length over the ranks of a process group; each rank keeps its query shard while
the key/value shards travel around the ring (rank r sends to r + 1, receives from r - 1) with NCCL point-to-point
operations that overlap the attention of the current step. Each step's partial (O, LSE) is folded into a float32
state with ``flashcore_attention_merge``. The plan (shards, which block a rank computes at each step) is the C
library's (``include/flashcore/ring.h``, ``src/dist/ring_plan.cpp``), step for step:

    import flashcore.distributed as fcd
    q_local = fcd.shard(q, world, rank)          # (B, S_local, Hq, D): rank's rows (zigzag by default)
    out_local = fcd.ring_attention(q_local, k_local, v_local, group, causal=True)
    out = fcd.unshard([...all ranks' outputs...])  # the rows back in sequence order

Layouts: ``"zigzag"`` (default; the sequence cut into 2W chunks, rank r holds chunks r and 2W-1-r, which balances
causal work) and ``"contiguous"``. With a DeviceMesh, pass ``mesh.get_group(dim)``.

``ring_attention_simulate`` runs the same per-rank program for every rank in one process on one GPU, with copies
in place of the transfers: the test of this module's algorithm without several GPUs.

Only K/V heads travel (GQA). C/C++ users have the same algorithm with their own ``ncclComm_t`` in
``flashcore_ring_attention_forward``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Generator, List, Optional, Sequence, Tuple, Union

import torch

from . import _lib
from ._ops import _check_inputs, _check_scale, attention_fwd

LAYOUTS = {"zigzag": _lib.RING_ZIGZAG, "contiguous": _lib.RING_CONTIGUOUS}

__all__ = [
    "LAYOUTS",
    "Piece",
    "merge_attention_states",
    "ring_attention",
    "ring_attention_simulate",
    "shard",
    "shard_range",
    "step_piece",
    "unshard",
]


# ---------------------------------------------------------------------------------------------------------------
# The plan (a mirror of src/dist/ring_plan.cpp; tests hold the two to each other).


def _layout_code(layout: str) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"FlashCore: layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
    return LAYOUTS[layout]


def _part(seqlen: int, parts: int, index: int) -> Tuple[int, int]:
    base, extra = divmod(seqlen, parts)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


def _check_world(seqlen: int, world_size: int, rank: int, layout: str) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"FlashCore: world_size must be a positive int, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"FlashCore: rank must be in [0, {world_size}), got {rank!r}")
    minimum = world_size if _layout_code(layout) == _lib.RING_CONTIGUOUS else 2 * world_size
    if not isinstance(seqlen, int) or seqlen < minimum:
        raise ValueError(f"FlashCore: seqlen {seqlen!r} is too short for a {layout} ring of {world_size} ranks "
                         f"(at least {minimum} rows: every chunk needs one)")


def shard_range(seqlen: int, world_size: int, rank: int, layout: str = "zigzag") -> List[Tuple[int, int]]:
    """The global rows of `rank`'s shard as [(start, length), ...] (one range for contiguous, two for zigzag)."""
    _check_world(seqlen, world_size, rank, layout)
    if _layout_code(layout) == _lib.RING_CONTIGUOUS:
        return [_part(seqlen, world_size, rank)]
    return [_part(seqlen, 2 * world_size, rank), _part(seqlen, 2 * world_size, 2 * world_size - 1 - rank)]


def shard(x: torch.Tensor, world_size: int, rank: int, layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """`rank`'s rows of `x` along `dim` (the sequence dimension; 1 for (B, S, H, D)), in the shard's order."""
    ranges = shard_range(x.shape[dim], world_size, rank, layout)
    return torch.cat([x.narrow(dim, start, length) for start, length in ranges], dim=dim)


def unshard(shards: Sequence[torch.Tensor], layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """The inverse of `shard`: every rank's shard (in rank order) back into one tensor in sequence order."""
    world = len(shards)
    if world == 0:
        raise ValueError("FlashCore: unshard needs the shards of every rank")
    seqlen = sum(int(s.shape[dim]) for s in shards)
    pieces = []
    for rank, s in enumerate(shards):
        ranges = shard_range(seqlen, world, rank, layout)
        if sum(length for _, length in ranges) != s.shape[dim]:
            raise ValueError(f"FlashCore: shard {rank} has {s.shape[dim]} rows along dim {dim}; a {layout} ring of "
                             f"{world} ranks over {seqlen} rows gives it {sum(n for _, n in ranges)}")
        offset = 0
        for start, length in ranges:
            pieces.append((start, s.narrow(dim, offset, length)))
            offset += length
    return torch.cat([p for _, p in sorted(pieces, key=lambda item: item[0])], dim=dim)


@dataclasses.dataclass(frozen=True)
class Piece:
    """One attention block in local rows: queries [q_begin, q_begin + q_len) of the rank's shard against keys
    [k_begin, k_begin + k_len) of the K/V shard it holds at that step."""

    q_begin: int
    q_len: int
    k_begin: int
    k_len: int
    causal: bool


def kv_source(world_size: int, rank: int, step: int) -> int:
    """The rank whose K/V shard `rank` holds at `step`."""
    return (rank - step) % world_size


def step_piece(seqlen: int, world_size: int, rank: int, step: int, causal: bool,
               layout: str = "zigzag") -> Optional[Piece]:
    """The block `rank` computes at `step` (None: nothing, contiguous causal with the source after the rank)."""
    j = kv_source(world_size, rank, step)
    mine = shard_range(seqlen, world_size, rank, layout)
    theirs = shard_range(seqlen, world_size, j, layout)
    q_len, k_len = sum(n for _, n in mine), sum(n for _, n in theirs)
    if not causal:
        return Piece(0, q_len, 0, k_len, False)
    if j == rank:
        return Piece(0, q_len, 0, k_len, True)
    if _layout_code(layout) == _lib.RING_CONTIGUOUS:
        return Piece(0, q_len, 0, k_len, False) if j < rank else None
    if j < rank:  # all queries against the source's first chunk
        return Piece(0, q_len, 0, theirs[0][1], False)
    return Piece(mine[0][1], mine[1][1], 0, k_len, False)  # the second chunk's queries against all of its keys


# ---------------------------------------------------------------------------------------------------------------
# The merge.


def _o_strides(t: torch.Tensor, name: str) -> Tuple[int, int, int, int]:
    if t.dim() != 4:
        raise ValueError(f"FlashCore: {name} must be 4-D (B, S, H, D), got shape {tuple(t.shape)}")
    return tuple(int(s) for s in t.stride())


def _lse_strides(t: torch.Tensor, name: str) -> Tuple[int, int, int]:
    if t.dim() != 3 or t.dtype != torch.float32:
        raise ValueError(f"FlashCore: {name} must be a float32 (B, H, S) tensor, got {t.dtype} {tuple(t.shape)}")
    return tuple(int(s) for s in t.stride())


def merge_attention_states(o_acc: torch.Tensor, lse_acc: torch.Tensor, o_part: Optional[torch.Tensor] = None,
                           lse_part: Optional[torch.Tensor] = None, *, init: bool = False,
                           out: Optional[torch.Tensor] = None) -> None:
    """Fold a partial attention result into a float32 state, in place (flashcore_attention_merge).

    o_acc (B, S, H, D) float32 and lse_acc (B, H, S) float32 are the state; o_part (B, S, H, D) fp16/bf16/fp32 and
    lse_part (B, H, S) float32 the part, as ``attention(..., return_lse=True)`` gives them over another key set.
    init=True: the part becomes the state (the state is not read). out: optionally also write the merged O there
    (fp16/bf16, (B, S, H, D)); with no part, only `out` is written from the state. Strided views are accepted
    (unit stride in the last dimension). Enqueued on the current stream."""
    if (o_part is None) != (lse_part is None):
        raise ValueError("FlashCore: o_part and lse_part go together (both or neither)")
    if o_part is None and out is None:
        raise ValueError("FlashCore: merge_attention_states with no part needs `out`")
    if o_acc.dtype != torch.float32:
        raise TypeError(f"FlashCore: o_acc must be float32, got {o_acc.dtype}")
    tensors = [t for t in (o_acc, lse_acc, o_part, lse_part, out) if t is not None]
    if any(not t.is_cuda or t.device != o_acc.device for t in tensors):
        raise ValueError("FlashCore: merge_attention_states needs every tensor on o_acc's CUDA device")
    codes = {torch.float16: _lib.DTYPE_FP16, torch.bfloat16: _lib.DTYPE_BF16, torch.float32: _lib.DTYPE_FP32}
    lib = _lib.load()
    m = lib.new_merge_params()
    batch, seqlen, heads, head_dim = o_acc.shape if o_acc.dim() == 4 else (0, 0, 0, 0)
    m.batch, m.seqlen, m.num_heads, m.head_dim = batch, seqlen, heads, head_dim
    for name, field, t in (("o_acc", "o_acc_strides", o_acc), ("o_part", "o_part_strides", o_part),
                           ("out", "o_out_strides", out)):
        if t is None:
            continue
        if tuple(t.shape) != tuple(o_acc.shape):
            raise ValueError(f"FlashCore: {name} has shape {tuple(t.shape)}, o_acc {tuple(o_acc.shape)}")
        s = getattr(m, field)
        s.batch, s.seq, s.head, s.dim = _o_strides(t, name)
    for name, field, t in (("lse_acc", "lse_acc_strides", lse_acc), ("lse_part", "lse_part_strides", lse_part)):
        if t is None:
            continue
        if tuple(t.shape) != (batch, heads, seqlen):
            raise ValueError(f"FlashCore: {name} has shape {tuple(t.shape)}, expected {(batch, heads, seqlen)}")
        s = getattr(m, field)
        s.batch, s.head, s.seq = _lse_strides(t, name)
    m.o_acc, m.lse_acc = o_acc.data_ptr(), lse_acc.data_ptr()
    if o_part is not None:
        if o_part.dtype not in codes:
            raise TypeError(f"FlashCore: o_part must be float16, bfloat16 or float32, got {o_part.dtype}")
        m.o_part, m.lse_part, m.part_dtype = o_part.data_ptr(), lse_part.data_ptr(), codes[o_part.dtype]
    if out is not None:
        if out.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"FlashCore: out must be float16 or bfloat16, got {out.dtype}")
        m.o_out, m.out_dtype = out.data_ptr(), codes[out.dtype]
    else:
        m.out_dtype = m.part_dtype if o_part is not None and o_part.dtype != torch.float32 else _lib.DTYPE_FP16
    m.init = 1 if init else 0
    if o_acc.numel() == 0:
        return
    with torch.cuda.device(o_acc.device):
        lib.merge(m, torch.cuda.current_stream(o_acc.device).cuda_stream)


# ---------------------------------------------------------------------------------------------------------------
# One rank's program. It yields at each exchange, so that a driver (torch.distributed, or the single-GPU
# simulation) moves the K/V shards: ("start", (k, v) to send, (k, v) buffers to receive into), then ("wait",).


_Exchange = Tuple[str, Tuple[torch.Tensor, ...], Tuple[torch.Tensor, ...]]


def _rank_program(q, k, v, *, world: int, rank: int, seqlen: int, causal: bool, scale: float, layout: str,
                  shard_lens: Sequence[int], return_lse: bool) -> Generator[_Exchange, None, tuple]:
    batch, s_local, heads_q, _ = q.shape
    head_dim_v = v.shape[3]  # O's head dim: v's (q's, or one of its own: head_dim_v)
    o_acc = torch.empty((batch, s_local, heads_q, head_dim_v), dtype=torch.float32, device=q.device)
    lse_acc = torch.empty((batch, heads_q, s_local), dtype=torch.float32, device=q.device)
    out = q.new_empty((batch, s_local, heads_q, head_dim_v))
    k_cur, v_cur = k.contiguous(), v.contiguous()
    for step in range(world):
        incoming = None
        if step < world - 1:  # the shard this rank holds at step + 1 comes from rank - 1, which holds it now
            rows = shard_lens[kv_source(world, rank, step + 1)]
            incoming = tuple(t.new_empty((batch, rows) + tuple(t.shape[2:])) for t in (k_cur, v_cur))
            yield ("start", (k_cur, v_cur), incoming)
        piece = step_piece(seqlen, world, rank, step, causal, layout)
        last = step == world - 1
        wrote_all = False
        if piece is not None:
            qs = q.narrow(1, piece.q_begin, piece.q_len)
            ks, vs = (t.narrow(1, piece.k_begin, piece.k_len) for t in (k_cur, v_cur))
            o_part, lse_part = attention_fwd(qs, ks, vs, piece.causal, scale, True)
            wrote_all = last and piece.q_begin == 0 and piece.q_len == s_local
            merge_attention_states(o_acc.narrow(1, piece.q_begin, piece.q_len),
                                   lse_acc.narrow(2, piece.q_begin, piece.q_len), o_part, lse_part,
                                   init=step == 0, out=out if wrote_all else None)
        if last and not wrote_all:
            merge_attention_states(o_acc, lse_acc, out=out)
        if incoming is not None:
            yield ("wait", (), ())
            k_cur, v_cur = incoming
    return (out, lse_acc) if return_lse else (out,)


def _prepare(q, k, v, softmax_scale, layout):
    _layout_code(layout)
    scale = _check_scale(softmax_scale)
    if all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k)) and q.shape[1] != k.shape[1]:
        raise ValueError(f"FlashCore: a ring rank's q and k/v hold the same rows (its shard): seqlen_q "
                         f"{q.shape[1]} != seqlen_k {k.shape[1]}")
    _check_inputs(q, k, v, "bshd")
    return scale if scale != 0.0 else 1.0 / math.sqrt(q.shape[3])


def _finish(result, return_lse):
    return result if return_lse else result[0]


# ---------------------------------------------------------------------------------------------------------------
# Front ends.


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None, *, causal: bool = False,
                   softmax_scale: Optional[float] = None, layout: str = "zigzag",
                   seqlen_global: Optional[int] = None, overlap: bool = True,
                   return_lse: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Ring attention for this rank of `group` (a torch.distributed process group with the NCCL backend; None:
    the default group).

    q (B, S_r, Hq, D), k and v (B, S_r, Hkv, D): this rank's shard of one sequence (see `shard`), every rank with
    the same B, heads, D and dtype, and all ranks calling together (v may have a head dim Dv of its own, as in
    flashcore.attention: the output is then (B, S_r, Hq, Dv)). causal: the global causal mask.
    seqlen_global: the whole sequence's length [default: the sum of the ranks' shard lengths, which costs an
    all_gather and a host synchronisation; pass it to avoid both]. overlap=False runs each transfer after the
    step's attention (for measuring what the overlap hides). Returns this rank's output rows (B, S_r, Hq, D) in q's
    dtype, and with return_lse=True also the float32 LSE (B, Hq, S_r)."""
    import torch.distributed as dist

    scale = _prepare(q, k, v, softmax_scale, layout)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if seqlen_global is None:
        mine = torch.tensor([q.shape[1]], dtype=torch.int64, device=q.device)
        lens = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(lens, mine, group=group)
        seqlen_global = int(sum(int(t.item()) for t in lens))
    shard_lens = [sum(n for _, n in shard_range(seqlen_global, world, r, layout)) for r in range(world)]
    if shard_lens[rank] != q.shape[1]:
        raise ValueError(f"FlashCore: rank {rank} holds {q.shape[1]} rows; a {layout} ring of {world} ranks over "
                         f"{seqlen_global} rows gives it {shard_lens[rank]} (flashcore.distributed.shard)")
    send_to = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
    recv_from = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world
    program = _rank_program(q, k, v, world=world, rank=rank, seqlen=seqlen_global, causal=causal, scale=scale,
                            layout=layout, shard_lens=shard_lens, return_lse=return_lse)
    pending: List = []
    sends: tuple = ()
    receives: tuple = ()

    def start():
        ops = [dist.P2POp(dist.isend, t, send_to, group) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, recv_from, group) for t in receives]
        return dist.batch_isend_irecv(ops)

    try:
        event = next(program)
        while True:
            kind, out_bufs, in_bufs = event
            if kind == "start":
                sends, receives = out_bufs, in_bufs
                if overlap:
                    pending = start()
            else:  # "wait": the current stream waits for the transfers (no host synchronisation)
                if not overlap:
                    pending = start()
                for work in pending:
                    work.wait()
                pending = []
            event = program.send(None)
    except StopIteration as done:
        return _finish(done.value, return_lse)


def _drive_simulation(programs: List[Generator]) -> List[tuple]:
    """Run every rank's program in lockstep on this GPU: at each exchange, rank r receives rank r - 1's shard."""
    world = len(programs)
    results: List[Optional[tuple]] = [None] * world

    def advance(r):
        try:
            return programs[r].send(None)
        except StopIteration as done:
            results[r] = done.value
            return None

    events = [advance(r) for r in range(world)]  # to the first "start" (a world of one finishes here)
    while any(e is not None for e in events):
        if any(e is None or e[0] != "start" for e in events):
            raise RuntimeError("FlashCore: ring simulation out of step (internal error)")
        for r in range(world):
            _, _, into = events[r]
            for dst, src in zip(into, events[(r - 1) % world][1]):
                dst.copy_(src)
        events = [advance(r) for r in range(world)]  # computes the step; stops at "wait"
        events = [advance(r) for r in range(world)]  # continues to the next "start", or finishes
    return results


def ring_attention_simulate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int, *,
                            causal: bool = False, softmax_scale: Optional[float] = None, layout: str = "zigzag",
                            return_lse: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Ring attention of `world_size` simulated ranks on this GPU, from the whole sequence: q (B, S, Hq, D), k and
    v (B, S, Hkv, D) are sharded, every rank's program (ring_attention's, step for step) runs with copies in place of
    the transfers, and the outputs come back in sequence order (B, S, Hq, D) [and the LSE (B, Hq, S)]."""
    scale = _prepare(q, k, v, softmax_scale, layout)
    seqlen = q.shape[1]
    _check_world(seqlen, world_size, 0, layout)
    shard_lens = [sum(n for _, n in shard_range(seqlen, world_size, r, layout)) for r in range(world_size)]
    programs = [
        _rank_program(shard(q, world_size, r, layout), shard(k, world_size, r, layout),
                      shard(v, world_size, r, layout), world=world_size, rank=r, seqlen=seqlen, causal=causal,
                      scale=scale, layout=layout, shard_lens=shard_lens, return_lse=return_lse)
        for r in range(world_size)
    ]
    results = _drive_simulation(programs)
    out = unshard([res[0] for res in results], layout, dim=1)
    if not return_lse:
        return out
    return out, unshard([res[1] for res in results], layout, dim=2)
