"""FlashCore from PyTorch: flashcore.attention (FlashAttention's (B, S, H, D) layout, GQA) checked against
torch.nn.functional.scaled_dot_product_attention.

    pip install ".[torch]"          # or: pip install flashcore_attn-*.whl torch
    python examples/torch_attention.py

Without a CUDA GPU, or on one FlashCore does not support (older than sm_80), it says so and exits 0.
"""

import sys

try:
    import torch
    import torch.nn.functional as F
except ModuleNotFoundError:
    print("torch_attention: PyTorch is not installed (pip install torch)")
    sys.exit(1)

import flashcore


def main() -> int:
    print(f"torch_attention: flashcore {flashcore.__version__}, torch {torch.__version__}")
    if not torch.cuda.is_available():
        print("torch_attention: no CUDA GPU visible to PyTorch: nothing to run")
        return 0
    caps = flashcore.capabilities()  # RuntimeError naming every place tried if libflashcore.so is missing
    if not caps.device_supported:
        print(f"torch_attention: {torch.cuda.get_device_name()} is not a GPU FlashCore supports: nothing to run")
        return 0

    head_dim = 128 if 128 in caps.head_dims else caps.head_dims[0]
    dtype = torch.bfloat16 if "bfloat16" in caps.dtypes else torch.float16
    batch, seqlen, heads_q, heads_kv = 2, 1024, 16, 4
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, seqlen, heads_q, head_dim, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(batch, seqlen, heads_kv, head_dim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(batch, seqlen, heads_kv, head_dim, device="cuda", dtype=dtype, generator=gen)

    out = flashcore.attention(q, k, v, causal=True)  # (B, S, Hq, D)

    # Reference: SDPA on (B, H, S, D) with the KV heads repeated (seqlen_q == seqlen_k: both causal
    # conventions agree).
    group = heads_q // heads_kv
    ref = F.scaled_dot_product_attention(
        q.transpose(1, 2).float(),
        k.repeat_interleave(group, dim=2).transpose(1, 2).float(),
        v.repeat_interleave(group, dim=2).transpose(1, 2).float(),
        is_causal=True,
    ).transpose(1, 2)
    err = (out.float() - ref).abs().max().item()
    print(f"torch_attention: causal {dtype} GQA {heads_q}/{heads_kv}, head dim {head_dim}: max |out - sdpa| = {err:.4f}")
    ok = err < 2e-2
    print("torch_attention:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
