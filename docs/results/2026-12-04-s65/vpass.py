# Throwaway measurement: the 8-bit V transpose pass alone, the e4m3 call (auto route), the e4m3 call with V
# transposed once; CUDA graphs of 10 calls over rotating buffer sets, interleaved replays, medians (us).
import os, statistics, sys, torch, flashcore
torch.manual_seed(0)
N = 10
def graph(fn):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(2): fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(N): fn(i)
    return g
shapes = [(64, 8192, 0), (128, 1024, 0), (128, 2048, 0), (128, 2048, 1), (128, 4096, 0), (128, 4096, 1), (128, 8192, 0),
          (128, 16384, 0), (256, 1024, 0), (256, 2048, 0), (256, 2048, 1), (256, 4096, 0), (256, 4096, 1),
          (256, 8192, 0), (256, 8192, 1), (256, 16384, 0)]
print("| D | causal | S | pass us | pass GB/s | e4m3 us | vt us | e4m3 - vt us | e4m3 - vt - pass | route=kernel us | route=pass us |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for D, S, causal in shapes:
    B, H = 16384 // S, 2048 // D
    sets = []
    nsets = 3
    for _ in range(nsets):
        qkv = [flashcore.quantize_fp8(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
        (q8, qd), (k8, kd), (v8, vd) = qkv
        sets.append((q8, k8, v8, qd, kd, vd, flashcore.fp8_transpose_v(v8)))
    fns = {
        "pass": lambda i: flashcore.fp8_transpose_v(sets[i % nsets][2]),
        "e4m3": lambda i: flashcore.attention(*sets[i % nsets][:3], causal=bool(causal), q_descale=sets[i % nsets][3],
                                              k_descale=sets[i % nsets][4], v_descale=sets[i % nsets][5]),
        "vt": lambda i: flashcore.attention(sets[i % nsets][0], sets[i % nsets][1], sets[i % nsets][6],
                                            causal=bool(causal), q_descale=sets[i % nsets][3],
                                            k_descale=sets[i % nsets][4], v_descale=sets[i % nsets][5],
                                            v_transposed=True),
    }
    def routed(route):
        def fn(i):
            os.environ["FLASHCORE_FP8_V_TRANSPOSE"] = route
            try:
                fns["e4m3"](i)
            finally:
                del os.environ["FLASHCORE_FP8_V_TRANSPOSE"]
        return fn
    if D >= 128:
        fns["kern"] = routed("kernel")
        fns["pr"] = routed("pass")
    gs = {k: graph(f) for k, f in fns.items()}
    t = {k: [] for k in gs}
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    names = list(gs)
    for r in range(21):
        for k in (names if r % 2 == 0 else names[::-1]):
            a.record(); gs[k].replay(); b.record(); b.synchronize()
            t[k].append(a.elapsed_time(b) * 1000 / N)
    m = {k: statistics.median(v[1:]) for k, v in t.items()}
    vbytes = B * S * H * D
    print(f"| {D} | {causal} | {S} | {m['pass']:.1f} | {2 * vbytes / m['pass'] / 1e3:.0f} | {m['e4m3']:.1f} | "
          f"{m['vt']:.1f} | {m['e4m3'] - m['vt']:.1f} | {m['e4m3'] - m['vt'] - m['pass']:.1f} | "
          f"{m.get('kern', float('nan')):.1f} | {m.get('pr', float('nan')):.1f} |", flush=True)
    del sets, gs, fns
    torch.cuda.empty_cache()
