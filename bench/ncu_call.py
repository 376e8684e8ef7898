"""One attention call of one system between cudaProfilerStart/Stop, for Nsight Compute with
--profile-from-start off. Everything else (inputs, warm-up) runs outside the profiled range.

  ncu --profile-from-start off ... python3 bench/ncu_call.py SYSTEM B,Hq,Hkv,Sq,Sk,D [--causal]

--paged P (flashcore): the same K and V in a paged cache of page P, pages shuffled.
--config NAME (flashcore): that kernel config (flashcore list-configs) through the C ABI's kernel_config.
--fp8 (flashcore, fa3): e4m3 inputs quantized per (batch, KV head) (flashcore.quantize_fp8) with their descales;
flashcore reads V transposed once before the profiled range (fp8_transpose_v), so the range holds its attention kernel
alone, as FA3's does; with --v-as-stored it reads V as stored, transposed by its own route (in the kernel, or a pass
before it: FLASHCORE_FP8_V_TRANSPOSE=kernel|pass forces one).
SYSTEM: flashcore, cudnn, fa2 (PyTorch SDPA's FlashAttention-2), fa3 (flash_attn_interface on PYTHONPATH), read (a plain read of K and V: torch sum,
the streaming reference for decode shapes). Tensors are (B, S, H, D) bf16, the layout of bench/serving.py.
"""
import argparse
import os
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ap = argparse.ArgumentParser()
ap.add_argument("system", choices=["flashcore", "cudnn", "fa2", "fa3", "read"])
ap.add_argument("shape", help="B,Hq,Hkv,Sq,Sk,D")
ap.add_argument("--causal", action="store_true")
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--paged", type=int, default=0, help="flashcore: a paged cache of this page size (decode shapes), "
                "pages in a random order, through attention_with_kvcache")
ap.add_argument("--config", default=None, help="flashcore: a named kernel config instead of the library's choice")
ap.add_argument("--fp8", action="store_true", help="flashcore / fa3: e4m3 inputs with descales (see above)")
ap.add_argument("--v-as-stored", action="store_true",
                help="flashcore --fp8: V as stored (FA3's call), not transposed beforehand")
a = ap.parse_args()
B, Hq, Hkv, Sq, Sk, D = map(int, a.shape.split(","))
q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=torch.bfloat16)
k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
if a.fp8:
    import flashcore
    if a.system not in ("flashcore", "fa3"):
        ap.error("--fp8 is for flashcore and fa3")
    (q8, qd), (k8, kd), (v8, vd) = (flashcore.quantize_fp8(t, num_heads_kv=Hkv) for t in (q, k, v))
    if a.system == "flashcore" and a.v_as_stored:
        fn = lambda: flashcore.attention(q8, k8, v8, causal=a.causal, q_descale=qd, k_descale=kd, v_descale=vd)
    elif a.system == "flashcore":
        vt8 = flashcore.fp8_transpose_v(v8)
        fn = lambda: flashcore.attention(q8, k8, vt8, causal=a.causal, q_descale=qd, k_descale=kd, v_descale=vd,
                                         v_transposed=True)
    else:
        from flash_attn_interface import flash_attn_func
        fn = lambda: flash_attn_func(q8, k8, v8, causal=a.causal, q_descale=qd, k_descale=kd, v_descale=vd)
elif a.system == "flashcore" and a.paged:
    import flashcore
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from serving import paged_cache
    table, kp, vp = paged_cache(k, v, a.paged)
    lens = torch.full((B,), Sk, device="cuda", dtype=torch.int32)
    fn = lambda: flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table, causal=a.causal)
elif a.system == "flashcore" and a.config:
    import ctypes
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from flashcore_ctypes import FlashCoreLib
    fc = FlashCoreLib(os.environ.get("FLASHCORE_LIBRARY"))
    cname = ctypes.create_string_buffer(a.config.encode())
    o = torch.empty_like(q)
    prm = fc.params_for(q, k, v, o, causal=a.causal, bhsd=False, kernel_config=ctypes.addressof(cname))
    fn = lambda: fc.forward(prm, torch.cuda.current_stream().cuda_stream)
elif a.system == "flashcore":
    import flashcore
    fn = lambda: flashcore.attention(q, k, v, causal=a.causal)
elif a.system in ("cudnn", "fa2"):
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    backend = SDPBackend.CUDNN_ATTENTION if a.system == "cudnn" else SDPBackend.FLASH_ATTENTION
    def fn():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=a.causal, enable_gqa=Hq != Hkv)
elif a.system == "fa3":
    from flash_attn_interface import flash_attn_func
    fn = lambda: flash_attn_func(q, k, v, causal=a.causal)
else:
    fn = lambda: (k.sum(dtype=torch.float32), v.sum(dtype=torch.float32))
for _ in range(a.warmup):
    fn()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
fn()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done", a.system, a.shape)
