"""flashcore.varlen_attention without a GPU: argument errors, the C params it fills (through the host-only stub
library), and the custom op / fake / torch.compile wiring with the kernel emulated on CPU by a float64 reference
computed per sequence. Also holds that reference (ref_sequence) and the emulations, which the paged and GPU test
files import."""

import ctypes
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from reference import (EMULATED_HEAD_DIM_PAIRS, EMULATED_HEAD_DIMS, check_emulated_head_dims, reference_of,  # noqa: E402
                       variant_backward_fp64)

# ---------------------------------------------------------------------------------------------------------------
# Float64 reference, one sequence at a time.


def ref_sequence(q, k, v, causal=False, softmax_scale=None):
    """Attention of one sequence in float64: q (Sq, Hq, D), k (Sk, Hkv, D), v (Sk, Hkv, Dv) -> (out (Sq, Hq, Dv),
    lse (Hq, Sq)); Dv is D or a head dim of v's own.

    Causal is bottom-right aligned (query i sees key j iff j <= i + Sk - Sq); a row that sees no key (Sk = 0, or
    Sq > Sk under causal) gives out 0 and lse -inf. GQA: query head h reads KV head h // (Hq // Hkv)."""
    seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[0], k.shape[1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    qd = q.double().transpose(0, 1)  # (Hq, Sq, D)
    kd = k.double().transpose(0, 1).repeat_interleave(heads_q // heads_kv, dim=0)
    vd = v.double().transpose(0, 1).repeat_interleave(heads_q // heads_kv, dim=0)
    scores = (qd @ kd.transpose(-1, -2)) * scale  # (Hq, Sq, Sk)
    if causal:
        i = torch.arange(seqlen_q, device=q.device)[:, None]
        j = torch.arange(seqlen_k, device=q.device)[None, :]
        scores = scores.masked_fill(~(j <= i + (seqlen_k - seqlen_q)), -math.inf)
    lse = torch.logsumexp(scores, dim=-1) if seqlen_k else torch.full((heads_q, seqlen_q), -math.inf,
                                                                      dtype=torch.float64, device=q.device)
    empty_rows = torch.isneginf(lse)[..., None]  # rows that see no key: 0 (exp(-inf - -inf) would be NaN)
    probs = torch.where(empty_rows, 0.0, torch.exp(scores - torch.where(empty_rows, 0.0, lse[..., None])))
    out = probs @ vd
    return out.transpose(0, 1), lse


def ref_varlen(q, k, v, lens_q, lens_k, causal=False, softmax_scale=None, used_k=None, variants=None):
    """Per-sequence float64 reference of a packed batch (host lists of lengths). Rows of q not covered by the
    sequences come back as NaN (the op leaves them unwritten). variants: flashcore._ops.Variants (window, softcap,
    sinks, chunk; reference.reference_variants per sequence) or None."""
    out = torch.full(q.shape[:2] + v.shape[2:], math.nan, dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), math.nan, dtype=torch.float64, device=q.device)
    sq = sk = 0
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        used = nk if used_k is None else max(0, min(nk, used_k[b]))
        if variants is None:
            o, l = ref_sequence(q[sq:sq + nq], k[sk:sk + used], v[sk:sk + used], causal, softmax_scale)
        else:
            o, l = reference_of(q[None, sq:sq + nq], k[None, sk:sk + used], v[None, sk:sk + used], causal,
                                softmax_scale, variants)
            o, l = o[0], l[0]
        out[sq:sq + nq], lse[:, sq:sq + nq] = o, l
        sq, sk = sq + nq, sk + nk
    return out, lse


def cu_seqlens(lengths, device="cpu"):
    values = [0]
    for n in lengths:
        values.append(values[-1] + n)
    return torch.tensor(values, dtype=torch.int32, device=device)


# ---------------------------------------------------------------------------------------------------------------
# CPU emulations of the kernel launches (they read lengths on the host, which the real op never does).


class EmulatedCaps:
    path = "<cpu emulation>"

    @staticmethod
    def compiled():
        return ("float16", "bfloat16"), EMULATED_HEAD_DIMS

    @staticmethod
    def compiled_head_dim_pairs():
        return EMULATED_HEAD_DIM_PAIRS


def emulate_serving_on_cpu(monkeypatch, calls=None):
    """Run varlen_attention / attention_with_kvcache (dense and paged) on CPU tensors with ref_sequence in place of
    the native library, and varlen_attention's backward with reference.variant_backward_fp64 per sequence. `calls`, a
    list, receives the keyword arguments of every emulated launch."""

    def check_supported(q, head_dim, head_dim_v=None):
        check_emulated_head_dims(head_dim, head_dim_v)
        return EmulatedCaps

    def sequence(q, k, v, causal, scale, variants):
        if variants is None:
            return ref_sequence(q, k, v, causal, scale)
        o, l = reference_of(q[None], k[None], v[None], causal, scale, variants)
        return o[0], l[0]

    def launch(lib, q, k, v, out, lse, causal, softmax_scale, seqused_k=None, block_table=None, num_splits=0,
               variants=None):
        if calls is not None:
            calls.append({"kind": "paged" if block_table is not None else "dense", "num_splits": num_splits,
                          "block_table": block_table, **({} if variants is None else {"variants": variants})})
        scale = softmax_scale or None
        for b in range(q.shape[0]):
            if block_table is not None:
                page_size = k.shape[1]
                capacity = block_table.shape[1] * page_size
                n = capacity if seqused_k is None else max(0, min(int(seqused_k[b]), capacity))
                idx = torch.arange(n)
                pages = block_table[b].long()[idx // page_size]
                kb, vb = k[pages, idx % page_size], v[pages, idx % page_size]
            else:
                n = k.shape[1] if seqused_k is None else max(0, min(int(seqused_k[b]), k.shape[1]))
                kb, vb = k[b, :n], v[b, :n]
            o, l = sequence(q[b], kb, vb, causal, scale, variants)
            out[b] = o.to(out.dtype)
            if lse.numel():
                lse[b] = l.float()

    def launch_varlen(lib, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, softmax_scale, seqused_k=None,
                      variants=None, seqused_q=None):
        if calls is not None:
            calls.append({"kind": "varlen", "max_seqlen_q": max_q, "max_seqlen_k": max_k,
                          **({} if variants is None else {"variants": variants}),
                          **({} if seqused_q is None else {"seqused_q": seqused_q})})
        cq, ck = cu_q.tolist(), cu_k.tolist()
        lens_q = [b - a for a, b in zip(cq, cq[1:])]
        lens_k = [b - a for a, b in zip(ck, ck[1:])]
        used = None if seqused_k is None else seqused_k.tolist()
        if seqused_q is not None:  # sequence b's first seqused_q[b] rows only: the others are not written
            for b, n in enumerate(seqused_q.tolist()):
                n = max(0, min(n, lens_q[b]))
                o, l = ref_varlen(q[cq[b]:cq[b] + n], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]], [n], [lens_k[b]],
                                  causal, softmax_scale or None, None if used is None else [used[b]], variants)
                out[cq[b]:cq[b] + n] = o.to(out.dtype)
                if lse.numel():
                    lse[:, cq[b]:cq[b] + n] = l.float()
            return
        o, l = ref_varlen(q, k, v, lens_q, lens_k, causal, softmax_scale or None, used, variants)
        covered = cq[-1]
        out[:covered] = o[:covered].to(out.dtype)
        if lse.numel():
            lse[:, :covered] = l[:, :covered].float()

    def launch_varlen_backward(lib, dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, causal,
                               softmax_scale, deterministic, variants=None, dsinks=None, seqused_q=None,
                               seqused_k=None):
        """Each sequence's backward by the float64 formulas (reference.variant_backward_fp64, D from the out given),
        over its first seqused_q[b] queries and seqused_k[b] keys where given (the other rows' gradients: zeros)."""
        if calls is not None:
            calls.append({"kind": "varlen_backward", "max_seqlen_q": max_q, "max_seqlen_k": max_k,
                          "deterministic": deterministic, "dsinks": dsinks is not None,
                          **({} if variants is None else {"variants": variants}),
                          **({} if seqused_q is None else {"seqused_q": seqused_q}),
                          **({} if seqused_k is None else {"seqused_k": seqused_k})})
        window = (-1, -1) if variants is None else (variants.window_size_left, variants.window_size_right)
        cap = 0.0 if variants is None else variants.softcap
        sinks = None if variants is None else variants.sinks
        chunk = 0 if variants is None else variants.attention_chunk
        cq, ck = cu_q.tolist(), cu_k.tolist()
        total = torch.zeros(q.shape[1], dtype=torch.float64)
        for t in (dq, dk, dv):
            t.zero_()
        for b in range(len(cq) - 1):
            nq, nk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
            nq = nq if seqused_q is None else max(0, min(int(seqused_q[b]), nq))
            nk = nk if seqused_k is None else max(0, min(int(seqused_k[b]), nk))
            qs, ks = slice(cq[b], cq[b] + nq), slice(ck[b], ck[b] + nk)
            if nq == 0 or nk == 0:
                continue
            one = lambda t, s: t[s][None]  # noqa: E731
            gq, gk, gv, gs = variant_backward_fp64(one(q, qs), one(k, ks), one(v, ks), one(dout, qs), causal,
                                                   softmax_scale or None, window, cap, sinks, chunk,
                                                   out=one(out, qs))
            dq[qs], dk[ks], dv[ks] = gq[0].to(dq.dtype), gk[0].to(dk.dtype), gv[0].to(dv.dtype)
            if gs is not None:
                total += gs
        if dsinks is not None:
            dsinks.copy_(total)

    monkeypatch.setattr(_ops, "_check_device", lambda q, k, v: None)
    monkeypatch.setattr(_ops, "_check_supported", check_supported)
    monkeypatch.setattr(_ops, "_launch", launch)
    monkeypatch.setattr(_ops, "_launch_varlen", launch_varlen)
    monkeypatch.setattr(_ops, "_launch_varlen_backward", launch_varlen_backward)


@pytest.fixture
def emulated(monkeypatch):
    calls = []
    emulate_serving_on_cpu(monkeypatch, calls)
    return calls


def _packed(lens_q, lens_k, heads_q=4, heads_kv=2, head_dim=64, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), heads_q, head_dim, generator=gen).to(dtype)
    k = torch.randn(sum(lens_k), heads_kv, head_dim, generator=gen).to(dtype)
    v = torch.randn(sum(lens_k), heads_kv, head_dim, generator=gen).to(dtype)
    return q, k, v, cu_seqlens(lens_q), cu_seqlens(lens_k)


# ---------------------------------------------------------------------------------------------------------------
# The reference itself.


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq, sk", [(1, 1), (7, 7), (3, 9), (9, 3)])
def test_reference_matches_sdpa_reference(causal, sq, sk):
    from reference import reference

    q, k, v, _, _ = _packed([sq], [sk], heads_q=6, heads_kv=2, dtype=torch.float32)
    out, lse = ref_sequence(q, k, v, causal)
    ref_out, ref_lse = reference(q[None], k[None], v[None], causal)
    torch.testing.assert_close(out.float(), ref_out[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.float(), ref_lse[0], atol=1e-5, rtol=1e-5)


def test_reference_without_keys():
    q, k, v, _, _ = _packed([3], [0], dtype=torch.float32)
    out, lse = ref_sequence(q, k, v)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)


# ---------------------------------------------------------------------------------------------------------------
# Argument errors raised by the Python layer (no GPU; the device check comes after the shape checks or is
# emulated away).


def test_cpu_tensors_are_rejected():
    q, k, v, cq, ck = _packed([3, 5], [3, 5])
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        flashcore.varlen_attention(q, k, v, cq, ck, 5, 5)


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].long()}, ValueError, "cu_seqlens_q must be an int32"),
        (lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"].float()}, ValueError, "cu_seqlens_k must be an int32"),
        (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"][None]}, ValueError, r"shape \(batch \+ 1,\)"),
        (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"][:1]}, ValueError, "batch >= 1"),
        (lambda a: {**a, "cu_seqlens_k": a["cu_seqlens_k"][:2]}, ValueError, "the same length"),
        (lambda a: {**a, "cu_seqlens_q": [0, 3, 8]}, TypeError, "cu_seqlens_q must be a torch.Tensor"),
        (lambda a: {**a, "q": a["q"][None]}, ValueError, "must be 3-D"),
        (lambda a: {**a, "v": a["v"][:, :1]}, ValueError, "k and v must have the same shape but for the last"),
        (lambda a: {**a, "q": a["q"][:, :, :32]}, ValueError, "q and k must have the same head_dim"),
        (lambda a: {**a, "k": a["k"][:, :, :32]}, ValueError, "q and k must have the same head_dim"),
        (lambda a: {**a, "v": a["v"][:, :, :32]}, ValueError, r"\(head_dim, head_dim_v\) = \(64, 32\) is not"),
        (lambda a: {**a, "q": a["q"][:, :3]}, ValueError, "multiple of the number of key/value heads"),
        (lambda a: {**a, "q": a["q"].float()}, TypeError, "float16 or bfloat16"),
        (lambda a: {**a, "k": a["k"].half()}, TypeError, "same dtype"),
        (lambda a: {**a, "max_seqlen_q": torch.tensor(5)}, TypeError, "max_seqlen_q must be a Python int"),
        (lambda a: {**a, "max_seqlen_k": 5.0}, TypeError, "max_seqlen_k must be an int"),
        (lambda a: {**a, "max_seqlen_k": -1}, ValueError, "max_seqlen_k must be >= 0"),
        (lambda a: {**a, "seqused_k": torch.tensor([1, 2])}, ValueError, "seqused_k must be None or an int32"),
        (lambda a: {**a, "seqused_k": torch.tensor([1, 2, 3], dtype=torch.int32)}, ValueError, r"\(batch,\) = \(2,\)"),
        (lambda a: {**a, "softmax_scale": -1.0}, ValueError, "softmax_scale"),
    ],
    ids=["cu-q-int64", "cu-k-float", "cu-2d", "cu-no-batch", "cu-length-mismatch", "cu-list", "q-4d", "kv-shape",
         "head-dim", "k-head-dim", "head-dim-v-pair", "head-ratio", "fp32", "mixed-dtype", "max-tensor", "max-float", "max-negative",
         "seqused-int64", "seqused-batch", "scale"],
)
def test_argument_errors(emulated, mutate, exc, match):
    q, k, v, cq, ck = _packed([3, 5], [3, 5])
    args = mutate({"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck, "max_seqlen_q": 5,
                   "max_seqlen_k": 5})
    with pytest.raises(exc, match=match):
        flashcore.varlen_attention(**args)
    assert not emulated  # nothing was launched


def test_cu_seqlens_on_another_device(emulated):
    q, k, v, cq, ck = _packed([3, 5], [3, 5])
    with pytest.raises(ValueError, match="cu_seqlens_q is on meta"):
        flashcore.varlen_attention(q, k, v, cq.to("meta"), ck, 5, 5)


# ---------------------------------------------------------------------------------------------------------------
# The C params (host-only stub library: records what forward receives).


def _stub_lib(use_library, stub_library):
    use_library(stub_library)
    return _lib.load()


def test_varlen_params(use_library, stub_library):
    lib = _stub_lib(use_library, stub_library)
    lens_q, lens_k = [3, 0, 13], [5, 7, 13]
    q, k, v, cq, ck = _packed(lens_q, lens_k, heads_q=8, heads_kv=2, head_dim=64)
    out = torch.empty_like(q)
    lse = torch.empty(8, q.shape[0], dtype=torch.float32)
    used = torch.tensor([5, 6, 13], dtype=torch.int32)
    params = _ops.kernel_params(lib, q, k, v, out, lse, True, 0.25, used, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                max_seqlen_q=13, max_seqlen_k=13)
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.batch, seen.seqlen_q, seen.seqlen_k, seen.num_heads_q, seen.num_heads_kv, seen.head_dim) == (
        3, 13, 13, 8, 2, 64)
    assert (seen.total_q, seen.total_k) == (16, 25)
    assert (seen.cu_seqlens_q, seen.cu_seqlens_k, seen.seqused_k) == (cq.data_ptr(), ck.data_ptr(), used.data_ptr())
    assert (seen.q, seen.k, seen.v, seen.o, seen.lse) == (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                                          lse.data_ptr())
    for strides, t in ((seen.q_strides, q), (seen.k_strides, k), (seen.v_strides, v), (seen.o_strides, out)):
        assert (strides.seq, strides.head, strides.dim) == (t.stride(0), t.stride(1), 1)
        assert strides.batch > 0 and strides.batch % 8 == 0  # ignored by the library; a valid filler
    assert seen.lse_capacity == 8 * 16  # (Hq, total_q)
    assert (seen.causal, seen.softmax_scale) == (1, 0.25)
    assert seen.block_table is None and (seen.page_size, seen.num_pages, seen.block_table_stride) == (0, 0, 0)
    assert (seen.num_splits, seen.flags) == (0, 0)


def test_varlen_params_strided_heads(use_library, stub_library):
    """q, k, v as head slices of one packed qkv tensor: passed as they are (the seq stride is 3 * H * D)."""
    lib = _stub_lib(use_library, stub_library)
    qkv = torch.randn(20, 12, 64).bfloat16()
    q, k, v = qkv[:, :4], qkv[:, 4:8], qkv[:, 8:]
    params = _ops.kernel_params(lib, q, k, v, torch.empty_like(q), None, False, 0.0, cu_seqlens_q=cu_seqlens([20]),
                                cu_seqlens_k=cu_seqlens([20]), max_seqlen_q=20, max_seqlen_k=20)
    assert (params.q_strides.seq, params.k_strides.seq, params.v_strides.seq) == (768, 768, 768)
    assert (params.k, params.v) == (k.data_ptr(), v.data_ptr())
    assert params.lse is None and params.lse_capacity == 0


def test_kernel_params_refuses_packed_k_with_block_table(use_library, stub_library):
    lib = _stub_lib(use_library, stub_library)
    q, k, v, cq, ck = _packed([4], [4])
    with pytest.raises(ValueError, match="cu_seqlens_k and block_table"):
        _ops.kernel_params(lib, q, k, v, torch.empty_like(q), None, False, 0.0, cu_seqlens_q=cq, cu_seqlens_k=ck,
                           max_seqlen_q=4, max_seqlen_k=4, block_table=torch.zeros(1, 1, dtype=torch.int32))


# ---------------------------------------------------------------------------------------------------------------
# The op with the kernel emulated on CPU.


@pytest.mark.parametrize("causal", [False, True])
def test_emulated_outputs(emulated, causal):
    lens_q, lens_k = [3, 0, 1, 17, 8], [5, 4, 0, 17, 2]
    q, k, v, cq, ck = _packed(lens_q, lens_k, heads_q=8, heads_kv=2)
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, 17, 17, causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (8, q.shape[0]) and lse.dtype == torch.float32
    ref_out, ref_lse = ref_varlen(q, k, v, lens_q, lens_k, causal)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    assert emulated[-1] == {"kind": "varlen", "max_seqlen_q": 17, "max_seqlen_k": 17}
    only_out = flashcore.varlen_attention(q, k, v, cq, ck, 17, 17, causal=causal)
    assert isinstance(only_out, torch.Tensor) and torch.equal(only_out, out)


def test_emulated_seqused_k(emulated):
    lens = [6, 9]
    q, k, v, cq, ck = _packed(lens, lens)
    used = torch.tensor([2, 9], dtype=torch.int32)
    k[2:6] = float("nan")  # the first sequence's unused keys
    out = flashcore.varlen_attention(q, k, v, cq, ck, 9, 9, seqused_k=used)
    torch.testing.assert_close(out.double(), ref_varlen(q, k, v, lens, lens, used_k=[2, 9])[0], atol=1e-2, rtol=1e-2)


def test_max_seqlen_bounded_by_the_packed_tensors(emulated):
    q, k, v, cq, ck = _packed([3, 2], [4, 4])
    flashcore.varlen_attention(q, k, v, cq, ck, 4096, 4096)
    assert emulated[-1]["max_seqlen_q"] == 5 and emulated[-1]["max_seqlen_k"] == 8


def test_empty_and_keyless(emulated):
    q, k, v, cq, ck = _packed([0, 0], [3, 4])
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, 0, 4, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)
    q, k, v, cq, ck = _packed([3, 4], [0, 0])
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, 4, 0, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)
    assert not emulated  # neither reached the kernel


def test_custom_op_registration(emulated):
    q, k, v, cq, ck = _packed([3, 0, 9], [5, 2, 9])
    used = torch.tensor([5, 1, 9], dtype=torch.int32)
    for seqused in (None, used):
        torch.library.opcheck(
            torch.ops.flashcore.varlen_attention_fwd.default,
            (q, k, v, cq, ck, seqused, 9, 9, True, 0.0, True),
            test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"),
        )


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph_wiring(emulated, backend):
    torch._dynamo.reset()
    lens_q, lens_k = [3, 11, 1], [7, 11, 4]
    q, k, v, cq, ck = _packed(lens_q, lens_k)

    def fn(q, k, v, cq, ck):
        out, lse = flashcore.varlen_attention(q, k, v, cq, ck, 11, 11, causal=True, return_lse=True)
        return out * 2, lse

    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    for got, want in zip(compiled(q, k, v, cq, ck), fn(q, k, v, cq, ck)):
        torch.testing.assert_close(got, want)


def test_exported_names():
    assert "varlen_attention" in flashcore.__all__ and "varlen_attention" in dir(flashcore)
    assert flashcore.varlen_attention is _ops.varlen_attention


def test_signature_follows_fa3_names():
    import inspect

    params = inspect.signature(flashcore.varlen_attention).parameters
    assert list(params) == ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
                            "softmax_scale", "causal", "seqused_k", "return_lse", "window_size", "attention_chunk",
                            "softcap", "sinks", "seqused_q"]
    keyword_only = [name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keyword_only == list(params)[7:]
    assert {name: params[name].default for name in keyword_only} == {
        "softmax_scale": None, "causal": False, "seqused_k": None, "return_lse": False, "window_size": (-1, -1),
        "attention_chunk": 0, "softcap": 0.0, "sinks": None, "seqused_q": None}


def test_fa3_positional_call_fails_loudly(emulated):
    """FA3's 8th and 9th positional arguments are seqused_q and seqused_k: here they must be keywords."""
    q, k, v, cq, ck = _packed([3, 5], [3, 5])
    with pytest.raises(TypeError):
        flashcore.varlen_attention(q, k, v, cq, ck, 5, 5, None, None)
    assert not emulated
