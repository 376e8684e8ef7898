#!/usr/bin/env python3
"""Ring attention from Python (flashcore.distributed.ring_attention over torch.distributed + NCCL): scaling over
this machine's GPUs, one process per GPU.

    FLASHCORE_LIBRARY=build/lib/libflashcore.so PYTHONPATH=python python3 bench/ring.py --seqlens 65536,131072

Per sequence length and mask: T1 = flashcore.attention on the whole sequence on GPU 0; TN = ring_attention on N
GPUs (the slowest rank's time), with the overlap and serialized (overlap=False); efficiency = T1 / (N * TN);
max |O_ring - O_1gpu|. One sequence (batch 1), bf16, d128, 16 KV heads and 16 query heads by default; CUDA-event
medians after warm-up, with a barrier before each timed call. Writes OUT/ring_py.json and OUT/ring_py.md.
The C front end's figures come from `flashcore ring` (tools/flashcore/ring_cmd.cpp).
"""
import argparse
import json
import os
import statistics
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _time(fn, iters, warmup, barrier=None):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if barrier is not None:
            barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def _inputs(device, seqlen, heads_q, heads_kv, head_dim):
    gen = torch.Generator(device=device).manual_seed(seqlen)
    shape_q, shape_kv = (1, seqlen, heads_q, head_dim), (1, seqlen, heads_kv, head_dim)
    q = torch.randn(shape_q, device=device, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(shape_kv, device=device, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(shape_kv, device=device, dtype=torch.bfloat16, generator=gen)
    return q, k, v


def _worker(rank, world, init_file, result_file, args):
    import flashcore
    import flashcore.distributed as fcd

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", world_size=world, rank=rank,
                            device_id=device)
    rows = []
    barrier = lambda: dist.barrier(device_ids=[rank])  # noqa: E731
    for seqlen in args.seqlens:
        for causal in (False, True):
            q, k, v = _inputs(device, seqlen, args.heads_q, args.heads_kv, args.head_dim)
            mine = [fcd.shard(t, world, rank) for t in (q, k, v)]
            row = {"seqlen": seqlen, "causal": causal, "world": world}
            for name, overlap in (("tn", True), ("tn_serialized", False)):
                def ring():
                    return fcd.ring_attention(*mine, causal=causal, overlap=overlap, seqlen_global=seqlen)
                ms = torch.tensor([_time(ring, args.iters, args.warmup, barrier)], device=device)
                dist.all_reduce(ms, op=dist.ReduceOp.MAX)
                row[name + "_ms"] = ms.item()
            out = fcd.ring_attention(*mine, causal=causal, seqlen_global=seqlen)
            gathered = [torch.empty_like(out) for _ in range(world)]
            dist.all_gather(gathered, out.contiguous())
            if rank == 0:
                ring_out = fcd.unshard(gathered)
                def whole():
                    return flashcore.attention(q, k, v, causal=causal)
                row["t1_ms"] = _time(whole, args.iters, args.warmup)
                row["max_abs_diff"] = (ring_out.float() - whole().float()).abs().max().item()
                for name in ("tn", "tn_serialized"):
                    row["eff" + name[2:]] = row["t1_ms"] / (world * row[name + "_ms"])
                rows.append(row)
                print(json.dumps(row), flush=True)
            del q, k, v, mine
            torch.cuda.empty_cache()
    if rank == 0:
        with open(result_file, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def markdown(rows, device_name, world):
    lines = [f"Ring attention from Python (flashcore.distributed over torch.distributed/NCCL), {world} x "
             f"{device_name}, bf16, batch 1, CUDA-event medians", "",
             "| seqlen | mask | T1 ms | T{0} ms | eff. | T{0} serialized ms | eff. serialized | max abs diff |".format(world),
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seqlen']} | {'causal' if r['causal'] else 'none'} | {r['t1_ms']:.2f} | {r['tn_ms']:.2f} | "
                     f"{100 * r['eff']:.1f}% | {r['tn_serialized_ms']:.2f} | {100 * r['eff_serialized']:.1f}% | "
                     f"{r['max_abs_diff']:.2e} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlens", default="32768,65536,131072",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--world", type=int, default=0, help="GPUs [all visible]")
    parser.add_argument("--heads-q", type=int, default=16)
    parser.add_argument("--heads-kv", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    world = args.world or torch.cuda.device_count()
    if world < 2:
        raise SystemExit(f"bench/ring.py: needs 2 or more GPUs, {torch.cuda.device_count()} visible")
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "rows.json")
        mp.spawn(_worker, args=(world, os.path.join(tmp, "init"), result, args), nprocs=world)
        with open(result) as f:
            rows = json.load(f)
    with open(os.path.join(args.out, "ring_py.json"), "w") as f:
        json.dump(rows, f, indent=1)
    table = markdown(rows, torch.cuda.get_device_name(0), world)
    with open(os.path.join(args.out, "ring_py.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
