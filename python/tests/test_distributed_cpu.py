"""flashcore.distributed's plan on the CPU: shards, their inverse, the step pieces (every causal (query, key) pair
computed exactly once over the ring), agreement with the C library's flashcore_ring_shard, and argument errors."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from flashcore import _lib  # noqa: E402
from flashcore import distributed as fcd  # noqa: E402

WORLDS = [1, 2, 3, 4, 5, 8]
SEQLENS = [16, 17, 113, 4097]


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seqlen", SEQLENS)
def test_shards_partition_the_sequence(layout, world, seqlen):
    rows = []
    for rank in range(world):
        ranges = fcd.shard_range(seqlen, world, rank, layout)
        assert len(ranges) == (2 if layout == "zigzag" else 1)
        assert all(length >= 1 for _, length in ranges)
        for start, length in ranges:
            rows.extend(range(start, start + length))
    assert sorted(rows) == list(range(seqlen))
    lens = [sum(n for _, n in fcd.shard_range(seqlen, world, r, layout)) for r in range(world)]
    assert max(lens) - min(lens) <= (2 if layout == "zigzag" else 1)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_unshard_round_trip(layout, world):
    x = torch.randn(2, 37, 3, 8)
    shards = [fcd.shard(x, world, r, layout) for r in range(world)]
    assert sum(s.shape[1] for s in shards) == 37
    assert torch.equal(fcd.unshard(shards, layout), x)
    lse = torch.randn(2, 3, 37)
    assert torch.equal(fcd.unshard([fcd.shard(lse, world, r, layout, dim=2) for r in range(world)], layout, dim=2), lse)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seqlen", [16, 17, 113])
@pytest.mark.parametrize("causal", [False, True])
def test_pieces_cover_the_mask_exactly_once(layout, world, seqlen, causal):
    if seqlen < 2 * world:
        pytest.skip("sequence shorter than the ring's chunks")
    count = torch.zeros(seqlen, seqlen, dtype=torch.int32)
    for rank in range(world):
        q_rows = [r for s, n in fcd.shard_range(seqlen, world, rank, layout) for r in range(s, s + n)]
        for step in range(world):
            src = fcd.kv_source(world, rank, step)
            k_rows = [r for s, n in fcd.shard_range(seqlen, world, src, layout) for r in range(s, s + n)]
            piece = fcd.step_piece(seqlen, world, rank, step, causal, layout)
            if piece is None:
                continue
            for qi in q_rows[piece.q_begin:piece.q_begin + piece.q_len]:
                for kj in k_rows[piece.k_begin:piece.k_begin + piece.k_len]:
                    # within a causal piece the local mask is the global one (the local order is the global order)
                    if not piece.causal or kj <= qi:
                        count[qi, kj] += 1
    expected = torch.ones(seqlen, seqlen, dtype=torch.int32)
    if causal:
        expected = torch.tril(expected)
    assert torch.equal(count, expected)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_zigzag_balances_causal_work(world):
    seqlen = 64 * world
    for step in range(1, world):
        work = []
        for rank in range(world):
            p = fcd.step_piece(seqlen, world, rank, step, True, "zigzag")
            work.append(p.q_len * p.k_len)
        assert max(work) == min(work), f"step {step}: {work}"


def test_shard_ranges_match_the_c_library():
    try:
        lib = _lib.load()
    except RuntimeError as exc:
        pytest.skip(f"libflashcore.so not loadable: {exc}")
    if "flashcore_ring_shard" not in lib._optional:
        pytest.skip(f"{lib.path} predates flashcore_ring_shard")
    for layout, code in fcd.LAYOUTS.items():
        for world in WORLDS:
            for seqlen in SEQLENS:
                for rank in range(world):
                    ((s0, n0), (s1, n1)) = lib.ring_shard(seqlen, world, rank, code)
                    c_ranges = [(s0, n0)] + ([(s1, n1)] if n1 else [])
                    assert fcd.shard_range(seqlen, world, rank, layout) == c_ranges, (layout, world, seqlen, rank)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="layout"):
        fcd.shard_range(16, 2, 0, "striped")
    with pytest.raises(ValueError, match="world_size"):
        fcd.shard_range(16, 0, 0)
    with pytest.raises(ValueError, match="rank"):
        fcd.shard_range(16, 2, 2)
    with pytest.raises(ValueError, match="too short"):
        fcd.shard_range(3, 2, 0, "zigzag")
    with pytest.raises(ValueError, match="shard 0 has 5 rows"):
        fcd.unshard([torch.zeros(1, 5, 1, 8), torch.zeros(1, 2, 1, 8)], "contiguous")
    with pytest.raises(ValueError, match="o_part and lse_part"):
        fcd.merge_attention_states(torch.zeros(1, 1, 1, 64), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1, 64))
    with pytest.raises(ValueError, match="same rows"):
        fcd.ring_attention_simulate(torch.zeros(1, 8, 1, 64, dtype=torch.float16),
                                    torch.zeros(1, 9, 1, 64, dtype=torch.float16),
                                    torch.zeros(1, 9, 1, 64, dtype=torch.float16), 2)
