"""Reference attention in fp32 (torch SDPA's math backend on upcast inputs) and in float64 (chunked), the
dequantization of 8-bit inputs, and a CPU emulation of the op (8-bit calls included).

Imports torch: use only from tests that already skipped without it."""

import math

import torch
import torch.nn.functional as F


def causal_mask(seqlen_q, seqlen_k, device):
    """Bottom-right aligned: query i sees key j iff j <= i + seqlen_k - seqlen_q."""
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    return j <= i + (seqlen_k - seqlen_q)


def reference(q, k, v, causal=False, softmax_scale=None, upcast=True):
    """(out (B, Sq, Hq, Dv), lse (B, Hq, Sq) fp32) for (B, S, H, D) inputs (v (B, Sk, Hkv, Dv): Dv may differ from
    q's and k's D); rows that see no key give 0 / -inf.

    upcast=True: fp32 math-backend SDPA on upcast inputs (the reference); upcast=False: SDPA at the inputs'
    dtype (the baseline for the error rule)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    if upcast:
        qt, kt, vt = qt.float(), kt.float(), vt.float()
    kt = kt.repeat_interleave(heads_q // heads_kv, dim=1)
    vt = vt.repeat_interleave(heads_q // heads_kv, dim=1)
    mask = causal_mask(seqlen_q, seqlen_k, q.device) if causal else None
    empty_rows = None
    if mask is not None:
        empty_rows = ~mask.any(dim=-1)  # (Sq,)
        mask = mask | empty_rows[:, None]  # keep SDPA away from all-masked rows; zeroed below
    if upcast:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale)
    else:
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale)
    scores = (qt.float() @ kt.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    if empty_rows is not None:
        out[:, :, empty_rows] = 0
        lse[:, :, empty_rows] = -math.inf
    return out.transpose(1, 2), lse


def reference_fp64(q, k, v, causal=False, softmax_scale=None, max_scores=2**25):
    """(out, lse) in float64 for (B, S, H, D) inputs of any float dtype: out (B, Sq, Hq, Dv), lse (B, Hq, Sq), Dv
    v's last dimension (q's and k's D, or a head dim of v's own).

    Computed on the inputs' device one batch entry and block of query rows at a time (at most `max_scores` scores
    at once). Causal is bottom-right aligned; rows that see no key give 0 / -inf. GQA: query head h reads KV head
    h // (Hq // Hkv). The default scale is 1/sqrt(D), q's head dim."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    out = torch.zeros(batch, seqlen_q, heads_q, v.shape[3], dtype=torch.float64, device=q.device)
    lse = torch.full((batch, heads_q, seqlen_q), -math.inf, dtype=torch.float64, device=q.device)
    if seqlen_k == 0 or seqlen_q == 0:
        return out, lse
    rows = max(1, max_scores // (heads_q * seqlen_k))
    for b in range(batch):
        kd = k[b].double().transpose(0, 1).repeat_interleave(heads_q // heads_kv, dim=0)  # (Hq, Sk, D)
        vd = v[b].double().transpose(0, 1).repeat_interleave(heads_q // heads_kv, dim=0)
        for start in range(0, seqlen_q, rows):
            stop = min(seqlen_q, start + rows)
            qd = q[b, start:stop].double().transpose(0, 1)  # (Hq, rows, D)
            scores = (qd @ kd.transpose(-1, -2)) * scale
            if causal:
                i = torch.arange(start, stop, device=q.device)[:, None]
                j = torch.arange(seqlen_k, device=q.device)[None, :]
                scores = scores.masked_fill(~(j <= i + (seqlen_k - seqlen_q)), -math.inf)
            block_lse = torch.logsumexp(scores, dim=-1)  # (Hq, rows)
            empty = torch.isneginf(block_lse)[..., None]
            probs = torch.where(empty, 0.0, torch.exp(scores - torch.where(empty, 0.0, block_lse[..., None])))
            out[b, start:stop] = (probs @ vd).transpose(0, 1)
            lse[b, :, start:stop] = block_lse
    return out, lse


def variant_mask(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1), attention_chunk=0, device=None, rows=None):
    """(rows, Sk) bool mask of the keys each query row sees, FlashAttention's rules written out one by one (not the
    library's code): with d = Sk - Sq (bottom-right alignment), query i sees key j iff
      causal:                    j <= i + d
      window_size=(left, right): j >= i + d - left (left != -1) and j <= i + d + right (right != -1; 0 with causal)
      attention_chunk = c > 0:   floor(j / c) == floor((i + d) / c)
    rows: the query indices (default all Sq of them)."""
    i = (torch.arange(seqlen_q, device=device) if rows is None else rows)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    diagonal = i + (seqlen_k - seqlen_q)
    left, right = window_size
    if causal:
        right = 0
    sees = torch.ones(i.shape[0], seqlen_k, dtype=torch.bool, device=device)
    if left != -1:
        sees &= j >= diagonal - left
    if right != -1:
        sees &= j <= diagonal + right
    if attention_chunk > 0:
        sees &= torch.div(j, attention_chunk, rounding_mode="floor") == torch.div(diagonal, attention_chunk,
                                                                                  rounding_mode="floor")
    return sees


def reference_variants(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0, sinks=None,
                       attention_chunk=0, max_scores=2**25):
    """(out, lse) in float64 of (B, S, H, D) inputs with the attention variants (flashcore.h; FlashAttention's
    semantics): the mask of variant_mask; softcap > 0: s = softcap * tanh(s / softcap) on s = scale * q.k;
    sinks (Hq,): exp(sinks[h]) joins each row's denominator (unscaled), not its output. out (B, Sq, Hq, Dv) (Dv: v's
    last dimension), lse (B, Hq, Sq). A row that sees no key: out 0, lse sinks[h] (-inf without sinks). Computed one
    batch entry and block of query rows at a time on the inputs' device."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale else 1.0 / math.sqrt(head_dim)
    out = torch.zeros(batch, seqlen_q, heads_q, v.shape[3], dtype=torch.float64, device=q.device)
    empty_lse = -math.inf if sinks is None else sinks.double()[:, None].expand(heads_q, seqlen_q)
    lse = torch.empty(batch, heads_q, seqlen_q, dtype=torch.float64, device=q.device)
    lse[:] = empty_lse
    if seqlen_k == 0 or seqlen_q == 0:
        return out, lse
    rows = max(1, max_scores // (heads_q * seqlen_k))
    for b in range(batch):
        kd = k[b].double().transpose(0, 1).repeat_interleave(heads_q // heads_kv, dim=0)  # (Hq, Sk, D)
        vd = v[b].double().transpose(0, 1).repeat_interleave(heads_q // heads_kv, dim=0)
        for start in range(0, seqlen_q, rows):
            stop = min(seqlen_q, start + rows)
            qd = q[b, start:stop].double().transpose(0, 1)  # (Hq, rows, D)
            scores = (qd @ kd.transpose(-1, -2)) * scale
            if softcap:
                scores = softcap * torch.tanh(scores / softcap)
            sees = variant_mask(seqlen_q, seqlen_k, causal, window_size, attention_chunk, q.device,
                                torch.arange(start, stop, device=q.device))
            scores = scores.masked_fill(~sees, -math.inf)
            if sinks is not None:  # the sink as one more logit of every row, dropped from the output
                sink = sinks.double().to(q.device)[:, None, None].expand(heads_q, stop - start, 1)
                block_lse = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1)
            else:
                block_lse = torch.logsumexp(scores, dim=-1)  # (Hq, rows)
            empty = torch.isneginf(block_lse)[..., None]
            probs = torch.where(empty, 0.0, torch.exp(scores - torch.where(empty, 0.0, block_lse[..., None])))
            out[b, start:stop] = (probs @ vd).transpose(0, 1)
            lse[b, :, start:stop] = block_lse
    return out, lse


def reference_of(q, k, v, causal, softmax_scale, variants):
    """reference_variants with the variants of an op call (flashcore._ops.Variants, or None)."""
    if variants is None:
        return reference_variants(q, k, v, causal, softmax_scale)
    return reference_variants(q, k, v, causal, softmax_scale, (variants.window_size_left, variants.window_size_right),
                              variants.softcap, variants.sinks, variants.attention_chunk)


def attention_autograd(q, k, v, causal=False, softmax_scale=None, dtype=torch.float64):
    """(out (B, Sq, Hq, D), lse (B, Hq, Sq)) of (B, S, H, D) inputs in `dtype`, as plain differentiable torch ops (the
    whole score matrix at once: small shapes). Causal is bottom-right aligned; rows that see no key give 0 / -inf and
    pass no gradient. GQA: query head h reads KV head h // (Hq // Hkv). (attention_variants_autograd without a
    variant.)"""
    return attention_variants_autograd(q, k, v, causal, softmax_scale, dtype=dtype)


def reference_grads(q, k, v, dout, causal=False, softmax_scale=None, dlse=None, dtype=torch.float64):
    """(dq, dk, dv) in `dtype` of attention_autograd for the upstream gradients dout (B, Sq, Hq, D) and, optionally,
    dlse (B, Hq, Sq)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, lse = attention_autograd(*leaves, causal, softmax_scale, dtype)
    outputs, grads = [out], [dout.to(dtype)]
    if dlse is not None:
        outputs.append(lse)
        grads.append(torch.where(torch.isfinite(lse), dlse.to(dtype), 0.0))
    return torch.autograd.grad(outputs, leaves, grads, allow_unused=True)


def backward_fp64(q, k, v, dout, causal=False, softmax_scale=None):
    """(dq, dk, dv) in float64 from the backward's formulas, as the kernel computes them (no autograd: it runs inside
    the emulated op, below autograd): P = softmax(S), dV = P^T dO, dP = dO V^T, D = rowsum(dO * O),
    dS = P * (dP - D), dQ = scale dS K, dK = scale dS^T Q; GQA sums dK, dV over each KV head's query heads. v, dout
    and dV may have a head dim of v's own (head_dim_v)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    scale = softmax_scale if softmax_scale else 1.0 / math.sqrt(head_dim)
    qt, dot = (t.double().transpose(1, 2) for t in (q, dout))  # (B, Hq, Sq, D)
    kt, vt = (t.double().transpose(1, 2).repeat_interleave(group, dim=1) for t in (k, v))  # (B, Hq, Sk, D)
    scores = (qt @ kt.transpose(-1, -2)) * scale
    if causal:
        scores = scores.masked_fill(~causal_mask(seqlen_q, seqlen_k, q.device), -math.inf)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.where(torch.isneginf(lse), 0.0, torch.exp(scores - torch.where(torch.isneginf(lse), 0.0, lse)))
    out = probs @ vt
    dv = probs.transpose(-1, -2) @ dot
    dp = dot @ vt.transpose(-1, -2)
    ds = probs * (dp - (dot * out).sum(-1, keepdim=True))
    dq = (ds @ kt) * scale
    dk = (ds.transpose(-1, -2) @ qt) * scale

    def per_kv_head(t):  # (B, Hq, Sk, D) -> (B, Sk, Hkv, D); D: k's head dim (dk) or v's (dv, head_dim_v)
        return t.reshape(batch, heads_kv, group, seqlen_k, t.shape[-1]).sum(2).transpose(1, 2)

    return dq.transpose(1, 2), per_kv_head(dk), per_kv_head(dv)


def attention_variants_autograd(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                                sinks=None, attention_chunk=0, dtype=torch.float64):
    """(out (B, Sq, Hq, D), lse (B, Hq, Sq)) of (B, S, H, D) inputs with the attention variants (window, softcap,
    sinks, chunk; the semantics of reference_variants, the mask of variant_mask) in `dtype`, as plain differentiable
    torch ops (the whole score matrix at once: moderate shapes): differentiable in q, k, v and sinks. A row that sees
    no key: out 0, lse sinks[h] (-inf without sinks) and no gradient to q, k, v (with sinks, lse = sinks[h] passes its
    gradient to the sink)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale else 1.0 / math.sqrt(head_dim)
    qt = q.to(dtype).transpose(1, 2)
    kt = k.to(dtype).transpose(1, 2).repeat_interleave(heads_q // heads_kv, dim=1)
    vt = v.to(dtype).transpose(1, 2).repeat_interleave(heads_q // heads_kv, dim=1)
    scores = (qt @ kt.transpose(-1, -2)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    sees = variant_mask(seqlen_q, seqlen_k, causal, window_size, attention_chunk, q.device)  # (Sq, Sk)
    scores = scores.masked_fill(~sees, -math.inf)
    if sinks is not None:  # the sink as one more logit of every row (finite lse everywhere), dropped from the output
        sink = sinks.to(dtype)[None, :, None, None].expand(batch, heads_q, seqlen_q, 1)
        lse = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1)
        out = torch.exp(scores - lse[..., None]) @ vt
    else:
        empty = ~sees.any(dim=-1)  # (Sq,): rows that see no key
        scores = scores.masked_fill(empty[:, None], 0.0)  # no -inf - -inf below; these rows are zeroed
        lse = torch.logsumexp(scores, dim=-1)
        out = (torch.exp(scores - lse[..., None]) @ vt).masked_fill(empty[:, None], 0.0)
        lse = lse.masked_fill(empty, -math.inf)
    return out.transpose(1, 2), lse


def reference_variant_grads(q, k, v, dout, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                            sinks=None, attention_chunk=0, dlse=None, dtype=torch.float64):
    """(dq, dk, dv, dsinks) in `dtype` of attention_variants_autograd for the upstream gradients dout (B, Sq, Hq, D)
    and, optionally, dlse (B, Hq, Sq); dsinks is None without sinks."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.detach().to(dtype).requires_grad_()
    out, lse = attention_variants_autograd(*leaves, causal, softmax_scale, window_size, softcap, sink_leaf,
                                           attention_chunk, dtype)
    outputs, grads = [out], [dout.to(dtype)]
    if dlse is not None:
        outputs.append(lse)
        grads.append(torch.where(torch.isfinite(lse), dlse.to(dtype), 0.0))
    wrt = leaves + ([sink_leaf] if sink_leaf is not None else [])
    got = torch.autograd.grad(outputs, wrt, grads, allow_unused=True)
    got = [torch.zeros_like(w) if g is None else g for g, w in zip(got, wrt)]
    return (*got[:3], got[3] if sink_leaf is not None else None)


def variant_backward_fp64(q, k, v, dout, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                          sinks=None, attention_chunk=0, out=None):
    """(dq, dk, dv, dsinks) in float64 from the backward's formulas with the variants, as the kernel computes them (no
    autograd): S = softcap(scale Q K^T) masked (variant_mask: window and chunk), P = exp(S - lse) with the sink in
    lse's denominator, dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P * (dP - D) times the softcap's derivative
    1 - tanh^2, dQ = scale dS K,
    dK = scale dS^T Q (GQA: dK, dV summed over each KV head's query heads), dsinks[h] = -sum over b, i of
    exp(sinks[h] - lse) D (None without sinks). out: the O that D reads (the kernel reads the forward's O as given);
    None: the float64 output recomputed here."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    scale = softmax_scale if softmax_scale else 1.0 / math.sqrt(head_dim)
    qt, dot = (t.double().transpose(1, 2) for t in (q, dout))  # (B, Hq, Sq, D)
    kt, vt = (t.double().transpose(1, 2).repeat_interleave(group, dim=1) for t in (k, v))  # (B, Hq, Sk, D)
    raw = (qt @ kt.transpose(-1, -2)) * scale
    tanh = torch.tanh(raw / softcap) if softcap else None
    scores = softcap * tanh if softcap else raw
    scores = scores.masked_fill(~variant_mask(seqlen_q, seqlen_k, causal, window_size, attention_chunk, q.device),
                                -math.inf)
    if sinks is not None:
        sink = sinks.double().to(q.device)[None, :, None, None].expand(batch, heads_q, seqlen_q, 1)
        lse = torch.logsumexp(torch.cat([scores, sink], dim=-1), dim=-1, keepdim=True)
    else:
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    empty = torch.isneginf(lse)
    probs = torch.where(empty, 0.0, torch.exp(scores - torch.where(empty, 0.0, lse)))
    o = probs @ vt if out is None else out.double().transpose(1, 2)
    d_rows = (dot * o).sum(-1, keepdim=True)  # D (B, Hq, Sq, 1)
    dv = probs.transpose(-1, -2) @ dot
    ds = probs * (dot @ vt.transpose(-1, -2) - d_rows)
    if softcap:
        ds = ds * (1.0 - tanh * tanh)
    dq = (ds @ kt) * scale
    dk = (ds.transpose(-1, -2) @ qt) * scale
    dsinks = None
    if sinks is not None:
        dsinks = -(torch.exp(sink - lse) * d_rows).sum(dim=(0, 2, 3))

    def per_kv_head(t):  # (B, Hq, Sk, D) -> (B, Sk, Hkv, D); D: k's head dim (dk) or v's (dv, head_dim_v)
        return t.reshape(batch, heads_kv, group, seqlen_k, t.shape[-1]).sum(2).transpose(1, 2)

    return dq.transpose(1, 2), per_kv_head(dk), per_kv_head(dv), dsinks


def dequantize(x, descale, heads_kv=None):
    """float64 values of an 8-bit (B, S, H, D) tensor: x * descale, descale float32 (B, Hkv) (None: 1), query head
    h using the factor of KV head h // (H // Hkv)."""
    if descale is None:
        return x.double()
    heads = x.shape[2]
    per_head = descale.double().repeat_interleave(heads // descale.shape[1], dim=1)  # (B, H)
    return x.double() * per_head[:, None, :, None]


def rel_rmse(out, ref):
    """Relative RMSE: RMS(out - ref) / RMS(ref), in float64."""
    ref = ref.double()
    return ((out.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


# The head dims the CPU emulations "compile": 16-bit head dims (v of q's head dim), and the (head_dim, head_dim_v) pairs
# with a head dim of v's own (the library's 0.7 build: DeepSeek MLA's (192, 128)).
EMULATED_HEAD_DIMS = (64, 96, 128, 192, 256)
EMULATED_HEAD_DIM_PAIRS = ((192, 128),)


def check_emulated_head_dims(head_dim, head_dim_v=None):
    """_ops._check_supported's head dim checks against the emulated library (ValueError as the real one raises)."""
    if head_dim_v is not None and head_dim_v != head_dim:
        if (head_dim, head_dim_v) not in EMULATED_HEAD_DIM_PAIRS:
            raise ValueError(f"FlashCore: (head_dim, head_dim_v) = ({head_dim}, {head_dim_v}) is not supported "
                             f"(emulation; compiled pairs: {list(EMULATED_HEAD_DIM_PAIRS)})")
    elif head_dim not in EMULATED_HEAD_DIMS:
        raise ValueError(f"FlashCore: head_dim {head_dim} is not supported (emulation)")


def emulate_on_cpu(monkeypatch):
    """Run flashcore's torch ops on CPU tensors with reference() in place of the native library.

    Checks the Python wiring (validation, custom op, fake impl, autograd, torch.compile, the transformers
    adapter) without a GPU; the kernel itself is not exercised. The backward is emulated by backward_fp64 (the
    kernel's formulas in float64), written into the op's dq, dk, dv. 8-bit calls are emulated by the float64 reference
    of the dequantized inputs (precision="fp8": of the inputs quantized per (batch, KV head) by quantize_fp8, as
    the library does); the emulated library has 8-bit kernels for head dims 128 and 256, 16-bit ones for head dims
    EMULATED_HEAD_DIMS and the (head_dim, head_dim_v) pairs EMULATED_HEAD_DIM_PAIRS (v with a head dim of its own: the
    references take it as it comes). Calls with attention variants
    (window, softcap, sinks, chunk) are emulated by reference_variants in float64, their backward (window, softcap,
    sinks, chunk, and dsinks when asked for) by variant_backward_fp64, whose D reads the out the op passes (as the
    kernel does)."""
    from flashcore import _lib, _ops

    class _CompiledCaps:
        path = "<cpu emulation>"

        @staticmethod
        def compiled():
            return ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"), EMULATED_HEAD_DIMS

        @staticmethod
        def compiled_head_dim_pairs():
            return EMULATED_HEAD_DIM_PAIRS

    def check_supported(q, head_dim, head_dim_v=None):
        check_emulated_head_dims(head_dim, head_dim_v)
        return _CompiledCaps

    def check_extended_supported(lib, q, causal, out_dtype, precision):
        eight_bit = q.dtype in _ops.FP8_DTYPES or precision == _lib.PRECISION_FP8
        if eight_bit and q.shape[3] not in (128, 256):
            raise ValueError(f"FlashCore: head_dim {q.shape[3]} has no 8-bit kernel (emulation)")

    def launch(lib, q, k, v, out, lse, causal, softmax_scale, descales=(None, None, None),
               precision=_lib.PRECISION_NATIVE, v_transposed=False, variants=None):
        if v_transposed:  # the library's own layout: only the GPU tests run it
            raise NotImplementedError("FlashCore: v_transposed=True is not emulated on the CPU")
        if variants is not None:  # window, softcap, sinks, chunk: the float64 reference with them
            o, l = reference_of(q, k, v, causal, softmax_scale, variants)
            l = l.float()
        elif q.dtype in _ops.FP8_DTYPES or precision == _lib.PRECISION_FP8:
            if precision == _lib.PRECISION_FP8:
                heads_kv = k.shape[2]
                (q, qd), (k, kd), (v, vd) = (_ops.quantize_fp8(t, num_heads_kv=heads_kv) for t in (q, k, v))
                descales = (qd, kd, vd)
            q, k, v = (dequantize(t, d) for t, d in zip((q, k, v), descales))
            o, l = reference_fp64(q, k, v, causal, softmax_scale or None)
            l = l.float()
        else:
            o, l = reference(q, k, v, causal, softmax_scale or None)
        out.copy_(o.to(out.dtype))
        if lse.numel():
            lse.copy_(l)

    def launch_backward(lib, dout, q, k, v, out, lse, dq, dk, dv, causal, softmax_scale, deterministic, variants=None,
                        dsinks=None):
        if variants is None:
            assert dsinks is None, "dsinks without sinks"
            grads = backward_fp64(q, k, v, dout, causal, softmax_scale)
        else:
            grads = variant_backward_fp64(q, k, v, dout, causal, softmax_scale,
                                          (variants.window_size_left, variants.window_size_right), variants.softcap,
                                          variants.sinks, variants.attention_chunk, out=out)
            if dsinks is not None:
                dsinks.copy_(grads[3])
        for got, want in zip((dq, dk, dv), grads[:3]):
            got.copy_(want)

    monkeypatch.setattr(_ops, "_check_device", lambda q, k, v: None)
    monkeypatch.setattr(_ops, "_check_supported", check_supported)
    monkeypatch.setattr(_ops, "_launch_backward", launch_backward)
    monkeypatch.setattr(_ops, "_check_extended_supported", check_extended_supported)
    monkeypatch.setattr(_ops, "_launch", launch)
