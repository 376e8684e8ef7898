"""Reference attention in fp32 (torch SDPA's math backend on upcast inputs) and a CPU emulation of the op.

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
    """(out (B, Sq, Hq, D), lse (B, Hq, Sq) fp32) for (B, S, H, D) inputs; rows that see no key give 0 / -inf.

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


def emulate_on_cpu(monkeypatch):
    """Run flashcore's torch ops on CPU tensors with reference() in place of the native library.

    Checks the Python wiring (validation, custom op, fake impl, autograd, torch.compile, the transformers
    adapter) without a GPU; the kernel itself is not exercised."""
    from flashcore import _ops

    class _CompiledCaps:
        path = "<cpu emulation>"

        @staticmethod
        def compiled():
            return ("float16", "bfloat16"), (64, 128, 256)

    def check_supported(q, head_dim):
        if head_dim not in _CompiledCaps.compiled()[1]:
            raise ValueError(f"FlashCore: head_dim {head_dim} is not supported (emulation)")
        return _CompiledCaps

    def launch(lib, q, k, v, out, lse, causal, softmax_scale):
        o, l = reference(q, k, v, causal, softmax_scale or None)
        out.copy_(o.to(out.dtype))
        if lse.numel():
            lse.copy_(l)

    monkeypatch.setattr(_ops, "_check_device", lambda q, k, v: None)
    monkeypatch.setattr(_ops, "_check_supported", check_supported)
    monkeypatch.setattr(_ops, "_launch", launch)
