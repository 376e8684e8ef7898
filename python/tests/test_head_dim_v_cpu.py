"""v with a head dim of its own (the C ABI's head_dim_v, since 0.7; FlashAttention-3's hdimdiff, DeepSeek-V2/V3 MLA
prefill's (head_dim, head_dim_v) = (192, 128)) without a GPU: the outputs' shapes and values with the kernel emulated
on CPU by the float64 references, the fake kernels and torch.compile, the argument errors and refusals (pairs not
compiled, 8-bit), the backward (since 0.9: dout and out of v's head dim, dv of v's shape, the library deciding on the
pair), the C params the front ends fill (through the host-only stub library), the older library (a 0.6 stub, and
whatever $FLASHCORE_LIBRARY points at)."""

import ctypes
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from reference import emulate_on_cpu, reference_fp64, reference_variants  # noqa: E402
from test_paged_cpu import paginate  # noqa: E402
from test_varlen_cpu import cu_seqlens, emulate_serving_on_cpu, ref_sequence, ref_varlen  # noqa: E402

D, DV = 192, 128  # the pair the emulated library (reference.EMULATED_HEAD_DIM_PAIRS) and the stub compile


def _qkv(b=2, sq=17, sk=33, hq=8, hkv=2, d=D, dv=DV, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, hq, d, generator=gen).to(dtype)
    k = torch.randn(b, sk, hkv, d, generator=gen).to(dtype)
    v = torch.randn(b, sk, hkv, dv, generator=gen).to(dtype)
    return q, k, v


def _packed(lens_q, lens_k, hq=8, hkv=2, d=D, dv=DV, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), hq, d, generator=gen).to(dtype)
    k = torch.randn(sum(lens_k), hkv, d, generator=gen).to(dtype)
    v = torch.randn(sum(lens_k), hkv, dv, generator=gen).to(dtype)
    return q, k, v, cu_seqlens(lens_q), cu_seqlens(lens_k)


@pytest.fixture
def emulated(monkeypatch):
    """flashcore.attention / sdpa and the backward emulated (reference.emulate_on_cpu)."""
    emulate_on_cpu(monkeypatch)


@pytest.fixture
def serving(monkeypatch):
    """varlen_attention and attention_with_kvcache emulated (test_varlen_cpu.emulate_serving_on_cpu)."""
    calls = []
    emulate_serving_on_cpu(monkeypatch, calls)
    return calls


# ---------------------------------------------------------------------------------------------------------------
# The float64 references with dv != d.


def test_references_take_a_v_of_its_own_head_dim():
    """reference_fp64, reference_variants and ref_sequence give (.., Dv) outputs equal to the attention weights
    (computed from q and k alone) applied to v, and the same lse as with a v of q's head dim."""
    q, k, v = _qkv(b=1, sq=5, sk=9, hq=4, hkv=2, dtype=torch.float64)
    scale = 1.0 / math.sqrt(D)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, dim=2)) * scale
    mask = torch.arange(9)[None, :] <= torch.arange(5)[:, None] + 4
    probs = scores.masked_fill(~mask, -math.inf).softmax(-1)
    want = torch.einsum("bhqk,bkhd->bqhd", probs, v.repeat_interleave(2, dim=2))
    for out, lse in (reference_fp64(q, k, v, causal=True), reference_variants(q, k, v, causal=True),
                     tuple(t[None] for t in ref_sequence(q[0], k[0], v[0], causal=True))):
        assert out.shape == (1, 5, 4, DV)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(lse, reference_fp64(q, k, torch.zeros_like(k), causal=True)[1])


# ---------------------------------------------------------------------------------------------------------------
# Outputs (.., Dv), the kernel emulated.


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlens", [(1, 1), (17, 17), (1, 33), (33, 17)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
def test_attention_output_has_v_head_dim(emulated, causal, seqlens, heads):
    q, k, v = _qkv(sq=seqlens[0], sk=seqlens[1], hq=heads[0], hkv=heads[1])
    out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True)
    assert out.shape == (2, seqlens[0], heads[0], DV) and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (2, heads[0], seqlens[0]) and lse.dtype == torch.float32
    ref_out, ref_lse = reference_fp64(q, k, v, causal)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)


def test_attention_with_variants(emulated):
    q, k, v = _qkv(sq=33, sk=33)
    sinks = torch.linspace(-1.0, 1.0, 8)
    out = flashcore.attention(q, k, v, causal=True, window_size=(7, 0), softcap=30.0, sinks=sinks)
    assert out.shape == (2, 33, 8, DV)
    ref_out, _ = reference_variants(q, k, v, True, None, (7, 0), 30.0, sinks)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)


def test_sdpa_output_has_value_head_dim(emulated):
    """As torch's scaled_dot_product_attention: value (B, H, S, Ev) gives (B, H, L, Ev)."""
    q, k, v = _qkv(sq=17, sk=17, hq=4, hkv=4)
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
    out = flashcore.sdpa(qb, kb, vb, is_causal=True)
    assert out.shape == (2, 4, 17, DV)
    expected = torch.nn.functional.scaled_dot_product_attention(qb.double(), kb.double(), vb.double(), is_causal=True)
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)


def test_no_keys_gives_zero_rows_of_v_head_dim(emulated):
    q, k, v = _qkv(sk=0)
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    assert out.shape == (2, 17, 8, DV) and torch.all(out == 0) and torch.all(lse == -math.inf)
    assert flashcore.attention(*_qkv(sq=0)).shape == (2, 0, 8, DV)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_output_has_v_head_dim(serving, causal):
    lens_q, lens_k = [3, 0, 1, 17, 8], [5, 4, 0, 17, 2]
    q, k, v, cq, ck = _packed(lens_q, lens_k)
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, 17, 17, causal=causal, return_lse=True)
    assert out.shape == (q.shape[0], 8, DV) and lse.shape == (8, q.shape[0])
    ref_out, ref_lse = ref_varlen(q, k, v, lens_q, lens_k, causal)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)
    assert serving[-1]["kind"] == "varlen"


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_kvcache_append_and_output(serving, paged):
    """k (B, n, Hkv, D) and v (B, n, Hkv, Dv) land in caches of their own head dims; out is (B, n, Hq, Dv)."""
    lengths, n = [0, 14, 30], 3
    q, k_cache, v_cache = _qkv(b=3, sq=n, sk=48, seed=1)
    k_new, v_new = (t[:, :n].clone() for t in _qkv(b=3, sq=n, sk=n, seed=2)[1:])
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    dense_k, dense_v = k_cache.clone(), v_cache.clone()
    kwargs = {}
    if paged:
        k_cache, v_cache, kwargs["block_table"] = paginate(k_cache, v_cache, lengths, 16, garbage_entries=False)
        assert v_cache.shape[1:] == (16, 2, DV)
    out, lse = flashcore.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=seqlens,
                                                causal=True, return_softmax_lse=True, **kwargs)
    assert out.shape == (3, n, 8, DV) and lse.shape == (3, 8, n)
    assert serving[-1]["kind"] == ("paged" if paged else "dense")
    for b, start in enumerate(lengths):
        kb = torch.cat([dense_k[b, :start], k_new[b]])
        vb = torch.cat([dense_v[b, :start], v_new[b]])
        ref_out, ref_lse = ref_sequence(q[b], kb, vb, causal=True)
        torch.testing.assert_close(out[b].double(), ref_out, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse[b].double(), ref_lse, atol=1e-4, rtol=1e-4)
        if not paged:
            assert torch.equal(v_cache[b, start:start + n], v_new[b])


# ---------------------------------------------------------------------------------------------------------------
# The custom ops' fake kernels and torch.compile.


def test_fake_kernels_and_opcheck(emulated, serving):
    q, k, v = _qkv()
    for op, args in (
        (torch.ops.flashcore.attention_fwd.default, (q, k, v, True, 0.0, True)),
        (torch.ops.flashcore.attention_kvcache_fwd.default,
         (q, k, v, torch.tensor([33, 5], dtype=torch.int32), True, 0.0, True)),
        (torch.ops.flashcore.varlen_attention_fwd.default,
         (*_packed([3, 9], [5, 9]), None, 9, 9, True, 0.0, True)),
    ):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        out, lse = torch.ops.flashcore.attention_fwd(fq, fk, fv, False, 0.0, True)
        assert out.shape == (2, 17, 8, DV) and lse.shape == (2, 8, 17)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph(emulated, backend):
    torch._dynamo.reset()
    q, k, v = _qkv()

    def fn(q, k, v):
        out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
        return out * 2, lse

    got = torch.compile(fn, fullgraph=True, backend=backend)(q, k, v)
    assert got[0].shape == (2, 17, 8, DV)
    for a, b in zip(got, fn(q, k, v)):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------------------------------------------------
# Argument errors and refusals, before anything is launched.


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: _qkv(dv=64), ValueError, r"\(head_dim, head_dim_v\) = \(192, 64\) is not supported"),
        (lambda: _qkv(d=64, dv=128), ValueError, r"\(head_dim, head_dim_v\) = \(64, 128\) is not supported"),
        (lambda: (_qkv()[0][..., :128], *_qkv()[1:]), ValueError, "q and k must have the same head_dim, got 128 and"),
        (lambda: (*_qkv()[:2], _qkv()[2][:, :5]), ValueError, "k and v must have the same shape but for the last"),
        (lambda: (*_qkv()[:2], _qkv()[2][:, :, :1]), ValueError, "k and v must have the same shape but for the last"),
        (lambda: (*_qkv()[:2], _qkv()[2].half()), TypeError, "q, k and v must have the same dtype"),
    ],
    ids=["pair-192-64", "pair-64-128", "q-head-dim", "v-seqlen", "v-heads", "v-dtype"],
)
def test_argument_errors(emulated, make, exc, match):
    q, k, v = make()
    for call in (lambda: flashcore.attention(q, k, v),
                 lambda: flashcore.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
                 lambda: torch.ops.flashcore.attention_fwd(q, k, v, False, 0.0, False)):
        with pytest.raises(exc, match=match):
            call()


def test_kvcache_and_varlen_argument_errors(serving):
    q, k_cache, v_cache = _qkv()
    lens = torch.tensor([5, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\(head_dim, head_dim_v\) = \(192, 64\)"):
        flashcore.attention_with_kvcache(q, k_cache, v_cache[..., :64], cache_seqlens=lens)
    with pytest.raises(ValueError, match=r"v must be \(B, Sq_new, Hkv, v_cache's head dim\) = \(2, \*, 2, 128\)"):
        flashcore.attention_with_kvcache(q, k_cache, v_cache, k=k_cache[:, :1], v=k_cache[:, :1], cache_seqlens=lens)
    with pytest.raises(ValueError, match="k_cache and v_cache must have the same shape but for the last dimension"):
        flashcore.attention_with_kvcache(q, k_cache, v_cache[:, :4], cache_seqlens=lens)
    q, k, v, cq, ck = _packed([3, 9], [5, 9])
    with pytest.raises(ValueError, match=r"\(head_dim, head_dim_v\) = \(192, 64\)"):
        flashcore.varlen_attention(q, k, v[..., :64], cq, ck, 9, 9)
    assert not serving  # nothing reached the (emulated) kernel


def test_8bit_paths_take_one_head_dim(emulated):
    q, k, v = _qkv()
    q8, k8, v8 = (_ops.quantize_fp8(t)[0] for t in (q, k, v))
    with pytest.raises(ValueError, match=r"8-bit attention \(float8 q, k, v\) takes one head dim for q, k and v; "
                                         r"v's last dimension \(head_dim_v\) is 128, q's and k's 192"):
        flashcore.attention(q8, k8, v8)
    with pytest.raises(ValueError, match="8-bit attention"):
        torch.ops.flashcore.attention_fwd(q8, k8, v8, False, 0.0, False)
    for precision in ("fp8", "int8"):
        with pytest.raises(ValueError, match=f"precision='{precision}' takes one head dim for q, k and v"):
            flashcore.attention(q, k, v, precision=precision)
        with pytest.raises(ValueError, match=f"precision='{precision}' takes one head dim"):
            torch.ops.flashcore.attention_fwd(q, k, v, False, 0.0, False, precision=_ops.PRECISIONS[precision])


# ---------------------------------------------------------------------------------------------------------------
# The backward (since 0.9; the library's sm90 backend takes (192, 128)): dout and out of v's head dim, dv of v's shape,
# the library's decision on the pair (emulated here: the float64 formulas take v as it comes).

GRAD_TOL = dict(atol=3e-2, rtol=3e-2)  # bf16 gradients of magnitude ~1 against float64


def _check_grads(got, want, likes):
    for name, g, w, like in zip(("dq", "dk", "dv"), got, want, likes):
        assert g is not None, f"{name} missing"
        assert g.shape == like.shape and g.dtype == like.dtype, name
        torch.testing.assert_close(g.double(), w.double(), **GRAD_TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("front_end", ["attention", "sdpa"])
def test_backward_after_a_real_forward(emulated, front_end, causal):
    """flashcore.attention / sdpa with v of 128 columns under q and k of 192 (GQA): the forward and the backward run
    (emulated), dv has v's shape, and the gradients are float64 autograd's."""
    from reference import reference_grads

    q, k, v = _qkv()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if front_end == "sdpa":
        out = flashcore.sdpa(*(t.transpose(1, 2) for t in leaves), is_causal=causal).transpose(1, 2)
    else:
        out = flashcore.attention(*leaves, causal=causal)
    assert out.shape == (2, 17, 8, DV) and out.requires_grad
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.dtype)
    out.backward(dout)
    _check_grads([t.grad for t in leaves], reference_grads(q, k, v, dout, causal), (q, k, v))


def test_backward_with_variants(emulated):
    """The variants' backward with v of its own head dim (window, softcap and sinks with their gradient): the library
    decides which it takes at 192 (a window and softcap too, since they are compiled by default); the formulas are
    the same."""
    from reference import reference_variant_grads

    q, k, v = _qkv(sq=33, sk=33)
    sinks = torch.linspace(-1.0, 1.0, 8)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    kwargs = dict(causal=True, window_size=(7, 0), softcap=30.0)
    out = flashcore.attention(*leaves[:3], sinks=leaves[3], **kwargs)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(out.dtype)
    out.backward(dout)
    want = reference_variant_grads(q, k, v, dout, True, None, (7, 0), 30.0, sinks)
    _check_grads([t.grad for t in leaves[:3]], want[:3], (q, k, v))
    torch.testing.assert_close(leaves[3].grad.double(), want[3], atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("variants", [False, True], ids=["plain", "variants"])
def test_backward_through_lse(emulated, variants):
    """A loss on out and lse: the gradient through lse (a second backward whose dO has q's head dim, not v's: it runs
    on k as its v) reaches q and k as float64 autograd's."""
    from reference import reference_grads, reference_variant_grads

    q, k, v = _qkv(sq=33, sk=33)
    kwargs = dict(window_size=(7, 0), softcap=30.0) if variants else {}
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = flashcore.attention(*leaves, causal=True, return_lse=True, **kwargs)
    gen = torch.Generator().manual_seed(5)
    dout, dlse = torch.randn(out.shape, generator=gen).to(out.dtype), torch.randn(lse.shape, generator=gen)
    torch.autograd.backward([out, lse], [dout, dlse])
    if variants:
        want = reference_variant_grads(q, k, v, dout, True, None, (7, 0), 30.0, dlse=dlse)[:3]
    else:
        want = reference_grads(q, k, v, dout, True, dlse=dlse)
    _check_grads([t.grad for t in leaves], want, (q, k, v))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_backward(serving, causal):
    """varlen_attention with v of its own head dim: each sequence's gradients are its own float64 reference's, dv
    (total_k, Hkv, 128); the backward gets dout of v's head dim."""
    from reference import reference_grads

    lens_q, lens_k = ([3, 9, 5], [3, 9, 5]) if causal else ([3, 9, 5], [5, 9, 1])
    q, k, v, cq, ck = _packed(lens_q, lens_k)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flashcore.varlen_attention(*leaves, cq, ck, 9, 9, causal=causal)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(6)).to(out.dtype)
    out.backward(dout)
    assert serving[-1]["kind"] == "varlen_backward"
    assert leaves[2].grad.shape == v.shape
    for b in range(len(lens_q)):
        qs = slice(int(cq[b]), int(cq[b + 1]))
        ks = slice(int(ck[b]), int(ck[b + 1]))
        one = lambda t, s: t[s][None]  # noqa: E731
        want = reference_grads(one(q, qs), one(k, ks), one(v, ks), one(dout, qs), causal)
        _check_grads([one(leaves[0].grad, qs), one(leaves[1].grad, ks), one(leaves[2].grad, ks)], want,
                     (one(q, qs), one(k, ks), one(v, ks)))


def test_backward_ops_take_head_dim_v(emulated, serving):
    """The backward ops take dout and out of v's head dim and return dv of v's shape; dout or out of q's head dim is
    ValueError naming the shape they need."""
    q, k, v = _qkv()
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    dout = torch.ones_like(out)
    for grads in (torch.ops.flashcore.attention_bwd(dout, q, k, v, out, lse, False, 0.0),
                  torch.ops.flashcore.attention_variants_bwd(dout, q, k, v, out, lse, False, 0.0, False, 3, 0)):
        assert [tuple(g.shape) for g in grads[:3]] == [tuple(t.shape) for t in (q, k, v)]
    needle = (r"dout must have q's shape with v's head dim \(head_dim_v\), and q's dtype, \(2, 17, 8, 128\) "
              r"torch.bfloat16, got \(2, 17, 8, 192\)")
    with pytest.raises(ValueError, match=needle):
        torch.ops.flashcore.attention_bwd(torch.ones_like(q), q, k, v, out, lse, False, 0.0)
    with pytest.raises(ValueError, match="out must have q's shape with v's head dim"):
        torch.ops.flashcore.attention_bwd(dout, q, k, v, torch.ones_like(q), lse, False, 0.0)
    q, k, v, cq, ck = _packed([3, 9], [5, 9])
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, 9, 9, return_lse=True)
    for grads in (torch.ops.flashcore.varlen_attention_bwd(torch.ones_like(out), q, k, v, out, lse, cq, ck, 9, 9,
                                                           False, 0.0),
                  torch.ops.flashcore.varlen_attention_variants_bwd(torch.ones_like(out), q, k, v, out, lse, cq, ck,
                                                                    9, 9, False, 0.0, False, 3, 0)):
        assert [tuple(g.shape) for g in grads[:3]] == [tuple(t.shape) for t in (q, k, v)]


def test_fake_backward_kernels(emulated):
    """The backward ops' fake kernels (torch.compile, meta): dq, dk of q's and k's shape, dv of v's; opcheck of the
    dense op with v of its own head dim."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v = _qkv()
    out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashcore.attention_bwd.default, (dout, q, k, v, out, lse, True, 0.0, False))
    pq, pk, pv, cq, ck = _packed([3, 9], [5, 9])
    with FakeTensorMode() as mode:
        fq, fk, fv, fdout, fout, flse = (mode.from_tensor(t) for t in (q, k, v, dout, out, lse))
        for grads in (torch.ops.flashcore.attention_bwd(fdout, fq, fk, fv, fout, flse, True, 0.0),
                      torch.ops.flashcore.attention_variants_bwd(fdout, fq, fk, fv, fout, flse, True, 0.0, False, 3,
                                                                 0)):
            assert [tuple(g.shape) for g in grads[:3]] == [(2, 17, 8, D), (2, 33, 2, D), (2, 33, 2, DV)]
        fq, fk, fv, fcq, fck = (mode.from_tensor(t) for t in (pq, pk, pv, cq, ck))
        fout = fq.new_empty(fq.shape[0], 8, DV)
        flse = fq.new_empty(8, fq.shape[0], dtype=torch.float32)
        for grads in (torch.ops.flashcore.varlen_attention_bwd(fout, fq, fk, fv, fout, flse, fcq, fck, 9, 9, False,
                                                               0.0),
                      torch.ops.flashcore.varlen_attention_variants_bwd(fout, fq, fk, fv, fout, flse, fcq, fck, 9, 9,
                                                                        False, 0.0, False, 3, 0)):
            assert [tuple(g.shape) for g in grads[:3]] == [(12, 8, D), (14, 2, D), (14, 2, DV)]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_backward(emulated, backend):
    """torch.compile(fullgraph=True) forward and backward with v of its own head dim: eager's gradients."""
    torch._dynamo.reset()
    q, k, v = _qkv()
    weight = torch.randn(2, 17, 8, DV, generator=torch.Generator().manual_seed(7))

    def loss(q, k, v):
        return (flashcore.attention(q, k, v, causal=True).float() * weight).sum()

    grads = []
    for fn in (torch.compile(loss, fullgraph=True, backend=backend), loss):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    assert grads[0][2].shape == v.shape
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want)


def test_library_refusal_is_the_error(emulated, monkeypatch):
    """A library whose backward lacks the pair (older than 0.9, or off the sm90 backend) refuses it at launch: its
    error, naming head_dim_v, is what .backward() raises (the forward ran; nothing is made up)."""
    message = ("FlashCore: flashcore_attention_backward_workspace_size failed: head_dim_v = 128 differs from head_dim "
               "= 192: the backward takes one head dim for Q, K and V in this version "
               "[FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM]")

    def refuse(*args, **kwargs):
        raise ValueError(message)

    monkeypatch.setattr(_ops, "_launch_backward", refuse)
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = flashcore.attention(q, k, v)
    with pytest.raises(ValueError, match=r"head_dim_v = 128 differs from head_dim = 192"):
        out.sum().backward()
    assert all(t.grad is None for t in (q, k, v))


# ---------------------------------------------------------------------------------------------------------------
# The C params the front ends fill (the host-only stub library, which compiles the pair (192, 128)).


@pytest.fixture
def stub_ops(use_library, stub_library, monkeypatch):
    """The ops running against the stub on CPU tensors: the device checks and CUDA device / stream calls stubbed out.
    Returns use_library, to switch to another stub build."""
    import contextlib
    import types

    monkeypatch.setattr(_ops, "_check_device", lambda q, k, v: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0))
    use_library(stub_library)
    return use_library


def _seen():
    seen = _lib.AttentionParamsStruct()
    _lib.load()._cdll.stub_last_params(ctypes.byref(seen))
    return seen


def test_front_ends_pass_head_dim_v(stub_ops):
    q, k, v = _qkv()
    out = flashcore.attention(q, k, v, causal=True)
    seen = _seen()
    assert (seen.head_dim, seen.head_dim_v, seen.struct_size) == (D, DV, ctypes.sizeof(_lib.AttentionParamsStruct))
    assert (seen.v, seen.o) == (v.data_ptr(), out.data_ptr()) and out.shape == (2, 17, 8, DV)
    assert (seen.v_strides.seq, seen.v_strides.head, seen.o_strides.seq, seen.o_strides.head) == (2 * DV, DV, 8 * DV,
                                                                                                   DV)
    assert (seen.k_strides.seq, seen.q_strides.seq) == (2 * D, 8 * D)

    lens = [3, 9]
    pq, pk, pv, cq, ck = _packed(lens, lens)
    out = flashcore.varlen_attention(pq, pk, pv, cq, ck, 9, 9)
    seen = _seen()
    assert (seen.head_dim, seen.head_dim_v, seen.o, seen.cu_seqlens_q) == (D, DV, out.data_ptr(), cq.data_ptr())

    kp, vp, table = paginate(k, v, [17, 33], 16)
    flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=torch.tensor([17, 33], dtype=torch.int32),
                                     block_table=table)
    seen = _seen()
    assert (seen.head_dim, seen.head_dim_v, seen.page_size, seen.v) == (D, DV, 16, vp.data_ptr())

    flashcore.attention(*_qkv(d=64, dv=64))  # v of q's head dim: the field keeps its default
    assert (_seen().head_dim, _seen().head_dim_v) == (64, 0)


def test_backward_passes_head_dim_v(stub_ops):
    """The backward's params (through the stub, which records them): head_dim_v, dout and dv of v's head dim with
    their strides, dq and dk of q's; dense and packed batches."""
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = flashcore.attention(q, k, v, causal=True)
    dout = torch.ones_like(out)
    out.backward(dout)
    seen = _seen_backward()
    assert (seen.head_dim, seen.head_dim_v) == (D, DV)
    assert (seen.dv, seen.dk, seen.dq) == (v.grad.data_ptr(), k.grad.data_ptr(), q.grad.data_ptr())
    assert v.grad.shape == v.shape and q.grad.shape == q.shape
    assert (seen.dout_strides.seq, seen.dout_strides.head, seen.dv_strides.seq, seen.dv_strides.head) == (
        8 * DV, DV, 2 * DV, DV)
    assert (seen.dq_strides.seq, seen.dk_strides.seq, seen.o_strides.seq) == (8 * D, 2 * D, 8 * DV)

    pq, pk, pv, cq, ck = (t.requires_grad_() if t.is_floating_point() else t for t in _packed([3, 9], [5, 9]))
    out = flashcore.varlen_attention(pq, pk, pv, cq, ck, 9, 9, causal=True)
    out.backward(torch.ones_like(out))
    seen = _seen_backward()
    assert (seen.head_dim, seen.head_dim_v, seen.cu_seqlens_q) == (D, DV, cq.data_ptr())
    assert seen.dv == pv.grad.data_ptr() and pv.grad.shape == pv.shape
    assert (seen.dout_strides.seq, seen.dv_strides.seq) == (8 * DV, 2 * DV)

    q, k, v = (t.requires_grad_() for t in _qkv(d=64, dv=64))  # v of q's head dim: the field keeps its default
    flashcore.attention(q, k, v).sum().backward()
    assert (_seen_backward().head_dim, _seen_backward().head_dim_v) == (64, 0)


def _seen_backward():
    seen = _lib.AttentionParamsStruct()
    _lib.load()._cdll.stub_last_backward_params(ctypes.byref(seen))
    return seen


def test_capabilities_report_the_pairs(stub_ops):
    assert flashcore.capabilities().head_dim_pairs == ((D, DV),)
    assert _lib.load().compiled_head_dim_pairs() == ((D, DV),)


@pytest.fixture
def stub_v6_library(c_compiler, header_text, tmp_path_factory):
    """The stub playing a 0.6 library (688-byte params, 304-byte capabilities)."""
    from conftest import build_stub

    return build_stub(c_compiler, tmp_path_factory.mktemp("stub_v6"), "libflashcore_v6.so",
                      "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V6_SIZE")


def test_0_6_library_refuses_before_any_call(stub_ops, stub_v6_library, launches):
    """With a 0.6 library a V of its own head dim is RuntimeError naming the version needed (never a call that
    reads V and writes O with q's head dim); a call with one head dim still runs, with the 0.6 struct."""
    stub_ops(stub_v6_library)
    q, k, v = _qkv()
    lens = torch.tensor([5, 9], dtype=torch.int32)
    pq, pk, pv, cq, ck = _packed([3, 9], [5, 9])
    for call in (lambda: flashcore.attention(q, k, v),
                 lambda: torch.ops.flashcore.attention_fwd(q, k, v, False, 0.0, False),
                 lambda: flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens),
                 lambda: flashcore.varlen_attention(pq, pk, pv, cq, ck, 9, 9)):
        with pytest.raises(RuntimeError, match=r"v's head dim \(128\) differs from q's and k's \(192\), but .* "
                                               r"predates head_dim_v: a 0.7 library or newer is needed"):
            call()
    assert not launches
    with pytest.raises(RuntimeError, match="predates head_dim_v"):  # the params too, for a caller of kernel_params
        _ops.kernel_params(_lib.load(), q, k, v, q.new_empty(2, 17, 8, DV), None, False, 0.0)
    flashcore.attention(*_qkv(d=64, dv=64))
    assert len(launches) == 1
    seen = _seen()
    assert seen.struct_size == _lib.ATTENTION_PARAMS_V6_SIZE and seen.head_dim == 64 and seen.head_dim_v == 0


@pytest.fixture
def launches(monkeypatch):
    """Records the forward calls that reach the library (Library.forward), without changing them."""
    launched = []
    forward = _lib.Library.forward

    def record(self, params, stream):
        launched.append(params)
        return forward(self, params, stream)

    monkeypatch.setattr(_lib.Library, "forward", record)
    return launched


# ---------------------------------------------------------------------------------------------------------------
# The library $FLASHCORE_LIBRARY (or the repository build) points at, when there is one: its validation (host-side,
# no GPU needed) of the params the ops fill, a 0.7 library's pairs and refusals, or a 0.6 library's refusal here.


@pytest.fixture
def real_library():
    _lib.reset()
    try:
        lib = _lib.load()
    except RuntimeError as exc:
        pytest.skip(f"no libflashcore.so to load ({str(exc).splitlines()[0]})")
    if lib.version_string().endswith("-stub"):
        pytest.skip("the loaded library is the host-only stub")
    yield lib
    _lib.reset()


def test_real_library_validates_head_dim_v(real_library):
    lib = real_library
    q, k, v = _qkv()
    out = q.new_empty(2, 17, 8, DV)
    if not lib.has_head_dim_v():  # a library older than 0.7: refused before the library is asked
        assert lib.compiled_head_dim_pairs() == ()
        with pytest.raises(RuntimeError, match=r"predates head_dim_v: a 0.7 library or newer is needed"):
            _ops.kernel_params(lib, q, k, v, out, None, True, 0.0)
        q, k, v = _qkv(d=64, dv=64)
        lib.validate(_ops.kernel_params(lib, q, k, v, torch.empty_like(q), None, True, 0.0))  # one head dim: fine
        return
    if (D, DV) not in lib.compiled_head_dim_pairs():
        pytest.skip(f"{lib.path} compiles no ({D}, {DV}) pair: {lib.compiled_head_dim_pairs()}")
    params = _ops.kernel_params(lib, q, k, v, out, None, True, 0.0)
    assert params.head_dim_v == DV
    lib.validate(params)
    with pytest.raises(ValueError, match=r"\(head_dim, head_dim_v\) = \(192, 64\) is not compiled"):
        lib.validate(_ops.kernel_params(lib, q, k, v[..., :64].contiguous(), q.new_empty(2, 17, 8, 64), None, True,
                                        0.0))
    fp8 = _ops.kernel_params(lib, q, k, v, out, None, True, 0.0, precision=_lib.PRECISION_FP8)
    with pytest.raises(ValueError, match="head_dim_v = 128 differs from head_dim = 192"):
        lib.validate(fp8)
    # The backward: the library's own decision (the ops ask it). One whose build has no backward kernel for the pair
    # (before 0.9's) refuses it, naming head_dim_v; one that has (0.9, the sm90 backend's) passes validation, and here,
    # without a GPU, stops at the device (or, on a GPU, returns the workspace size).
    lse = torch.zeros(2, 8, 17)
    grads = [torch.empty_like(t) for t in (out, q, k, v)]
    params = _ops.backward_params(lib, grads[0], q, k, v, out, lse, *grads[1:], True, 0.0, False)
    assert (params.head_dim_v, params.dv_strides.seq, params.dout_strides.seq) == (DV, 2 * DV, 8 * DV)
    try:
        assert lib.backward_workspace_size(params) >= 0
    except ValueError as exc:
        assert "head_dim_v = 128" in str(exc) and "UNSUPPORTED_HEAD_DIM" in str(exc), str(exc)
    except RuntimeError as exc:
        assert "NO_DEVICE" in str(exc) or "UNSUPPORTED_ARCH" in str(exc), str(exc)
