#!/usr/bin/env python3
"""Serving shapes measured side by side in one process, on the same tensors: FlashCore (torch ops), FlashAttention-3
(a build with flash_attn_with_kvcache / flash_attn_varlen_func on PYTHONPATH, e.g. ../shared/fa3/serving) and cuDNN
through PyTorch SDPA.

    FLASHCORE_LIBRARY=build/lib/libflashcore.so PYTHONPATH=python:.fa3s python3 bench/serving.py --out serving

Tables (--tables, comma-separated; default both):

  decode  one new token against a KV cache: FlashCore dense (split-KV and GQA packing as the library's dispatch
          picks them), FlashCore dense without a workspace (no split), FA3 dense, FlashCore paged (page 64,
          flashcore.attention_with_kvcache with block_table), FA3 paged (page 64, page_table), cuDNN dense. The
          figure is GB/s of K and V read (the cache bytes the batch attends to / kernel time in a CUDA graph), with
          the fraction of the HBM peak (H200 4.8 TB/s, H100 3.35 TB/s). Each FlashCore output (dense and paged) is
          checked against SDPA in float32 before it is timed.
  varlen  variable-length prefill as ../shared/fa3/anchor_serving.py measures it (so the FA3 numbers compare with
          its anchors): batch 32, lengths drawn uniformly from [64, 4096) by torch.randint after
          torch.manual_seed(0), one draw per (head dim, causal) case in the order d64 full, d64 causal, d128 full,
          d128 causal; bf16; 2048 / D heads for q, k and v (32 at d64, 16 at d128; --varlen-heads HQ,HKV for GQA);
          FlashCore varlen_attention against FA3 flash_attn_varlen_func. TFLOPS counts sum over sequences of
          4 * H * L^2 * D, halved when causal (anchor_serving.py's formula); CUDA-graph median. Both outputs are
          checked against SDPA in float32, per sequence.

Writes OUT/serving.json and OUT/serving.md (one markdown table per selected table).

Importable (bench/report.py --serving runs the same tables after its grid): run_decode / iter_decode and
run_varlen / iter_varlen give the rows (dicts, as in serving.json), decode_markdown / varlen_markdown the tables,
decode_missing / varlen_missing why a column has no figure, peak_gbps the HBM peak of a device name. Importing
needs PyTorch and the flashcore package (python/ on sys.path); the library is loaded on the first measurement.
"""
import argparse
import ctypes
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcore

# Why an FA3 entry point is missing (None when it imported): the tables name the reason.
FA3_KVCACHE_UNAVAILABLE = FA3_VARLEN_UNAVAILABLE = None
try:
    from flash_attn_interface import flash_attn_with_kvcache
except Exception as _e:  # no FA3 serving build on the path
    flash_attn_with_kvcache = None
    FA3_KVCACHE_UNAVAILABLE = f"{type(_e).__name__}: {_e}".replace("\n", " ")[:200]
try:
    from flash_attn_interface import flash_attn_varlen_func
except Exception as _e:
    flash_attn_varlen_func = None
    FA3_VARLEN_UNAVAILABLE = f"{type(_e).__name__}: {_e}".replace("\n", " ")[:200]

DECODE_ROWS = [(1, 8192), (8, 8192), (32, 4096), (64, 16384), (128, 2048), (16, 65536)]
PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0}
TABLES = ("decode", "varlen")
PAGE = 64  # page size of the paged columns (FA3's and FlashCore's)
# Variable-length prefill, as ../shared/fa3/anchor_serving.py: (head dim, causal) in its order, batch 32, lengths
# in [64, 4096) from the CPU generator seeded 0.
VARLEN_CASES = [(64, False), (64, True), (128, False), (128, True)]
VARLEN_BATCH, VARLEN_MIN, VARLEN_MAX, VARLEN_SEED = 32, 64, 4096, 0


def graph_time_us(fn, reps=20, iters=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / reps)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="serving_out")
    ap.add_argument("--tables", default=",".join(TABLES), help=f"comma-separated tables to measure: {', '.join(TABLES)}")
    ap.add_argument("--head-dim", type=int, default=128, help="decode table: head dim")
    ap.add_argument("--heads", default="32,8", help="decode table: query heads, KV heads")
    ap.add_argument("--decode-rows", default="", help="decode table: comma-separated BATCHxCACHE_LEN rows instead of "
                    "the issue's six (e.g. 33x4096,132x2048)")
    ap.add_argument("--configs", default="", help="decode and varlen tables: comma-separated kernel configs to time "
                    "as well (explicitly named; in the varlen table, those the library lists for the case's head dim "
                    "and mask)")
    ap.add_argument("--varlen-heads", default="anchor",
                    help="varlen table: 'anchor' (2048 / D heads for q, k and v, as anchor_serving.py) or HQ,HKV")
    args = ap.parse_args()
    args.configs = [c for c in args.configs.split(",") if c]
    args.tables = [t for t in args.tables.split(",") if t]
    unknown = [t for t in args.tables if t not in TABLES]
    if unknown or not args.tables:
        ap.error(f"--tables: unknown {unknown} (choose from {', '.join(TABLES)})")
    os.makedirs(args.out, exist_ok=True)
    name = torch.cuda.get_device_name()
    peak = peak_gbps(name)
    result = {"device": name, "peak_GBps": peak}
    sections = []
    if "decode" in args.tables:
        heads = tuple(int(x) for x in args.heads.split(","))
        shapes = [tuple(int(x) for x in r.split("x")) for r in args.decode_rows.split(",") if r] or DECODE_ROWS
        rows = run_decode(args.head_dim, heads, args.configs, shapes=shapes)
        result["decode"] = rows
        sections.append(decode_markdown(rows, name, peak, args.head_dim, heads))
    if "varlen" in args.tables:
        rows = run_varlen(args.varlen_heads, configs=args.configs)
        result["varlen"] = rows
        sections.append(varlen_markdown(rows, name, args.varlen_heads))
    text = "\n\n".join(sections)
    print(text)
    with open(os.path.join(args.out, "serving.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "serving.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)


def peak_gbps(device_name):
    """The HBM peak of the device (GB/s) by its name; NaN for a GPU not in PEAK_GBPS."""
    return next((v for k, v in PEAK_GBPS.items() if k in device_name), float("nan"))


def _print_flushed(line):
    print(line, flush=True)


def _row_line(table, row):
    return f"{table} " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


def run_decode(head_dim=128, heads=(32, 8), configs=(), shapes=DECODE_ROWS, fa3=True, cudnn=True,
               keep_going=False, log=None):
    """The decode table's rows (list of dicts, one per (batch, cache length) of `shapes`); see iter_decode."""
    return list(iter_decode(head_dim, heads, configs, shapes, fa3, cudnn, keep_going, log))



def _row_or_error(build, keep_going, **identity):
    """build()'s row; with keep_going, an exception becomes a row of `identity` and the error (GPU memory freed)."""
    try:
        return build()
    except Exception as e:
        if not keep_going:
            raise
        try:
            torch.cuda.empty_cache()
        except Exception:
            pass
        return {**identity, "error": repr(e)[:160]}

def iter_decode(head_dim=128, heads=(32, 8), configs=(), shapes=DECODE_ROWS, fa3=True, cudnn=True,
                keep_going=False, log=None):
    """Yields the decode rows one by one (a caller keeps the rows measured before an interruption).

    bf16, `heads` = (query heads, KV heads), one new token per sequence; the global torch seed is set to 0 once,
    then each row draws its tensors. fa3 / cudnn False leave those columns out (FA3 is also left out when
    flash_attn_with_kvcache does not import: FA3_KVCACHE_UNAVAILABLE says why). `configs`: kernel configs to time
    as well (keys 'cfg NAME_us' / '_GBps'). keep_going=False (the CLI) lets an exception end the table; True
    records it in the row instead (FA3 failures as fa3_dense_err / fa3_paged64_err, a failure of the whole row
    as error). `log(line)` gets one 'decode key=value ...' line per row (default: printed to stdout, flushed).
    """
    log = log or _print_flushed
    hq, hkv = heads
    torch.manual_seed(0)
    for B, Sk in shapes:
        row = _row_or_error(lambda: decode_row(B, Sk, head_dim, hq, hkv, configs, fa3, cudnn, keep_going), keep_going,
                            B=B, Sk=Sk, Hq=hq, Hkv=hkv, D=head_dim)
        log(_row_line("decode", row))
        yield row


def decode_inputs(B, Sk, hq=32, hkv=8, head_dim=128, dtype=torch.bfloat16):
    """A decode call's tensors: q (B, 1, hq, D), the dense caches k, v (B, Sk, hkv, D) (drawn in that order from the
    global torch generator) and cache_seqlens (B,) int32, every sequence Sk keys long."""
    q = torch.randn(B, 1, hq, head_dim, device="cuda", dtype=dtype)
    kc = torch.randn(B, Sk, hkv, head_dim, device="cuda", dtype=dtype)
    vc = torch.randn_like(kc)
    lens = torch.full((B,), Sk, device="cuda", dtype=torch.int32)
    return q, kc, vc, lens


def paged_cache(kc, vc, page=PAGE, shuffled=True):
    """The dense caches kc, vc (B, Sk, Hkv, D) copied into pages of `page` keys, in a shuffled order over the whole
    pool (shuffled=False: page i of sequence b at b * Sk / page + i): returns the block table (B, Sk / page) int32 and
    the paged K and V (B * Sk / page, page, Hkv, D)."""
    B, Sk, Hkv, D = kc.shape
    nblk = Sk // page
    order = (torch.randperm(B * nblk, device=kc.device, dtype=torch.int32) if shuffled
             else torch.arange(B * nblk, device=kc.device, dtype=torch.int32))
    table = order.reshape(B, nblk)
    kp = torch.empty(B * nblk, page, Hkv, D, device=kc.device, dtype=kc.dtype)
    vp = torch.empty_like(kp)
    kp[table.flatten().long()] = kc.reshape(B * nblk, page, Hkv, D)
    vp[table.flatten().long()] = vc.reshape(B * nblk, page, Hkv, D)
    return table, kp, vp


def decode_row(B, Sk, head_dim=128, hq=32, hkv=8, configs=(), fa3=True, cudnn=True, keep_going=False):
    """One decode row: batch B, cache length Sk (a multiple of PAGE); see iter_decode."""
    D, Hq, Hkv = head_dim, hq, hkv
    q, kc, vc, lens = decode_inputs(B, Sk, Hq, Hkv, D)
    kv_bytes = 2 * B * Sk * Hkv * D * kc.element_size()
    row = {"B": B, "Sk": Sk, "Hq": Hq, "Hkv": Hkv, "D": D, "kv_MB": kv_bytes / 1e6}
    qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    ref = F.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), enable_gqa=True).transpose(1, 2)
    out = flashcore.attention(q, kc, vc)
    row["flashcore_max_err"] = (out.float() - ref).abs().max().item()
    row["flashcore_config"] = _selected_config(q, kc, vc)
    row["flashcore_us"] = graph_time_us(lambda: flashcore.attention(q, kc, vc))
    # The same call without a workspace: the whole-tile kernel that dispatch runs when no split is possible.
    dense_out = torch.empty_like(q)
    params = _params(q, kc, vc, dense_out)
    lib = flashcore._lib.load()
    row["flashcore_nosplit_config"] = lib.selected_config(params)
    lib.forward(params, torch.cuda.current_stream().cuda_stream)
    row["flashcore_nosplit_max_err"] = (dense_out.float() - ref).abs().max().item()
    row["flashcore_nosplit_us"] = graph_time_us(
        lambda: lib.forward(params, torch.cuda.current_stream().cuda_stream))
    for config in configs:  # named kernel configs, each with the workspace it asks for
        cp = _params(q, kc, vc, dense_out)
        keep = _name_config(lib, cp, config)  # noqa: F841 (alive until the next config)
        dense_out.fill_(float("nan"))
        lib.forward(cp, torch.cuda.current_stream().cuda_stream)
        row[f"cfg {config} max_err"] = (dense_out.float() - ref).abs().max().item()
        row[f"cfg {config}_us"] = graph_time_us(lambda: lib.forward(cp, torch.cuda.current_stream().cuda_stream))
    # Paged caches (page 64): the same K/V, pages shuffled through a block table; FlashCore's and FA3's columns
    # read the same pages.
    table, kp, vp = paged_cache(kc, vc)

    def fc_paged():
        return flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table, causal=True)
    try:
        row["flashcore_paged64_max_err"] = (fc_paged().float() - ref).abs().max().item()
        row["flashcore_paged64_us"] = graph_time_us(fc_paged)
    except Exception as e:  # a library without the paged path
        row["flashcore_paged64_err"] = repr(e)[:160]
    if fa3 and flash_attn_with_kvcache is not None:
        try:
            row["fa3_dense_us"] = graph_time_us(lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                                                causal=True))
        except Exception as e:
            if not keep_going:
                raise
            row["fa3_dense_err"] = repr(e)[:160]
        try:
            row["fa3_paged64_us"] = graph_time_us(lambda: flash_attn_with_kvcache(
                q, kp, vp, cache_seqlens=lens, page_table=table, causal=True))
        except Exception as e:
            if not keep_going:
                raise
            row["fa3_paged64_err"] = repr(e)[:160]
    del kp, vp

    def cud():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    if cudnn:
        try:
            row["cudnn_dense_us"] = graph_time_us(cud)
        except Exception as e:  # cuDNN missing or refusing the shape
            row["cudnn_err"] = repr(e)[:120]
    for k in [k for k in row if k.endswith("_us")]:
        row[k.replace("_us", "_GBps")] = kv_bytes / (row[k] * 1e-6) / 1e9
    del q, kc, vc, qt, kt, vt, ref, out, dense_out
    torch.cuda.empty_cache()
    return row


DECODE_SYSTEMS = ("flashcore", "flashcore_nosplit", "fa3_dense", "flashcore_paged64", "fa3_paged64", "cudnn_dense")


def decode_missing(rows, fa3=True, cudnn=True):
    """{system: why it has no figure in any row} for the systems of DECODE_SYSTEMS that measured nothing (fa3 /
    cudnn: as passed to run_decode)."""
    err_keys = {"flashcore_paged64": "flashcore_paged64_err", "fa3_dense": "fa3_dense_err",
                "fa3_paged64": "fa3_paged64_err", "cudnn_dense": "cudnn_err"}
    missing = {}
    for s in DECODE_SYSTEMS:
        if any(f"{s}_GBps" in r for r in rows):
            continue
        if s.startswith("fa3") and not fa3 or s == "cudnn_dense" and not cudnn:
            why = "not selected"
        elif s.startswith("fa3") and flash_attn_with_kvcache is None:
            why = f"flash_attn_with_kvcache not importable: {FA3_KVCACHE_UNAVAILABLE}"
        else:
            why = next((r[k] for r in rows for k in (err_keys.get(s), "error") if k and k in r), "not measured")
        missing[s] = why
    return missing


def decode_markdown(rows, name, peak, head_dim, heads, missing=None, labels=None):
    """The decode table (markdown). missing: {system: reason} (decode_missing) to show those systems as columns
    of '-' and list the reasons under the table; labels: {system: column header} (default the system keys)."""
    Hq, Hkv = heads
    missing = missing or {}
    labels = labels or {}
    systems = [s for s in DECODE_SYSTEMS if s in missing or any(f"{s}_GBps" in r for r in rows)]
    paged_ratio = (any("flashcore_paged64_GBps" in r for r in rows) and any("fa3_paged64_GBps" in r for r in rows))
    lines = [f"Decode, {name}, bf16, d{head_dim}, {Hq} query heads / {Hkv} KV heads, one new token; GB/s of K "
             f"and V read (fraction of the {peak:.0f} GB/s HBM peak); CUDA-graph median; paged columns: page "
             f"{PAGE}, pages shuffled", "",
             "| batch x cache | " + " | ".join(labels.get(s, s) for s in systems) + " | FlashCore / best other |"
             + (" FlashCore paged / FA3 paged |" if paged_ratio else "") + " FlashCore config |",
             "|---|" + "---|" * (len(systems) + 2 + paged_ratio)]

    def cell(r, s):
        return f"{r[f'{s}_GBps']:.0f} ({r[f'{s}_GBps'] / peak:.0%})" if f"{s}_GBps" in r else "-"

    for r in rows:
        others = [r[f"{s}_GBps"] for s in systems if not s.startswith("flashcore") and f"{s}_GBps" in r]
        best = max(others) if others else float("nan")
        line = (f"| {r['B']} x {r['Sk'] // 1024}k | " + " | ".join(cell(r, s) for s in systems)
                + f" | {r.get('flashcore_GBps', float('nan')) / best:.2f} |")
        if paged_ratio:
            ratio = r.get("flashcore_paged64_GBps", float("nan")) / r.get("fa3_paged64_GBps", float("nan"))
            line += f" {ratio:.2f} |"
        lines.append(line + f" {str(r.get('flashcore_config', r.get('error', '-'))).replace('|', '/')} |")
    if missing:
        lines += [""] + [f"- {labels.get(s, s)}: missing ({why})" for s, why in missing.items()]
    return "\n".join(lines)


def varlen_lengths():
    """The four length lists of anchor_serving.py's varlen anchor, in VARLEN_CASES order (drawn in that order from
    the CPU generator seeded VARLEN_SEED, whatever subset is measured)."""
    gen = torch.Generator().manual_seed(VARLEN_SEED)
    return [torch.randint(VARLEN_MIN, VARLEN_MAX, (VARLEN_BATCH,), generator=gen).tolist() for _ in VARLEN_CASES]


def _varlen_heads(varlen_heads, D):
    if varlen_heads == "anchor":
        return 2048 // D, 2048 // D
    Hq, Hkv = (int(x) for x in varlen_heads.split(","))
    return Hq, Hkv


def _varlen_max_err(out, q, k, v, lens, causal):
    """Largest |out - SDPA in float32| over the sequences of a packed batch (out: (total, Hq, D))."""
    worst, start = 0.0, 0
    for L in lens:
        qs, ks, vs = (t[start:start + L].transpose(0, 1).float() for t in (q, k, v))  # (H, L, D)
        ref = F.scaled_dot_product_attention(qs[None], ks[None], vs[None], is_causal=causal,
                                             enable_gqa=True)[0].transpose(0, 1)
        worst = max(worst, (out[start:start + L].float() - ref).abs().max().item())
        start += L
    return worst


def run_varlen(varlen_heads="anchor", fa3=True, keep_going=False, log=None, configs=()):
    """The varlen table's rows (list of dicts, one per VARLEN_CASES entry); see iter_varlen."""
    return list(iter_varlen(varlen_heads, fa3, keep_going, log, configs))


def iter_varlen(varlen_heads="anchor", fa3=True, keep_going=False, log=None, configs=()):
    """Yields the varlen rows one by one, in VARLEN_CASES order, with anchor_serving.py's length lists.

    varlen_heads: 'anchor' (2048 / D heads for q, k and v) or 'HQ,HKV'. fa3=False leaves FA3 out (so does a
    missing flash_attn_varlen_func: FA3_VARLEN_UNAVAILABLE says why). A FlashCore failure is recorded as
    flashcore_err; keep_going=False (the CLI) lets any other exception end the table, True records it in the row
    (fa3_err, or error for the whole case). `log(line)` gets one 'varlen key=value ...' line per row (default:
    printed to stdout, flushed). `configs`: kernel configs to time as well, by name, where the library lists them
    for the case's head dim and mask (columns "cfg NAME_us"; a config the library refuses for packed batches, such
    as a dynamic-schedule row, records "cfg NAME_err").
    """
    log = log or _print_flushed
    for (D, causal), lens in zip(VARLEN_CASES, varlen_lengths()):
        Hq, Hkv = _varlen_heads(varlen_heads, D)
        row = _row_or_error(lambda: varlen_row(D, causal, lens, Hq, Hkv, fa3, keep_going, configs), keep_going, D=D,
                            causal=causal, batch=len(lens), tokens=sum(lens), max_len=max(lens), Hq=Hq, Hkv=Hkv)
        log(_row_line("varlen", row))
        yield row


def varlen_row(D, causal, lens, Hq, Hkv, fa3=True, keep_going=False, configs=()):
    """One varlen row: the packed batch of sequence lengths `lens`, bf16; see iter_varlen."""
    dt = torch.bfloat16
    total = sum(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
    q = torch.randn(total, Hq, D, device="cuda", dtype=dt)
    k = torch.randn(total, Hkv, D, device="cuda", dtype=dt)
    v = torch.randn_like(k)
    max_len = max(lens)
    flops = sum(4 * Hq * L * L * D for L in lens) / (2 if causal else 1)
    row = {"D": D, "causal": causal, "batch": len(lens), "tokens": total, "max_len": max_len, "Hq": Hq,
           "Hkv": Hkv, "GFLOP": flops / 1e9}

    def fc():
        return flashcore.varlen_attention(q, k, v, cu, cu, max_len, max_len, causal=causal)
    try:
        row["flashcore_max_err"] = _varlen_max_err(fc(), q, k, v, lens, causal)
        row["flashcore_config"] = _varlen_selected_config(q, k, v, cu, max_len, causal)
        row["flashcore_us"] = graph_time_us(fc)
    except Exception as e:  # a library without the varlen path
        row["flashcore_err"] = repr(e)[:160]
    for config in _listed_configs(configs, D, causal):
        try:
            row[f"cfg {config} max_err"], row[f"cfg {config}_us"] = _varlen_config_time(q, k, v, cu, max_len, causal,
                                                                                        config, lens)
        except Exception as e:
            row[f"cfg {config}_err"] = repr(e)[:160]
    if fa3 and flash_attn_varlen_func is not None:
        def fa3_call():
            return flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=causal)
        try:
            row["fa3_max_err"] = _varlen_max_err(fa3_call(), q, k, v, lens, causal)
            row["fa3_us"] = graph_time_us(fa3_call)
        except Exception as e:
            if not keep_going:
                raise
            row["fa3_err"] = repr(e)[:160]
    for key in [key for key in row if key.endswith("_us")]:
        row[key.replace("_us", "_tflops")] = flops / (row[key] * 1e-6) / 1e12
    del q, k, v, cu
    torch.cuda.empty_cache()
    return row


def varlen_missing(rows, fa3=True):
    """{"flashcore" / "fa3": why it has no figure in any row}, for those that measured nothing (fa3: as passed to
    run_varlen)."""
    missing = {}
    if not any("flashcore_tflops" in r for r in rows):
        missing["flashcore"] = next((r[k] for r in rows for k in ("flashcore_err", "error") if k in r),
                                    "not measured")
    if not any("fa3_tflops" in r for r in rows):
        if not fa3:
            missing["fa3"] = "not selected"
        elif flash_attn_varlen_func is None:
            missing["fa3"] = f"flash_attn_varlen_func not importable: {FA3_VARLEN_UNAVAILABLE}"
        else:
            missing["fa3"] = next((r[k] for r in rows for k in ("fa3_err", "error") if k in r), "not measured")
    return missing


def varlen_markdown(rows, name, varlen_heads="anchor", missing=None, errors_in="serving.json"):
    """The varlen table (markdown). missing: {"flashcore" / "fa3": reason} (varlen_missing), listed under the
    table; errors_in: the file a failed FlashCore case points to."""
    heads = ("2048 / D heads for q, k and v (MHA)" if varlen_heads == "anchor"
             else f"{varlen_heads.replace(',', ' query heads / ')} KV heads")
    lines = [f"Variable-length prefill, {name}, bf16, batch {VARLEN_BATCH}, lengths uniform in [{VARLEN_MIN}, "
             f"{VARLEN_MAX}) (seed {VARLEN_SEED}, as shared/fa3/anchor_serving.py), {heads}; TFLOPS (4 H L^2 D per "
             f"sequence, halved for causal); CUDA-graph median", "",
             "| head dim | mask | heads | tokens | FlashCore | FA3 | FlashCore / FA3 | max err FlashCore / FA3 | "
             "FlashCore config |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fc, fa = r.get("flashcore_tflops"), r.get("fa3_tflops")
        ratio = f"{fc / fa:.2f}" if fc and fa else "-"
        err_fc = (f"{r['flashcore_max_err']:.2g}" if "flashcore_max_err" in r
                  else f"failed ({errors_in})" if "flashcore_err" in r or "error" in r else "-")
        err_fa = f"{r['fa3_max_err']:.2g}" if "fa3_max_err" in r else "-"
        lines.append(f"| {r['D']} | {'causal' if r['causal'] else 'full'} | {r['Hq']}/{r['Hkv']} | {r['tokens']} | "
                     f"{f'{fc:.0f}' if fc else '-'} | {f'{fa:.0f}' if fa else '-'} | {ratio} | {err_fc} / {err_fa} | "
                     f"{r.get('flashcore_config', '-')} |")
    if missing:
        names = {"flashcore": "FlashCore", "fa3": "FA3"}
        lines += [""] + [f"- {names.get(s, s)}: missing ({why})" for s, why in missing.items()]
    return "\n".join(lines)


def _params(q, k, v, out):
    """C params of attention(q, k, v) -> out without LSE and without a workspace."""
    from flashcore import _lib, _ops
    return _ops.kernel_params(_lib.load(), q, k, v, out, None, False, q.shape[3] ** -0.5)


def _name_config(lib, params, config):
    """Names kernel config `config` in params and gives them the zero-filled workspace it asks for; returns the name
    buffer and the workspace, which must stay alive while params are used."""
    name = ctypes.c_char_p(config.encode())
    params.kernel_config = ctypes.cast(name, ctypes.c_void_p)
    ws = torch.zeros(max(lib.workspace_size(params), 256), dtype=torch.uint8, device="cuda")
    params.workspace, params.workspace_size = ws.data_ptr(), ws.numel()
    return name, ws


def _listed_configs(configs, D, causal):
    """Those of `configs` the library lists for bf16 (D, causal)."""
    if not configs:
        return []
    from flashcore import _lib
    listed = set(_lib.load().kernel_configs(_lib.DTYPE_BF16, D, causal))
    return [c for c in configs if c in listed]


def _varlen_config_time(q, k, v, cu, max_len, causal, config, lens):
    """(max error, CUDA-graph time in us) of the packed batch run by the named kernel config through the C call."""
    from flashcore import _lib, _ops
    lib = _lib.load()
    out = torch.full_like(q, float("nan"))
    params = _ops.kernel_params(lib, q, k, v, out, None, causal, q.shape[2] ** -0.5, cu_seqlens_q=cu,
                                cu_seqlens_k=cu, max_seqlen_q=max_len, max_seqlen_k=max_len)
    keep = _name_config(lib, params, config)  # noqa: F841 (alive while the call is timed)

    def call():
        lib.forward(params, torch.cuda.current_stream().cuda_stream)
        return out
    err = _varlen_max_err(call(), q, k, v, lens, causal)
    return err, graph_time_us(call)


def _varlen_selected_config(q, k, v, cu, max_len, causal):
    """The kernel config flashcore.varlen_attention runs for this packed batch."""
    from flashcore import _lib, _ops
    lib = _lib.load()
    out = torch.empty_like(q)
    params = _ops.kernel_params(lib, q, k, v, out, None, causal, q.shape[2] ** -0.5, cu_seqlens_q=cu,
                                cu_seqlens_k=cu, max_seqlen_q=max_len, max_seqlen_k=max_len)
    size = lib.workspace_size(params)
    if size:
        ws = torch.zeros(size, dtype=torch.uint8, device=q.device)
        params.workspace, params.workspace_size = ws.data_ptr(), size
    return lib.selected_config(params)


def _selected_config(q, k, v):
    """The kernel config flashcore.attention(q, k, v) runs (the op passes a workspace when one is needed)."""
    from flashcore import _lib
    lib = _lib.load()
    out = torch.empty_like(q)
    params = _params(q, k, v, out)
    size = lib.workspace_size(params)
    if size:
        ws = torch.zeros(size, dtype=torch.uint8, device=q.device)
        params.workspace, params.workspace_size = ws.data_ptr(), size
    return lib.selected_config(params)


if __name__ == "__main__":
    main()
