"""flashcore.distributed on the GPU: the merge against a whole-key-set attention, the single-GPU ring simulation
(the same per-rank program as ring_attention) against the fp32 reference under the suite's error rule, bit-exact
reruns, and ring_attention over torch.distributed with NCCL on two GPUs (bit-identical to the simulation).

Needs torch, a CUDA GPU and libflashcore.so; the two-process test needs two GPUs and NCCL."""

import os
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import distributed as fcd  # noqa: E402
from reference import reference  # noqa: E402

ATOL = {torch.float16: 1e-3, torch.bfloat16: 5e-3}


@pytest.fixture(scope="module")
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch")
    try:
        caps = flashcore.capabilities()
    except RuntimeError as exc:
        pytest.skip(f"libflashcore.so not loadable: {exc}")
    if not caps.device_supported:
        pytest.skip(f"the library has no kernel for this GPU (sm_{caps.device_arch}; compiled: {caps.archs})")
    from flashcore import _lib

    if "flashcore_attention_merge" not in _lib.load()._optional:
        pytest.skip("the library predates flashcore_attention_merge")
    return torch.device("cuda", torch.cuda.current_device())


def _inputs(device, dtype, batch, seqlen, heads_q, heads_kv, head_dim, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, seqlen, heads_q, head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(batch, seqlen, heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(batch, seqlen, heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    return q, k, v


def _check(out, lse, q, k, v, causal):
    ref_out, ref_lse = reference(q, k, v, causal)
    base_out, _ = reference(q, k, v, causal, upcast=False)
    err = (out.float() - ref_out).abs().max().item()
    base_err = (base_out.float() - ref_out).abs().max().item()
    assert err <= 2 * base_err + ATOL[q.dtype], f"ring error {err:.3g} vs SDPA {q.dtype} error {base_err:.3g}"
    torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=1e-3)


CASES = [  # (world, seqlen, heads_q, heads_kv, head_dim, dtype)
    (1, 113, 4, 4, 64, torch.bfloat16),
    (2, 17, 4, 2, 128, torch.float16),
    (2, 4097, 8, 2, 128, torch.bfloat16),
    (3, 113, 8, 8, 64, torch.float16),
    (4, 1000, 16, 2, 128, torch.bfloat16),
    (2, 513, 4, 1, 256, torch.bfloat16),
    (5, 259, 4, 4, 256, torch.float16),
]


@pytest.mark.parametrize("case", CASES, ids=[f"w{c[0]}-s{c[1]}-h{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}" for c in CASES])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_simulation_matches_reference(cuda, case, layout, causal):
    world, seqlen, hq, hkv, d, dtype = case
    q, k, v = _inputs(cuda, dtype, 2, seqlen, hq, hkv, d, seed=world * 7 + seqlen)
    out, lse = fcd.ring_attention_simulate(q, k, v, world, causal=causal, layout=layout, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (2, hq, seqlen)
    _check(out, lse, q, k, v, causal)


def test_simulation_is_bit_exact_across_runs(cuda):
    q, k, v = _inputs(cuda, torch.bfloat16, 1, 2048, 8, 2, 128, seed=3)
    first = fcd.ring_attention_simulate(q, k, v, 4, causal=True)
    for _ in range(3):
        assert torch.equal(fcd.ring_attention_simulate(q, k, v, 4, causal=True), first)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_merge_of_two_key_halves_is_the_whole(cuda, dtype, head_dim):
    q, k, v = _inputs(cuda, dtype, 2, 300, 4, 2, head_dim, seed=head_dim)
    cut = 123
    o1, l1 = flashcore.attention(q, k[:, :cut], v[:, :cut], return_lse=True)
    o2, l2 = flashcore.attention(q, k[:, cut:], v[:, cut:], return_lse=True)
    # a strided state: the rows of a larger buffer
    o_acc = torch.full((2, 400, 4, head_dim), float("nan"), device=cuda)[:, 50:350]
    lse_acc = torch.full((2, 4, 400), float("nan"), device=cuda)[:, :, 50:350]
    out = torch.full_like(q, float("nan"))
    fcd.merge_attention_states(o_acc, lse_acc, o1, l1, init=True)
    fcd.merge_attention_states(o_acc, lse_acc, o2, l2, out=out)
    _check(out, lse_acc, q, k, v, False)
    torch.testing.assert_close(out.float(), o_acc, atol=1e-2, rtol=0)
    again = torch.full_like(q, float("nan"))
    fcd.merge_attention_states(o_acc, lse_acc, out=again)  # no part: only the output from the state
    assert torch.equal(again, out)


def test_merge_errors_name_the_argument(cuda):
    o = torch.zeros(1, 8, 2, 64, device=cuda)
    lse = torch.zeros(1, 2, 8, device=cuda)
    with pytest.raises(ValueError, match="lse_part has shape"):
        fcd.merge_attention_states(o, lse, o.half(), torch.zeros(1, 2, 7, device=cuda))
    with pytest.raises(TypeError, match="o_acc must be float32"):
        fcd.merge_attention_states(o.half(), lse, o.half(), lse)
    with pytest.raises(ValueError, match="head_dim|FLASHCORE_ERROR"):  # the library's own check
        fcd.merge_attention_states(torch.zeros(1, 8, 2, 48, device=cuda), lse, torch.zeros(1, 8, 2, 48,
                                   device=cuda, dtype=torch.half), lse)


# ---------------------------------------------------------------------------------------------------------------
# Two processes, two GPUs, NCCL.


def _worker(rank, world, init_file, result_dir, layout, causal, overlap):
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", world_size=world, rank=rank)
    try:
        device = torch.device("cuda", rank)
        q, k, v = _inputs(device, torch.bfloat16, 1, 4099, 8, 2, 128, seed=11)  # the same tensors on every rank
        mine = [fcd.shard(t, world, rank, layout) for t in (q, k, v)]
        out, lse = fcd.ring_attention(*mine, causal=causal, layout=layout, overlap=overlap, return_lse=True)
        torch.cuda.synchronize()
        torch.save({"out": out.cpu(), "lse": lse.cpu()}, os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serialized"])
@pytest.mark.parametrize("layout,causal", [("zigzag", True), ("contiguous", True), ("zigzag", False)])
def test_ring_over_nccl_matches_the_simulation_bit_for_bit(cuda, layout, causal, overlap):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs for a two-rank NCCL ring, {torch.cuda.device_count()} visible")
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    world = 2
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "init"), tmp, layout, causal, overlap), nprocs=world)
        results = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]
    q, k, v = _inputs(cuda, torch.bfloat16, 1, 4099, 8, 2, 128, seed=11)
    sim_out, sim_lse = fcd.ring_attention_simulate(q, k, v, world, causal=causal, layout=layout, return_lse=True)
    for r in range(world):
        assert torch.equal(results[r]["out"], fcd.shard(sim_out, world, r, layout).cpu()), f"rank {r} O"
        assert torch.equal(results[r]["lse"], fcd.shard(sim_lse, world, r, layout, dim=2).cpu()), f"rank {r} LSE"
    _check(sim_out, sim_lse, q, k, v, causal)
