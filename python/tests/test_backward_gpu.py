"""The backward of flashcore.attention / flashcore.sdpa on the GPU (flashcore_attention_backward, since 0.4).

Reference: the gradients of float64 attention (reference.reference_grads: the inputs upcast, plain torch ops,
autograd). Error rule, per gradient (dq, dk, dv): max |FlashCore - reference| <= 2 * max |SDPA - reference| + atol,
SDPA being torch's scaled_dot_product_attention at the inputs' dtype (default backend) differentiated by autograd,
and atol = ATOL[dtype] * max(1, max |reference|) (gradients are not of unit size). Needs torch, a CUDA GPU and a
libflashcore.so with the backward (FLASHCORE_LIBRARY=build/lib/libflashcore.so); skips otherwise, with the reason.
Head dims 96, 192 and (head_dim, head_dim_v) = (192, 128) (0.9): the sm90 backend's backward, where the library has
the kernel (asked of it); they skip elsewhere, naming why."""

import itertools
import math
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import torch.nn.functional as F  # noqa: E402

import flashcore  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from reference import causal_mask, reference_grads  # noqa: E402

ATOL = {torch.float16: 1e-3, torch.bfloat16: 5e-3}
BACKWARD_HEAD_DIMS = (64, 128)  # every backend's
# The sm90 backend's besides (0.9): (head_dim, head_dim_v), None meaning v of q's head dim.
SM90_HEAD_DIMS = [(96, None), (192, None), (192, 128)]
SM90_IDS = ["d96", "d192", "d192-dv128"]


@pytest.fixture(scope="module")
def caps(cuda):
    try:
        caps = flashcore.capabilities()
    except RuntimeError as exc:
        pytest.skip(f"libflashcore.so not loadable: {exc}")
    if not caps.device_supported:
        pytest.skip(f"the library has no kernel for this GPU (sm_{caps.device_arch}; compiled: {caps.archs})")
    lib = _lib.load()
    if not lib.has_backward():
        pytest.skip(f"{lib.path} ({lib.version_string()}) has no flashcore_attention_backward (0.4 needed)")
    return caps


def _need(caps, dtype, head_dim):
    if str(dtype).replace("torch.", "") not in caps.dtypes or head_dim not in caps.head_dims:
        pytest.skip(f"{dtype} / head_dim {head_dim} not compiled in ({caps.dtypes}, {caps.head_dims})")


def _inputs(device, dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, seed=0, head_dim_v=None):
    """q, k, v, dout; v and dout of head_dim_v columns when given (v with a head dim of its own), else head_dim."""
    dv = head_dim if head_dim_v is None else head_dim_v
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(batch, seqlen_k, heads_kv, dv, device=device, dtype=dtype, generator=gen)
    dout = torch.randn(batch, seqlen_q, heads_q, dv, device=device, dtype=dtype, generator=gen)
    return q, k, v, dout


def _backward_refusal(device, dtype, head_dim, head_dim_v=None):
    """The library's refusal (its error, one line) of the backward of (head_dim, head_dim_v) in dtype on this device,
    asked with the workspace query of a tiny call (no launch); None when it takes it."""
    lib = _lib.load()
    q, k, v, dout = _inputs(device, dtype, 1, 16, 16, 2, 1, head_dim, head_dim_v=head_dim_v)
    out, lse = torch.empty_like(dout), torch.zeros(1, 2, 16, device=device)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    params = _ops.backward_params(lib, dout, q, k, v, out, lse, dq, dk, dv, False, 0.0, False)
    try:
        lib.backward_workspace_size(params)
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def _need_sm90_backward(caps, device, dtype, head_dim, head_dim_v=None):
    """Skips, naming why, unless this device runs the sm90 backend and the library has the backward of (head_dim,
    head_dim_v) (0.9: 96, 192 and (192, 128)) in dtype."""
    what = f"head_dim {head_dim}" + (f", head_dim_v {head_dim_v}" if head_dim_v is not None else "")
    if head_dim_v is None:
        _need(caps, dtype, head_dim)
    elif (str(dtype).replace("torch.", "") not in caps.dtypes
          or (head_dim, head_dim_v) not in {tuple(p) for p in caps.head_dim_pairs}):
        pytest.skip(f"{dtype} / (head_dim, head_dim_v) ({head_dim}, {head_dim_v}) not compiled in ({caps.dtypes}, "
                    f"pairs {caps.head_dim_pairs})")
    if caps.device_backend != "sm90":
        pytest.skip(f"the backward of {what}: the sm90 backend's (this device, sm_{caps.device_arch}, runs the "
                    f"{caps.device_backend} backend)")
    refusal = _backward_refusal(device, dtype, head_dim, head_dim_v)
    if refusal is not None:
        pytest.skip(f"{_lib.load().path} ({_lib.load().version_string()}) has no backward for {what}, {dtype}: "
                    f"{refusal}")


def sdpa_grads(q, k, v, dout, causal=False, softmax_scale=None):
    """(dq, dk, dv) of torch SDPA at the inputs' dtype (default backend), for (B, S, H, D) tensors: the baseline.
    Bottom-right causal masks; rows that see no key are unmasked for SDPA and their output zeroed (no gradient)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    heads_q, heads_kv = q.shape[2], k.shape[2]
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    qt = leaves[0].transpose(1, 2)
    kt, vt = (t.transpose(1, 2).repeat_interleave(heads_q // heads_kv, dim=1) for t in leaves[1:])
    mask, empty = None, None
    if causal and seqlen_q != seqlen_k:
        mask = causal_mask(seqlen_q, seqlen_k, q.device)
        empty = ~mask.any(dim=-1)
        mask = mask | empty[:, None]
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal and mask is None,
                                         scale=softmax_scale)
    if empty is not None:
        out = out.masked_fill(empty[:, None], 0.0)
    out.transpose(1, 2).backward(dout)
    return tuple(t.grad for t in leaves)


def check_grads(q, k, v, dout, causal, softmax_scale=None, grads=None, deterministic=False):
    """Run flashcore.attention forward and backward (unless `grads` are given) and check them against the float64
    reference with the error rule. Returns (dq, dk, dv)."""
    if grads is None:
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = flashcore.attention(*leaves, causal=causal, softmax_scale=softmax_scale, deterministic=deterministic)
        out.backward(dout)
        grads = tuple(t.grad for t in leaves)
    want = reference_grads(q, k, v, dout, causal, softmax_scale)
    base = sdpa_grads(q, k, v, dout, causal, softmax_scale)
    for name, got, ref, sdpa, like in zip(("dq", "dk", "dv"), grads, want, base, (q, k, v)):
        assert got.shape == like.shape and got.dtype == like.dtype, name
        assert torch.isfinite(got).all(), f"{name} has non-finite values"
        err = (got.double() - ref).abs().max().item()
        base_err = (sdpa.double() - ref).abs().max().item()
        atol = ATOL[q.dtype] * max(1.0, ref.abs().max().item())
        assert err <= 2 * base_err + atol, f"{name}: flashcore error {err:.3g} vs SDPA {q.dtype} error {base_err:.3g}"
    return grads


SEQLENS = [(1, 1), (17, 17), (113, 113), (128, 128), (1, 113), (17, 113), (113, 17), (300, 1000)]
HEADS = [(4, 4), (8, 2), (8, 1)]  # MHA, GQA 4, MQA


@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"sq{a}-sk{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("heads", HEADS, ids=[f"hq{a}-hkv{b}" for a, b in HEADS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", BACKWARD_HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_grads_match_reference(caps, cuda, dtype, head_dim, causal, heads, seqlens):
    _need(caps, dtype, head_dim)
    check_grads(*_inputs(cuda, dtype, 2, *seqlens, *heads, head_dim), causal)


SEQLENS_256 = [(1, 1), (17, 113), (113, 113), (300, 1000), (1000, 300)]


@pytest.mark.parametrize("seqlens", SEQLENS_256, ids=[f"sq{a}-sk{b}" for a, b in SEQLENS_256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_head_dim_256(caps, cuda, dtype, causal, seqlens):
    """Head dim 256 (0.9, the sm90 backend's wide kernel: dK and dV split by columns between its warpgroups), GQA."""
    _need(caps, dtype, 256)
    lib = _lib.load()
    if tuple(lib.version[:2]) < (0, 9) or caps.device_arch // 10 != 9 or os.environ.get("FLASHCORE_BACKEND") == "sm80":
        pytest.skip("head dim 256's backward: the sm90 backend of a 0.9 library")
    check_grads(*_inputs(cuda, dtype, 2, *seqlens, 8, 2, 256), causal)


SEQLENS_SM90 = [(1, 1), (17, 113), (113, 113), (300, 1000), (1000, 300)]
HEADS_SM90 = [(4, 4), (8, 2)]  # MHA, GQA 4


@pytest.mark.parametrize("seqlens", SEQLENS_SM90, ids=[f"sq{a}-sk{b}" for a, b in SEQLENS_SM90])
@pytest.mark.parametrize("heads", HEADS_SM90, ids=[f"hq{a}-hkv{b}" for a, b in HEADS_SM90])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dims", SM90_HEAD_DIMS, ids=SM90_IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sm90_head_dims(caps, cuda, dtype, head_dims, causal, heads, seqlens):
    """Head dims 96 and 192, and q / k of 192 with v of 128 (DeepSeek MLA; dout 128 columns, dv of v's shape): the
    sm90 backend's backward (0.9), with the error rule."""
    head_dim, head_dim_v = head_dims
    _need_sm90_backward(caps, cuda, dtype, head_dim, head_dim_v)
    check_grads(*_inputs(cuda, dtype, 2, *seqlens, *heads, head_dim, head_dim_v=head_dim_v), causal)


@pytest.mark.parametrize("head_dims", SM90_HEAD_DIMS, ids=SM90_IDS)
def test_sm90_head_dims_deterministic(caps, cuda, head_dims):
    """deterministic=True at head dims 96, 192 and (192, 128): two runs give the same gradients bit for bit, within
    the error rule."""
    head_dim, head_dim_v = head_dims
    _need_sm90_backward(caps, cuda, torch.bfloat16, head_dim, head_dim_v)
    q, k, v, dout = _inputs(cuda, torch.bfloat16, 2, 512, 512, 16, 2, head_dim, head_dim_v=head_dim_v)
    first = check_grads(q, k, v, dout, True, deterministic=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    flashcore.attention(*leaves, causal=True, deterministic=True).backward(dout)
    for name, t, want in zip(("dq", "dk", "dv"), leaves, first):
        assert torch.equal(t.grad, want), f"{name} differs between two deterministic runs"


def test_head_dim_v_sdpa_front_end_and_lse(caps, cuda):
    """(192, 128) through flashcore.sdpa (value (B, H, S, 128), gradients of the inputs' layout), and a loss on out
    and lse through flashcore.attention (the gradient through lse: a second backward whose dO has q's head dim)."""
    _need_sm90_backward(caps, cuda, torch.bfloat16, 192, 128)
    q, k, v, dout = _inputs(cuda, torch.bfloat16, 2, 200, 300, 8, 2, 192, head_dim_v=128)
    qb, kb, vb = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    out = flashcore.sdpa(qb, kb, vb, is_causal=True, enable_gqa=True)
    assert out.shape == (2, 8, 200, 128)
    out.backward(dout.transpose(1, 2))
    for t in (qb, kb, vb):
        assert t.grad.is_contiguous(), "the gradient of a (B, H, S, D) tensor has its layout"
    check_grads(q, k, v, dout, True, grads=tuple(t.grad.transpose(1, 2) for t in (qb, kb, vb)))
    check_grads_through_lse(q, k, v, dout)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_long_sequence(caps, cuda, causal):
    _need(caps, torch.bfloat16, 128)
    check_grads(*_inputs(cuda, torch.bfloat16, 1, 2048, 2048, 16, 2, 128), causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_custom_softmax_scale(caps, cuda, dtype):
    _need(caps, dtype, 128)
    check_grads(*_inputs(cuda, dtype, 2, 77, 200, 8, 2, 128), True, softmax_scale=0.3)


def test_rows_without_keys_get_no_gradient(caps, cuda):
    _need(caps, torch.bfloat16, 64)
    q, k, v, dout = _inputs(cuda, torch.bfloat16, 2, 40, 16, 4, 4, 64)
    dq, _, _ = check_grads(q, k, v, dout, True)
    assert torch.all(dq[:, :24] == 0)  # query i sees key j iff j <= i - 24


def test_strided_inputs_and_grad_out(caps, cuda):
    """q a (B, H, S, D) tensor viewed as (B, S, H, D), k and v head slices of one packed tensor, dout with a
    strided last dimension (copied) or a transposed layout (passed as it is): the same gradients, bit for bit, as
    contiguous tensors, and the error rule."""
    _need(caps, torch.bfloat16, 64)
    q0, k0, v0, dout0 = _inputs(cuda, torch.bfloat16, 2, 97, 97, 8, 2, 64)
    q = q0.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    kv = torch.cat([k0, v0], dim=2).requires_grad_()
    k, v = kv[:, :, :2], kv[:, :, 2:]
    for t in (q, k, v):
        assert not _ops.kernel_operand(t)[2], "expected a zero-copy operand"
    douts = {
        "strided last dim": torch.stack([dout0, torch.zeros_like(dout0)], dim=-1)[..., 0],
        "(B, H, S, D) storage": dout0.transpose(1, 2).contiguous().transpose(1, 2),
    }
    assert _ops.kernel_operand(douts["strided last dim"])[2]  # copied
    assert not _ops.kernel_operand(douts["(B, H, S, D) storage"])[2]  # passed as it is
    contiguous = check_grads(q0, k0, v0, dout0, True, deterministic=True)
    for name, dout in douts.items():
        q.grad = kv.grad = None
        flashcore.attention(q, k, v, causal=True, deterministic=True).backward(dout)
        assert q.grad.stride() == q.stride(), "dq should have q's layout"
        dk, dv = kv.grad[:, :, :2], kv.grad[:, :, 2:]
        for got, want in zip((q.grad, dk, dv), contiguous):
            torch.testing.assert_close(got, want, atol=0, rtol=0, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_front_end(caps, cuda, causal):
    _need(caps, torch.float16, 128)
    q, k, v, dout = _inputs(cuda, torch.float16, 2, 256, 256, 8, 2, 128)
    qb, kb, vb = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))  # genuine (B, H, S, D)
    out = flashcore.sdpa(qb, kb, vb, is_causal=causal, scale=0.1, enable_gqa=True)
    out.backward(dout.transpose(1, 2))
    for t in (qb, kb, vb):
        assert t.grad.is_contiguous(), "the gradient of a (B, H, S, D) tensor has its layout"
    check_grads(q, k, v, dout, causal, 0.1, grads=tuple(t.grad.transpose(1, 2) for t in (qb, kb, vb)))


def test_grads_through_lse(caps, cuda):
    """A loss on out and lse: the gradient through lse (computed with a second forward and backward) matches float64
    autograd."""
    _need(caps, torch.bfloat16, 64)
    check_grads_through_lse(*_inputs(cuda, torch.bfloat16, 2, 100, 150, 8, 2, 64))


def check_grads_through_lse(q, k, v, dout):
    """A causal flashcore.attention's loss on out and lse (a random dlse): q, k, v's gradients against float64
    autograd's, within 2e-2 of the largest (at least 1)."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = flashcore.attention(*leaves, causal=True, return_lse=True)
    dlse = torch.randn_like(lse)
    torch.autograd.backward([out, lse], [dout, dlse])
    want = reference_grads(q, k, v, dout, True, dlse=dlse)
    for name, t, w in zip(("dq", "dk", "dv"), leaves, want):
        assert t.grad.shape == t.shape, name
        err = (t.grad.double() - w).abs().max().item()
        assert err <= 2e-2 * max(1.0, w.abs().max().item()), f"{name}: {err:.3g}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_deterministic_is_bit_identical(caps, cuda, dtype, causal):
    """deterministic=True: two runs give the same dq, dk, dv bit for bit (a larger call in between), within the error
    rule. Many query blocks per key block and a GQA group of 8, where an atomic dq order would differ."""
    _need(caps, dtype, 128)
    q, k, v, dout = _inputs(cuda, dtype, 2, 1024, 1024, 16, 2, 128)
    first = check_grads(q, k, v, dout, causal, deterministic=True)
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        flashcore.attention(*leaves, causal=causal, deterministic=True).backward(dout)
        for name, t, want in zip(("dq", "dk", "dv"), leaves, first):
            assert torch.equal(t.grad, want), f"{name} differs between two deterministic runs"
        other = [t.repeat(2, 1, 1, 1).requires_grad_() for t in (q, k, v)]
        flashcore.attention(*other, causal=not causal).backward(dout.repeat(2, 1, 1, 1))


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_backward(caps, cuda, dynamic):
    """torch.compile(fullgraph=True) of a function calling flashcore.attention, then .backward(): the gradients
    equal eager's (deterministic=True: bit for bit)."""
    _need(caps, torch.bfloat16, 128)
    torch._dynamo.reset()

    def loss(q, k, v, weight):
        out = flashcore.attention(q, k, v, causal=True, deterministic=True)
        return (out.float() * weight).sum()

    compiled = torch.compile(loss, fullgraph=True, dynamic=dynamic)
    for seqlen in (64, 100):
        q, k, v, dout = _inputs(cuda, torch.bfloat16, 2, seqlen, seqlen, 8, 2, 128)
        weight = dout.float()
        grads = []
        for fn in (compiled, loss):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            fn(*leaves, weight).backward()
            grads.append([t.grad for t in leaves])
        for got, want in zip(*grads):
            torch.testing.assert_close(got, want, atol=0, rtol=0)
        check_grads(q, k, v, dout, True, grads=tuple(grads[0]))


def test_cuda_graph_forward_and_backward(caps, cuda):
    """Forward and backward captured in one CUDA graph (static inputs and grad_out), replayed with new contents: the
    same gradients as eager calls, bit for bit (deterministic=True)."""
    _need(caps, torch.bfloat16, 128)
    q, k, v, dout = (t.clone() for t in _inputs(cuda, torch.bfloat16, 2, 200, 300, 8, 4, 128))
    for t in (q, k, v):
        t.requires_grad_()

    def step():
        out = flashcore.attention(q, k, v, causal=True, deterministic=True)
        out.backward(dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in (q, k, v):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    static_grads = (q.grad, k.grad, v.grad)
    for seed in (1, 2):
        new = _inputs(cuda, torch.bfloat16, 2, 200, 300, 8, 4, 128, seed=seed)
        with torch.no_grad():
            for static, value in zip((q, k, v, dout), new):
                static.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        leaves = [t.clone().requires_grad_() for t in new[:3]]
        flashcore.attention(*leaves, causal=True, deterministic=True).backward(new[3])
        for name, got, t in zip(("dq", "dk", "dv"), static_grads, leaves):
            assert torch.equal(got, t.grad), f"{name}: graph replay differs from eager"


def test_backward_on_a_side_stream(caps, cuda):
    _need(caps, torch.float16, 64)
    q, k, v, dout = _inputs(cuda, torch.float16, 2, 64, 64, 4, 4, 64)
    want = check_grads(q, k, v, dout, False, deterministic=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        flashcore.attention(*leaves, deterministic=True).backward(dout)
    torch.cuda.current_stream().wait_stream(side)
    for got, t in zip(want, leaves):
        assert torch.equal(got, t.grad)


def test_unsupported_head_dim_raises_from_the_library(caps, cuda):
    """A head dim with a forward but no backward on this device (256 in 0.4; 96, 192 and 256 off the sm90 backend):
    the library's error, naming the field, at backward."""
    head_dim = next((d for d in caps.head_dims if d not in BACKWARD_HEAD_DIMS
                     and _backward_refusal(cuda, torch.bfloat16, d) is not None), None)
    if head_dim is None:
        pytest.skip(f"every compiled head dim {caps.head_dims} has a backward on this device")
    q, k, v, dout = _inputs(cuda, torch.bfloat16, 1, 32, 32, 2, 2, head_dim)
    q.requires_grad_()
    out = flashcore.attention(q, k, v)
    with pytest.raises((ValueError, TypeError), match="head_dim"):
        out.backward(dout)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", BACKWARD_HEAD_DIMS)
def test_varlen_backward_matches_each_sequence(caps, cuda, head_dim, causal):
    """Packed sequences (cu_seqlens): each sequence's gradients pass the error rule against its own float64
    reference and SDPA."""
    _need(caps, torch.bfloat16, head_dim)
    lens_q, lens_k = [17, 64, 1, 200, 130], [33, 64, 5, 200, 257]
    if causal:
        lens_k = lens_q
    heads_q, heads_kv = 4, 2
    gen = torch.Generator(device=cuda).manual_seed(5)
    def packed(lens, heads):
        return torch.randn(sum(lens), heads, head_dim, device=cuda, dtype=torch.bfloat16, generator=gen)
    q, dout = packed(lens_q, heads_q), packed(lens_q, heads_q)
    k, v = packed(lens_k, heads_kv), packed(lens_k, heads_kv)
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device=cuda)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device=cuda)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flashcore.varlen_attention(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    out.backward(dout)
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        one = lambda t, s: t[s].unsqueeze(0)
        check_grads(one(q, qs), one(k, ks), one(v, ks), one(dout, qs), causal,
                    grads=(one(leaves[0].grad, qs), one(leaves[1].grad, ks), one(leaves[2].grad, ks)))


def test_varlen_backward_with_seqused(caps, cuda):
    """seqused_q / seqused_k (0.9): the gradients of each sequence's used rows are those of the used part alone, the
    unused rows' zeros."""
    _need(caps, torch.bfloat16, 64)
    if caps.device_backend != "sm90":
        pytest.skip(f"the {caps.device_backend} backend's backward takes dense batches only")
    q, k, v, _ = _inputs(cuda, torch.bfloat16, 1, 12, 12, 4, 2, 64)
    q, k, v = (t[0].detach().requires_grad_() for t in (q, k, v))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=cuda)
    used_q = torch.tensor([4, 7], dtype=torch.int32, device=cuda)
    used_k = torch.tensor([5, 6], dtype=torch.int32, device=cuda)
    dout = torch.randn(12, 4, 64, device=cuda, dtype=torch.bfloat16)
    out = flashcore.varlen_attention(q, k, v, cu, cu, 7, 7, causal=True, seqused_q=used_q, seqused_k=used_k)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    assert torch.count_nonzero(dq[4]) == 0 and torch.count_nonzero(dk[11]) == 0 and torch.count_nonzero(dv[11]) == 0
    for qs, ks in ((slice(0, 4), slice(0, 5)), (slice(5, 12), slice(5, 11))):
        one = lambda t, s: t[s].unsqueeze(0)  # noqa: E731
        check_grads(one(q, qs), one(k, ks), one(v, ks), one(dout, qs), True,
                    grads=(one(dq, qs), one(dk, ks), one(dv, ks)))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dims", SM90_HEAD_DIMS, ids=SM90_IDS)
def test_varlen_backward_sm90_head_dims(caps, cuda, head_dims, causal):
    """Packed sequences at head dims 96, 192 and (192, 128) (v, out, dout and dv of 128 columns): each sequence's
    gradients pass the error rule against its own float64 reference and SDPA."""
    head_dim, head_dim_v = head_dims
    dv = head_dim if head_dim_v is None else head_dim_v
    _need_sm90_backward(caps, cuda, torch.bfloat16, head_dim, head_dim_v)
    lens_q, lens_k = [17, 64, 1, 200, 130], [33, 64, 5, 200, 257]
    if causal:
        lens_k = lens_q
    heads_q, heads_kv = 8, 2
    gen = torch.Generator(device=cuda).manual_seed(7)

    def packed(lens, heads, dim):
        return torch.randn(sum(lens), heads, dim, device=cuda, dtype=torch.bfloat16, generator=gen)

    q, dout = packed(lens_q, heads_q, head_dim), packed(lens_q, heads_q, dv)
    k, v = packed(lens_k, heads_kv, head_dim), packed(lens_k, heads_kv, dv)
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device=cuda)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device=cuda)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flashcore.varlen_attention(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    assert out.shape == (sum(lens_q), heads_q, dv)
    out.backward(dout)
    assert leaves[2].grad.shape == v.shape
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        one = lambda t, s: t[s].unsqueeze(0)  # noqa: E731
        check_grads(one(q, qs), one(k, ks), one(v, ks), one(dout, qs), causal,
                    grads=(one(leaves[0].grad, qs), one(leaves[1].grad, ks), one(leaves[2].grad, ks)))
