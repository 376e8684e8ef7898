"""bench/backward.py's pure-Python parts without a GPU: the FLOP count (FlashAttention's 2.5x rule on the forward's
count), the grid, the markdown tables (per cell, geometric means, cells FlashCore cannot run, memory), --memory
parsing; and bench/flashcore_ctypes.py's params struct with the backward's fields against the C header."""

import math
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import backward  # noqa: E402
import flashcore_ctypes  # noqa: E402


def test_flops_follow_the_forward_bench():
    # 4*B*H*S*S*D, halved for causal with Sq == Sk; the backward is 2.5x, forward + backward 3.5x.
    assert backward.forward_flops(2, 16, 8192, 128, False) == 4.0 * 2 * 16 * 8192 * 8192 * 128
    assert backward.forward_flops(2, 16, 8192, 128, True) == 2.0 * 2 * 16 * 8192 * 8192 * 128
    assert backward.backward_flops(2, 16, 8192, 128, True) == 2.5 * backward.forward_flops(2, 16, 8192, 128, True)
    assert backward.FWDBWD_FLOP_FACTOR == backward.BWD_FLOP_FACTOR + 1
    # Causal with Sq != Sk: the exact count of the bottom-right aligned mask (as `flashcore bench` counts it).
    assert backward.visible_pairs(2, 5, True) == 4 + 5
    assert backward.visible_pairs(5, 2, True) == 0 + 0 + 0 + 1 + 2
    assert backward.visible_pairs(3, 7, False) == 21


def test_tflops():
    flops = backward.backward_flops(1, 32, 16384, 64, False)
    assert backward.tflops(flops, 10.0) == pytest.approx(flops / 1e-2 / 1e12)
    assert backward.tflops(flops, None) is None
    assert backward.tflops(flops, 0.0) is None


def test_grid_is_the_forward_reports_72_cells():
    cells = backward.grid_cells(["bf16", "fp16"], backward.GRID_D, backward.GRID_S, (False, True))
    assert len(cells) == 72
    for dt, D, S, causal, B, H in cells:
        assert B * S == 16384 and H * D == 2048
    assert backward.fa3_lacks("bf16", 128) is None
    assert backward.fa3_lacks("fp16", 128) and backward.fa3_lacks("bf16", 256)


def cell(D, causal, S, tflops, dtype="bf16", unsupported=None, err=None):
    systems = {n: {"tflops": t, "error": None if t else "failed"} for n, t in tflops.items()}
    c = {"dtype": dtype, "D": D, "causal": causal, "S": S, "B": 16384 // S, "H": 2048 // D, "systems": systems}
    if unsupported:
        c["fc_unsupported"] = unsupported
        c["systems"]["flashcore"] = {"tflops": None, "error": unsupported}
    if err is not None:
        c["fc_grad_err"] = err
        c["fc_finite"] = math.isfinite(err)
    return c


def test_best_anchor_and_cell_table():
    c = cell(128, True, 8192, {"flashcore": 400.0, "cudnn": 380.0, "fa2": 250.0, "fa3": 420.0}, err=4.1e-3)
    assert backward.best_anchor(c) == ("fa3", 420.0)
    lines = backward.cell_table([c], "bf16")
    assert lines[0].startswith("## bf16: backward TFLOPS")
    assert "| D | mask | S | B×H | FlashCore | cuDNN | FA2 | FA3 | best anchor | FC / best | FC / cuDNN | FC / FA2 | " \
           "FC / FA3 | FC grad err |" in lines
    assert "| 128 | causal | 8192 | 2×16 | 400 | 380 | 250 | 420 | 420 (FA3) | 0.95 | 1.05 | 1.60 | 0.95 | 4.1e-03 |" in lines
    assert backward.cell_table([c], "fp16") == []


def test_cell_table_without_fa3_and_cells_flashcore_cannot_run():
    why = "ValueError: FlashCore: ... head_dim = 256 ... [FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM]"
    cells = [cell(64, False, 512, {"flashcore": 300.0, "cudnn": 320.0, "fa2": 200.0}, dtype="fp16"),
             cell(256, False, 512, {"cudnn": 330.0, "fa2": 210.0}, dtype="fp16", unsupported=why),
             cell(256, False, 1024, {"cudnn": 350.0, "fa2": 220.0}, dtype="fp16", unsupported=why)]
    lines = backward.cell_table(cells, "fp16")
    assert not any("FA3" in line for line in lines)
    assert "| 64 | none | 512 | 32×32 | 300 | 320 | 200 | 320 (cuDNN) | 0.94 | 0.94 | 1.50 | — |" in lines
    assert "| 256 | none | 512 | 32×8 | cannot run | 330 | 210 | 330 (cuDNN) | — | — | — | — |" in lines
    listed = "\n".join(backward.unsupported_lines(cells))
    assert "## Cells FlashCore cannot run" in listed
    assert "- fp16 d256 none, S = 512, 1024: " + why in listed
    geo = "\n".join(backward.geomean_table(cells))
    assert "| fp16 | 256 | none | 0 | FlashCore cannot run these cells |" in geo


def test_geomeans_per_group():
    cells = [cell(128, False, 4096, {"flashcore": 500.0, "cudnn": 400.0, "fa2": 250.0, "fa3": 625.0}),
             cell(128, False, 8192, {"flashcore": 450.0, "cudnn": 500.0, "fa2": 260.0, "fa3": None}),
             cell(64, True, 4096, {"flashcore": 300.0, "cudnn": 250.0, "fa2": 200.0, "fa3": 280.0})]
    lines = backward.geomean_table(cells)
    fc_best = math.sqrt((500 / 625) * (450 / 500))
    fc_cudnn = math.sqrt((500 / 400) * (450 / 500))
    fc_fa2 = math.sqrt((500 / 250) * (450 / 260))
    want = (f"| bf16 | 128 | none | 2 | {fc_best:.2f} | {fc_cudnn:.2f} | {fc_fa2:.2f} | {500 / 625:.2f} | 0 of 2 |")
    assert want in lines
    assert f"| bf16 | 64 | causal | 1 | {300 / 280:.2f} | {300 / 250:.2f} | {300 / 200:.2f} | {300 / 280:.2f} | 1 of 1 |" \
        in lines
    overall = (fc_best ** 2 * (300 / 280)) ** (1 / 3)
    assert f"FC / best anchor {overall:.2f}" in "\n".join(lines)


def test_markdown_memory_and_errors():
    meta = {"gpu": "test GPU", "sms": 132, "l2_mib": 50, "torch": "-", "cuda": "-", "cudnn": 0, "flashcore": "-",
            "fa3": "measured", "method": "-", "elapsed_s": 1, "date": "-", "dtypes": ["bf16"]}
    cells = [cell(128, True, 8192, {"flashcore": 400.0, "cudnn": 380.0, "fa2": None, "fa3": 420.0}, err=float("inf"))]
    mem = {"dtype": "bf16", "D": 128, "S": 8192, "causal": True, "B": 2, "H": 16, "gradients_mib": 384.0,
           "systems": {"flashcore": {"extra_mib": 520.0, "note": "workspace 136 MiB"}, "cudnn": {"extra_mib": 700.0},
                       "fa3": {"extra_mib": None, "error": "RuntimeError: boom"}}}
    text = backward.markdown(meta, cells, mem)
    assert "| 128 | causal | 8192 | 2×16 | 400 | 380 | — | 420 | 420 (FA3) | 0.95 | 1.05 | — | 0.95 | non-finite |" in text
    assert "dQ, dK, dV alone are 384 MiB" in text
    assert "| FlashCore | 520 | 1.35 | workspace 136 MiB |" in text
    assert "| cuDNN (SDPA) | 700 | 1.82 |  |" in text
    assert "| FA3 | — | — | RuntimeError: boom |" in text
    assert "FA2 (SDPA): failed" in text  # the error list names the failing system


def test_parse_memory():
    assert backward.parse_memory("bf16:128:8192:1") == ("bf16", 128, 8192, True)
    assert backward.parse_memory("fp16:64:512:0") == ("fp16", 64, 512, False)
    assert backward.parse_memory("none") is None
    for bad in ("bf16:128:8192", "fp8:128:8192:1", "bf16:128:1000:1", "bf16:96:8192:0", "bf16:128:8192:2"):
        with pytest.raises(ValueError):
            backward.parse_memory(bad)


def test_main_rejects_bad_arguments():
    with pytest.raises(SystemExit):
        backward.main(["--systems", "flashcore,fa4"])
    with pytest.raises(SystemExit):
        backward.main(["--memory", "bf16:128"])


def test_backward_params_match_the_header(c_compiler, header_text, tmp_path):
    """flashcore_ctypes.BackwardParams: sizeof and the offset of every field of the backward against a C compiler."""
    import ctypes

    fields = [name for name, _ in flashcore_ctypes.BACKWARD_FIELDS] + ["workspace", "precision", "reserved2"]
    source = tmp_path / "offsets.c"
    source.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"flashcore/flashcore.h\"\nint main(void) {\n"
        "  printf(\"sizeof %zu\\n\", sizeof(flashcore_attention_params));\n"
        + "".join(f"  printf(\"{f} %zu\\n\", offsetof(flashcore_attention_params, {f}));\n" for f in fields)
        + "  return 0;\n}\n")
    exe = tmp_path / "offsets"
    subprocess.run([c_compiler, f"-I{REPO_ROOT / 'include'}", str(source), "-o", str(exe)], check=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], check=True, capture_output=True,
                                                       text=True).stdout.splitlines())
    assert int(got["sizeof"]) == ctypes.sizeof(flashcore_ctypes.BackwardParams)
    for f in fields:
        assert int(got[f]) == getattr(flashcore_ctypes.BackwardParams, f).offset, f
    assert flashcore_ctypes.BackwardParams.dout.offset == flashcore_ctypes.ATTENTION_PARAMS_V3_SIZE
