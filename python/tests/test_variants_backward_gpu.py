"""The backward of the attention variants on the GPU (C ABI 0.6: flashcore_attention_backward with a window, softcap,
sinks and attention_chunk, and dsinks): gradients of q, k, v and sinks through flashcore.attention, sdpa and
varlen_attention (and through lse), against float64 autograd of the definitions (reference.reference_variant_grads,
itself checked against the kernel's formulas and the definitions in test_variants_cpu.py).

Error rule (the project's, as test_backward_gpu.py applies it to gradients): per gradient (dq, dk, dv, dsinks),
max |FlashCore - reference| <= 2 * max |baseline - reference| + atol, atol = ATOL[dtype] * max(1, max |reference|).
SDPA cannot take softcap or sinks, so the baseline is PyTorch's computation at the inputs' precision rounded the way a
flash kernel's backward rounds (as test_variants_gpu.py's forward baseline): scores, softmax and lse in float32 from
the 16-bit inputs; O = P V with P rounded to the input dtype, stored in it; D = rowsum(dO * O) in float32 from those
16-bit values; dV = P^T dO with P rounded; dS = P (dP - D) (times the softcap's derivative) rounded to the input dtype
before dQ = dS K and dK = dS^T Q; float32 sums. Needs torch, a CUDA GPU and a libflashcore.so of 0.6 or newer (skips
otherwise, naming the reason); the attention_chunk cases a library with chunked attention
(test_variants_gpu.need_chunks: they skip, quoting it, where the library refuses the field as reserved)."""

import itertools
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib  # noqa: E402
from reference import reference_variant_grads, variant_mask  # noqa: E402
from test_backward_gpu import ATOL, _need, caps  # noqa: E402,F401  (fixtures; cuda: conftest.py)
from test_variants_gpu import need_chunks  # noqa: E402


@pytest.fixture(scope="module")
def vbcaps(caps):
    """The capabilities, once the library's backward is known to take the variants (0.6)."""
    lib = _lib.load()
    if not lib.has_variant_backward():
        pytest.skip(f"{lib.path} ({lib.version_string()}) has no backward for the attention variants (0.6 needed)")
    return caps


def _inputs(device, dtype, batch, sq, sk, hq, hkv, d, seed=0, q_scale=1.0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, sq, hq, d, device=device, generator=gen) * q_scale
    k, v = (torch.randn(batch, sk, hkv, d, device=device, generator=gen) for _ in range(2))
    dout = torch.randn(batch, sq, hq, d, device=device, generator=gen)
    return tuple(t.to(dtype) for t in (q, k, v, dout))


def _sinks(device, hq, seed=1, scale=2.0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(hq, device=device, generator=gen) * scale


def baseline_grads(q, k, v, dout, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0, sinks=None,
                   attention_chunk=0):
    """(dq, dk, dv in the inputs' dtype, dsinks float32 or None): the backward at the inputs' precision, rounded as a
    flash kernel rounds it (module docstring). Whole score matrices: for the moderate shapes of these tests."""
    dtype = q.dtype
    batch, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    scale = softmax_scale if softmax_scale else 1.0 / math.sqrt(d)
    qt, dot = (t.transpose(1, 2).float() for t in (q, dout))  # (B, Hq, Sq, D)
    kt, vt = (t.transpose(1, 2).repeat_interleave(group, dim=1).float() for t in (k, v))  # (B, Hq, Sk, D)
    raw = (qt @ kt.transpose(-1, -2)) * scale
    tanh = torch.tanh(raw / softcap) if softcap else None
    scores = softcap * tanh if softcap else raw
    scores = scores.masked_fill(~variant_mask(sq, sk, causal, window_size, attention_chunk, q.device), -math.inf)
    row_max = scores.amax(dim=-1, keepdim=True) if sk else torch.full_like(scores[..., :1], -math.inf)
    sink = None
    if sinks is not None:
        sink = sinks.float()[None, :, None, None]
        row_max = torch.maximum(row_max, sink)
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
    denominator = torch.exp(scores - row_max).sum(-1, keepdim=True)
    if sink is not None:
        denominator = denominator + torch.exp(sink - row_max)
    lse = torch.where(denominator > 0, row_max + torch.log(denominator), -math.inf)
    seen = torch.isfinite(lse)
    probs = torch.where(seen, torch.exp(scores - torch.where(seen, lse, 0.0)), 0.0)  # float32
    p16 = probs.to(dtype).float()
    out = (p16 @ vt).to(dtype).float()  # O as the forward stores it
    d_rows = (dot * out).sum(-1, keepdim=True)
    dv = p16.transpose(-1, -2) @ dot
    ds = probs * (dot @ vt.transpose(-1, -2) - d_rows)
    if softcap:
        ds = ds * (1.0 - tanh * tanh)
    ds = ds.to(dtype).float()
    dq = (ds @ kt) * scale
    dk = (ds.transpose(-1, -2) @ qt) * scale
    dsinks = None if sink is None else -(torch.where(seen, torch.exp(sink - lse), 0.0) * d_rows).sum(dim=(0, 2, 3))

    def per_kv_head(t):  # (B, Hq, Sk, D) -> (B, Sk, Hkv, D)
        return t.reshape(batch, hkv, group, sk, d).sum(2).transpose(1, 2)

    return dq.transpose(1, 2).to(dtype), per_kv_head(dk).to(dtype), per_kv_head(dv).to(dtype), dsinks


def run_attention(q, k, v, dout, sinks=None, deterministic=False, **kwargs):
    """flashcore.attention forward and backward: (dq, dk, dv, dsinks or None), sinks requiring grad when given."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.detach().clone().requires_grad_()
    out = flashcore.attention(*leaves, sinks=sink_leaf, deterministic=deterministic, **kwargs)
    out.backward(dout)
    return (*(t.grad for t in leaves), None if sink_leaf is None else sink_leaf.grad)


def check_grads(q, k, v, dout, grads, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                sinks=None, attention_chunk=0, check_dsinks=True):
    """grads (dq, dk, dv, dsinks) against the float64 reference, with the error rule of the module docstring.
    check_dsinks=False: dsinks (grads[3]) is not checked (a packed batch's, checked summed over its sequences)."""
    want = reference_variant_grads(q, k, v, dout, causal, softmax_scale, window_size, softcap, sinks, attention_chunk)
    base = baseline_grads(q, k, v, dout, causal, softmax_scale, window_size, softcap, sinks, attention_chunk)
    label = (f"causal={causal} window={window_size} softcap={softcap} sinks={sinks is not None} "
             f"attention_chunk={attention_chunk}")
    for name, got, ref, low, like in zip(("dq", "dk", "dv", "dsinks"), grads, want, base, (q, k, v, sinks)):
        if ref is None or (name == "dsinks" and not check_dsinks):
            assert ref is not None or got is None, f"{name}: a gradient without sinks"
            continue
        assert got is not None, f"{name} missing"
        assert got.shape == like.shape, name
        assert got.dtype == (torch.float32 if name == "dsinks" else like.dtype), name
        assert torch.isfinite(got).all(), f"{name} has non-finite values ({label})"
        err = (got.double() - ref).abs().max().item()
        base_err = (low.double() - ref).abs().max().item()
        atol = ATOL[q.dtype] * max(1.0, ref.abs().max().item())
        assert err <= 2 * base_err + atol, (f"{name}: flashcore error {err:.3g} vs baseline {base_err:.3g} (atol "
                                            f"{atol:.3g}; {label})")


CASES = [  # flashcore keyword arguments ("sinks": drawn on the device); "q_scale" makes the softcap bite
    dict(window_size=(0, 0)),
    dict(window_size=(3, -1)),
    dict(window_size=(-1, 5)),
    dict(window_size=(20, 7)),
    dict(causal=True, window_size=(3, 0)),
    dict(causal=True, window_size=(50, -1)),
    dict(softcap=30.0, q_scale=4.0),
    dict(causal=True, softcap=30.0, window_size=(40, 0), q_scale=4.0),
    dict(softcap=5.0, window_size=(-1, 5), q_scale=4.0),
    dict(sinks=True),
    dict(causal=True, sinks=True),
    dict(causal=True, window_size=(40, 0), sinks=True),
    dict(window_size=(20, 3), softcap=30.0, sinks=True, q_scale=4.0),
    dict(causal=True, attention_chunk=1),
    dict(causal=True, attention_chunk=16),
    dict(causal=True, attention_chunk=50),  # not a multiple of any tile
    dict(causal=True, attention_chunk=1000),  # larger than the sequences
    dict(attention_chunk=37),
    dict(causal=True, window_size=(20, 0), attention_chunk=48),
    dict(window_size=(20, 3), softcap=30.0, sinks=True, q_scale=4.0, attention_chunk=40),
]
CASE_IDS = ["diag", "left3", "right5", "w20-7", "c3", "c50", "softcap30", "c40-softcap30", "right5-softcap5",
            "sinks", "c-sinks", "c40-sinks", "all", "c-chunk1", "c-chunk16", "c-chunk50", "c-chunk1000", "chunk37",
            "c20-chunk48", "all-chunk40"]
SEQLENS = [(17, 17), (113, 113), (17, 113), (113, 17)]


def _split(case, device, hq):
    kwargs = dict(case)
    q_scale = kwargs.pop("q_scale", 1.0)
    sinks = _sinks(device, hq) if kwargs.pop("sinks", False) else None
    return kwargs, q_scale, sinks


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"sq{a}-sk{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_grads_match_reference(vbcaps, cuda, dtype, head_dim, seqlens, case):
    """GQA (8 query heads, 2 KV heads), batch 2: dq, dk, dv (and dsinks) of every case."""
    _need(vbcaps, dtype, head_dim)
    need_chunks(vbcaps, cuda, case)
    kwargs, q_scale, sinks = _split(case, cuda, 8)
    q, k, v, dout = _inputs(cuda, dtype, 2, *seqlens, 8, 2, head_dim, q_scale=q_scale)
    grads = run_attention(q, k, v, dout, sinks, **kwargs)
    check_grads(q, k, v, dout, grads, sinks=sinks, **kwargs)


@pytest.mark.parametrize("heads", [(4, 4), (8, 1)], ids=["mha", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_head_ratios(vbcaps, cuda, causal, heads):
    _need(vbcaps, torch.bfloat16, 128)
    q, k, v, dout = _inputs(cuda, torch.bfloat16, 2, 300, 300, *heads, 128, seed=2, q_scale=3.0)
    sinks = _sinks(cuda, heads[0])
    kwargs = dict(causal=causal, window_size=(64, 0 if causal else 64), softcap=30.0)
    check_grads(q, k, v, dout, run_attention(q, k, v, dout, sinks, **kwargs), sinks=sinks, **kwargs)


@pytest.mark.parametrize("case", [dict(causal=True, window_size=(255, 0)), dict(causal=True, softcap=30.0, q_scale=3.0),
                                  dict(causal=True, window_size=(127, 0), sinks=True),
                                  dict(causal=True, attention_chunk=512), dict(causal=True, attention_chunk=700),
                                  dict(causal=True, attention_chunk=300, window_size=(127, 0), sinks=True)],
                         ids=["window255", "softcap30", "window127-sinks", "chunk512", "chunk700",
                              "chunk300-window127-sinks"])
def test_long_sequence(vbcaps, cuda, case):
    """S = 2048, 16 query / 2 KV heads, d128 bf16: many key blocks outside the window or the chunk (skipped by the
    kernel)."""
    _need(vbcaps, torch.bfloat16, 128)
    need_chunks(vbcaps, cuda, case)
    kwargs, q_scale, sinks = _split(case, cuda, 16)
    q, k, v, dout = _inputs(cuda, torch.bfloat16, 1, 2048, 2048, 16, 2, 128, seed=3, q_scale=q_scale)
    check_grads(q, k, v, dout, run_attention(q, k, v, dout, sinks, **kwargs), sinks=sinks, **kwargs)


def test_custom_scale_and_rows_without_keys(vbcaps, cuda):
    """softmax_scale 0.3 and Sq > Sk causal with a window and sinks: the first rows see no key (out 0, lse = sink);
    they pass no gradient to q, nor to the sinks (D = 0 there)."""
    _need(vbcaps, torch.bfloat16, 64)
    q, k, v, dout = _inputs(cuda, torch.bfloat16, 2, 40, 16, 4, 2, 64, seed=4)
    sinks = _sinks(cuda, 4)
    kwargs = dict(causal=True, window_size=(5, 0), softmax_scale=0.3)
    grads = run_attention(q, k, v, dout, sinks, **kwargs)
    check_grads(q, k, v, dout, grads, sinks=sinks, **kwargs)
    assert torch.all(grads[0][:, :24] == 0)  # query i sees key j iff i - 24 - 5 <= j <= i - 24


def test_chunk_rows_without_keys(vbcaps, cuda):
    """Sq > Sk without causal, attention_chunk 8: rows whose diagonal i + Sk - Sq is negative lie in chunk -1 and see
    no key (out 0, lse = sink); they pass no gradient to q, nor to the sinks; the others as the reference."""
    _need(vbcaps, torch.bfloat16, 64)
    need_chunks(vbcaps, cuda)
    q, k, v, dout = _inputs(cuda, torch.bfloat16, 2, 40, 16, 4, 2, 64, seed=11)
    sinks = _sinks(cuda, 4)
    kwargs = dict(attention_chunk=8, softmax_scale=0.3)
    grads = run_attention(q, k, v, dout, sinks, **kwargs)
    check_grads(q, k, v, dout, grads, sinks=sinks, **kwargs)
    assert torch.all(grads[0][:, :24] == 0)


def test_sinks_alone_require_grad(vbcaps, cuda):
    """Sinks that require grad (a model's parameter, bf16), q, k, v that do not: the sinks' gradient, in bf16."""
    _need(vbcaps, torch.bfloat16, 128)
    q, k, v, dout = _inputs(cuda, torch.bfloat16, 2, 200, 200, 8, 2, 128, seed=5)
    sinks = _sinks(cuda, 8).to(torch.bfloat16).requires_grad_()
    out = flashcore.attention(q, k, v, causal=True, window_size=(31, 0), sinks=sinks)
    out.backward(dout)
    assert sinks.grad.dtype == torch.bfloat16
    want = reference_variant_grads(q, k, v, dout, True, None, (31, 0), 0.0, sinks.detach().float())[3]
    base = baseline_grads(q, k, v, dout, True, None, (31, 0), 0.0, sinks.detach().float())[3]
    err = (sinks.grad.double() - want).abs().max().item()
    base_err = (base.to(torch.bfloat16).double() - want).abs().max().item()
    assert err <= 2 * base_err + ATOL[torch.bfloat16] * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("chunk", [0, 200], ids=["window", "window-chunk"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_deterministic_is_bit_identical(vbcaps, cuda, dtype, chunk):
    """deterministic=True with a window, softcap and sinks (and attention_chunk): dq (and dk, dv, dsinks, which always
    are) bit-identical over runs, a larger call in between; many query blocks per key block and a GQA group of 8."""
    _need(vbcaps, dtype, 128)
    need_chunks(vbcaps, cuda, dict(attention_chunk=chunk))
    q, k, v, dout = _inputs(cuda, dtype, 2, 1024, 1024, 16, 2, 128, seed=6, q_scale=3.0)
    sinks = _sinks(cuda, 16)
    kwargs = dict(causal=True, window_size=(300, 0), softcap=30.0, attention_chunk=chunk)
    first = run_attention(q, k, v, dout, sinks, deterministic=True, **kwargs)
    check_grads(q, k, v, dout, first, sinks=sinks, **kwargs)
    for _ in range(2):
        again = run_attention(q, k, v, dout, sinks, deterministic=True, **kwargs)
        for name, got, want in zip(("dq", "dk", "dv", "dsinks"), again, first):
            assert torch.equal(got, want), f"{name} differs between two deterministic runs"
        other = [t.repeat(2, 1, 1, 1) for t in (q, k, v, dout)]
        run_attention(*other, sinks, causal=False, window_size=(100, 100))


def test_sdpa_front_end(vbcaps, cuda):
    _need(vbcaps, torch.float16, 128)
    q, k, v, dout = _inputs(cuda, torch.float16, 2, 256, 256, 8, 2, 128, seed=7, q_scale=3.0)
    sinks = _sinks(cuda, 8)
    qb, kb, vb = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))  # genuine (B, H, S, D)
    sink_leaf = sinks.clone().requires_grad_()
    out = flashcore.sdpa(qb, kb, vb, is_causal=True, scale=0.1, window_size=(63, 0), softcap=30.0, sinks=sink_leaf)
    out.backward(dout.transpose(1, 2))
    for t in (qb, kb, vb):
        assert t.grad.is_contiguous(), "the gradient of a (B, H, S, D) tensor has its layout"
    grads = (*(t.grad.transpose(1, 2) for t in (qb, kb, vb)), sink_leaf.grad)
    check_grads(q, k, v, dout, grads, True, 0.1, (63, 0), 30.0, sinks)


@pytest.mark.parametrize("case", [dict(causal=True, window_size=(40, 0)), dict(softcap=5.0, window_size=(30, 30),
                                                                              q_scale=3.0),
                                  dict(causal=True, window_size=(40, 0), sinks=True),
                                  dict(causal=True, attention_chunk=64, sinks=True)],
                         ids=["window", "softcap-window", "window-sinks", "chunk-sinks"])
def test_grads_through_lse(vbcaps, cuda, case):
    """A loss on out and lse with variants: the gradient through lse (one more backward call with v = e_0,
    dO = g e_0, O = 0; the sinks' share added on the host) matches float64 autograd."""
    _need(vbcaps, torch.bfloat16, 64)
    need_chunks(vbcaps, cuda, case)
    kwargs, q_scale, sinks = _split(case, cuda, 8)
    q, k, v, dout = _inputs(cuda, torch.bfloat16, 2, 100, 150, 8, 2, 64, seed=8, q_scale=q_scale)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.clone().requires_grad_()
    out, lse = flashcore.attention(*leaves, sinks=sink_leaf, return_lse=True, **kwargs)
    dlse = torch.randn_like(lse)
    torch.autograd.backward([out, lse], [dout, dlse])
    want = reference_variant_grads(q, k, v, dout, kwargs.get("causal", False), None,
                                   kwargs.get("window_size", (-1, -1)), kwargs.get("softcap", 0.0), sinks,
                                   kwargs.get("attention_chunk", 0), dlse=dlse)
    got = (*(t.grad for t in leaves), None if sink_leaf is None else sink_leaf.grad)
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        if w is None:
            continue
        err = (g.double() - w).abs().max().item()
        assert err <= 2e-2 * max(1.0, w.abs().max().item()), f"{name}: {err:.3g}"


@pytest.mark.parametrize("case", [dict(causal=True, window_size=(20, 0)), dict(window_size=(10, 10), softcap=30.0),
                                  dict(causal=True, window_size=(50, 0), sinks=True),
                                  dict(causal=True, attention_chunk=48),
                                  dict(attention_chunk=100, softcap=30.0, sinks=True)],
                         ids=["window", "softcap-window", "window-sinks", "c-chunk48", "chunk100-softcap-sinks"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_varlen(vbcaps, cuda, head_dim, case):
    """Packed sequences (sm90 backend) with the variants: each sequence's gradients pass the rule against its own
    reference and baseline (the chunks aligned per sequence); the sinks' gradient is their sum over the sequences."""
    _need(vbcaps, torch.bfloat16, head_dim)
    need_chunks(vbcaps, cuda, case)
    if vbcaps.device_backend != "sm90":
        pytest.skip(f"packed batches have no backward on the {vbcaps.device_backend} backend")
    kwargs, _, sinks = _split(case, cuda, 4)
    lens_q, lens_k = [17, 64, 1, 200, 130], [33, 64, 5, 200, 257]
    if kwargs.get("causal"):
        lens_k = lens_q
    gen = torch.Generator(device=cuda).manual_seed(9)

    def packed(lens, heads):
        return torch.randn(sum(lens), heads, head_dim, device=cuda, generator=gen).to(torch.bfloat16)

    q, dout = packed(lens_q, 4), packed(lens_q, 4)
    k, v = packed(lens_k, 2), packed(lens_k, 2)
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device=cuda)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device=cuda)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.clone().requires_grad_()
    out = flashcore.varlen_attention(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), sinks=sink_leaf, **kwargs)
    out.backward(dout)
    want_sinks = base_sinks = 0.0
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        one = lambda t, s: t[s].unsqueeze(0)  # noqa: E731
        grads = (one(leaves[0].grad, qs), one(leaves[1].grad, ks), one(leaves[2].grad, ks), None)
        check_grads(one(q, qs), one(k, ks), one(v, ks), one(dout, qs), grads, sinks=sinks, check_dsinks=False,
                    **kwargs)
        if sinks is not None:
            args = (one(q, qs), one(k, ks), one(v, ks), one(dout, qs), kwargs.get("causal", False), None,
                    kwargs.get("window_size", (-1, -1)), kwargs.get("softcap", 0.0), sinks,
                    kwargs.get("attention_chunk", 0))
            want_sinks = want_sinks + reference_variant_grads(*args)[3]
            base_sinks = base_sinks + baseline_grads(*args)[3]
    if sinks is not None:
        err = (sink_leaf.grad.double() - want_sinks).abs().max().item()
        base_err = (base_sinks.double() - want_sinks).abs().max().item()
        assert err <= 2 * base_err + ATOL[torch.bfloat16] * max(1.0, want_sinks.abs().max().item())


@pytest.mark.parametrize("chunk", [0, 48], ids=["window", "window-chunk"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_backward(vbcaps, cuda, dynamic, chunk):
    """torch.compile(fullgraph=True) of a loss through flashcore.attention with a window, softcap and sinks (and
    attention_chunk): the gradients, the sinks' included, equal eager's bit for bit (deterministic=True)."""
    _need(vbcaps, torch.bfloat16, 128)
    need_chunks(vbcaps, cuda, dict(attention_chunk=chunk))
    torch._dynamo.reset()

    def loss(q, k, v, sinks, weight):
        out = flashcore.attention(q, k, v, causal=True, window_size=(31, 0), softcap=30.0, sinks=sinks,
                                  deterministic=True, attention_chunk=chunk)
        return (out.float() * weight).sum()

    compiled = torch.compile(loss, fullgraph=True, dynamic=dynamic)
    for seqlen in (64, 100):
        q, k, v, dout = _inputs(cuda, torch.bfloat16, 2, seqlen, seqlen, 8, 2, 128, seed=10)
        sinks = _sinks(cuda, 8)
        grads = []
        for fn in (compiled, loss):
            leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
            fn(*leaves, dout.float()).backward()
            grads.append([t.grad for t in leaves])
        for got, want in zip(*grads):
            torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("chunk", [0, 100], ids=["window", "window-chunk"])
def test_cuda_graph_forward_and_backward(vbcaps, cuda, chunk):
    """Forward and backward with sinks that require grad captured in one CUDA graph, replayed with new contents: the
    same gradients as eager calls, bit for bit (deterministic=True)."""
    _need(vbcaps, torch.bfloat16, 128)
    need_chunks(vbcaps, cuda, dict(attention_chunk=chunk))
    q, k, v, dout = (t.clone() for t in _inputs(cuda, torch.bfloat16, 2, 200, 300, 8, 4, 128))
    sinks = _sinks(cuda, 8)
    for t in (q, k, v, sinks):
        t.requires_grad_()
    kwargs = dict(causal=True, window_size=(63, 0), softcap=30.0, deterministic=True, attention_chunk=chunk)

    def step():
        flashcore.attention(q, k, v, sinks=sinks, **kwargs).backward(dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in (q, k, v, sinks):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    static_grads = (q.grad, k.grad, v.grad, sinks.grad)
    for seed in (1, 2):
        new = _inputs(cuda, torch.bfloat16, 2, 200, 300, 8, 4, 128, seed=seed)
        new_sinks = _sinks(cuda, 8, seed=seed + 10)
        with torch.no_grad():
            for static, value in zip((q, k, v, dout, sinks), (*new, new_sinks)):
                static.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        leaves = [t.clone().requires_grad_() for t in (*new[:3], new_sinks)]
        flashcore.attention(*leaves[:3], sinks=leaves[3], **kwargs).backward(new[3])
        for name, got, t in zip(("dq", "dk", "dv", "dsinks"), static_grads, leaves):
            assert torch.equal(got, t.grad), f"{name}: graph replay differs from eager"
