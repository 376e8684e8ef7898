# Paged vs dense decode under ncu (untracked): which kernels run, and how long each takes.
import torch, sys
sys.path.insert(0, "bench"); sys.path.insert(0, "python")
import flashcore
torch.manual_seed(0)
D, Hq, Hkv, B, Sk = 128, 32, 8, 1, 8192
q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16)
kc = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=torch.bfloat16); vc = torch.randn_like(kc)
lens = torch.full((B,), Sk, device="cuda", dtype=torch.int32)
variants = {"plain": lambda: flashcore.attention(q, kc, vc),
            "cache_lens": lambda: flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)}
for page in (64, 256):
    nblk = Sk // page
    table = torch.arange(B * nblk, device="cuda", dtype=torch.int32).reshape(B, nblk)
    kp = kc.reshape(B * nblk, page, Hkv, D); vp = vc.reshape(B * nblk, page, Hkv, D)
    variants[f"paged{page}"] = (lambda kp=kp, vp=vp, table=table:
        flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table, causal=True))
for name, f in variants.items():
    for _ in range(5): f()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(name)
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(3): f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    torch.cuda.nvtx.range_pop()
    print("variant", name, flush=True)
