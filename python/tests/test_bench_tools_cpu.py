"""The measurement scripts' pure-Python parts, without a GPU: the sustained summary of bench/power_diag.py (ratios,
work per cycle, which systems count as "other"), tools/ab_summary.py, and bench/report.py's markdown (the clock
caveat, the named-config table), tools/ncu_stalls.py's reading of a source-page CSV."""

import math
import sys

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
sys.path.insert(0, str(REPO_ROOT / "tools"))

import ab_summary  # noqa: E402
import ncu_stalls  # noqa: E402
import power_diag  # noqa: E402
import report  # noqa: E402


def summary_rows(text):
    """{(D, mask, S): [cells]} of the per-cell table power_diag.summarize prints."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 3 and cells[0].isdigit():
            rows[(int(cells[0]), cells[1], int(cells[2]))] = cells[3:]
    return rows


def test_power_summary_ratios_and_cycles(capsys):
    results = {
        (128, True, 8192): {"flashcore": [(588.0, 1535.0), (588.0, 1532.0)], "fa3": [(616.0, 1482.0), (616.0, 1484.0)],
                            "cudnn": [(528.0, 1674.0)]},
        (64, False, 512): {"flashcore": [(378.0, 1746.0)], "fa3": [(315.0, 1807.0)], "cudnn": [(364.0, 1700.0)]},
    }
    power_diag.summarize(results, ["flashcore", "fa3", "cudnn"])
    out = capsys.readouterr().out
    rows = summary_rows(out)
    fc_fa3, per_cycle, best = (float(x) for x in rows[(128, "causal", 8192)][3:6])
    assert fc_fa3 == pytest.approx(588 / 616, abs=1e-3)
    assert per_cycle == pytest.approx((588 / 1533.5) / (616 / 1483.0), abs=1e-3)
    assert best == pytest.approx(588 / 616, abs=1e-3)  # FA3 is the best other here
    assert float(rows[(64, "none", 512)][5]) == pytest.approx(378 / 364, abs=1e-3)  # cuDNN is, here
    geo = math.sqrt((588 / 616) * (378 / 315))
    assert f"FC / FA3 {geo:.3f}" in out
    assert "cells below 0.93 of the best other: 0" in out


def test_power_summary_keeps_our_own_systems_out_of_best_other(capsys):
    # A named config of ours faster than FlashCore's own choice is not "the best other system".
    named = "flashcore@128x128x2-pp-dynamic-vote"
    results = {(128, True, 2048): {"flashcore": [(490.0, 1555.0)], named: [(700.0, 1500.0)], "fa3": [(519.0, 1495.0)]}}
    power_diag.summarize(results, ["flashcore", named, "fa3"])
    rows = summary_rows(capsys.readouterr().out)
    assert float(rows[(128, "causal", 2048)][-1]) == pytest.approx(490 / 519, abs=1e-3)


def test_power_summary_skips_cells_without_flashcore(capsys):
    power_diag.summarize({(64, True, 512): {"fa3": [(230.0, 1800.0)]}}, ["flashcore", "fa3"])
    out = capsys.readouterr().out
    assert summary_rows(out) == {}
    assert "over 0 cells" in out


def test_ab_summary(capsys):
    metrics = {"cells": [
        {"dtype": "bf16", "D": 128, "causal": False, "S": 4096,
         "systems": {"flashcore": {"tflops": 600.0}, "flashcore_b": {"tflops": 618.0}}},
        {"dtype": "bf16", "D": 64, "causal": True, "S": 512,
         "systems": {"flashcore": {"tflops": 240.0}, "flashcore_b": {"tflops": None}}},
    ]}
    assert ab_summary.summarize(metrics) == pytest.approx(1.03)
    out = capsys.readouterr().out
    assert "missing (B did not run)" in out
    assert "over 1 cells" in out
    with pytest.raises(SystemExit):
        ab_summary.summarize({"cells": metrics["cells"][1:]})


def markdown(tmp_path, interleave, systems, cells):
    meta = {"gpu": "test GPU", "sms": 132, "l2_mib": 60, "torch": "-", "cuda": "-", "cudnn": 0, "flashcore": "-",
            "method": "-", "elapsed_s": 0, "date": "-", "dtypes": ["bf16"], "systems": systems,
            "interleave": interleave}
    path = tmp_path / "report.md"
    report.write_markdown(str(path), meta, cells, [], {"grid": {}, "path": None, "machine": None}, [])
    return path.read_text()


def cell(D, causal, S, tflops):
    """A grid cell's record as report.run_cell writes it; tflops: {system: TFLOPS, or None where it did not run}."""
    systems = {n: {"tflops": t, "error": None if t else "not compiled"} for n, t in tflops.items()}
    systems["flashcore"]["config"] = "128x128x2-dynamic-vote"
    return {"dtype": "bf16", "D": D, "causal": causal, "S": S, "B": 16384 // S, "H": 2048 // D, "systems": systems}


def test_report_states_the_clock_caveat_unless_interleaved(tmp_path):
    cells = [cell(128, True, 8192, {"flashcore": 600.0, "fa3": 640.0})]
    assert "Clocks are not locked" in markdown(tmp_path, False, ["flashcore", "fa3"], cells)
    assert "Clocks are not locked" not in markdown(tmp_path, True, ["flashcore", "fa3"], cells)


def test_report_named_config_table(tmp_path):
    name = "flashcore@128x128x2-pp-dynamic-vote"
    cells = [cell(128, True, 8192, {"flashcore": 600.0, "fa3": 640.0, name: 615.0}),
             cell(64, True, 8192, {"flashcore": 480.0, "fa3": 500.0, name: None})]
    text = markdown(tmp_path, False, ["flashcore", "fa3", name], cells)
    assert "named kernel configs" in text
    assert "| 128 | causal | 8192 | 600 (128x128x2-dynamic-vote) | 615 (1.025) |" in text
    assert "| 64 | causal | 8192 | 480 (128x128x2-dynamic-vote) | — (—) |" in text


def source_csv(path, kernels):
    """An ncu source-page CSV with one table per kernel: kernels = [(name, [(sass, executions, samples)])]."""
    lines = []
    for name, rows in kernels:
        lines.append(f'"Kernel Name","{name}",')
        lines.append('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait",'
                     '"stall_wait (Not Issued)"')
        for i, (sass, executions, samples) in enumerate(rows):
            lines.append(f'"0x{i:x}","{sass}","{samples}","{executions}","{samples}","0"')
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_ncu_stalls_reads_the_largest_kernel_and_its_regions(tmp_path):
    fill = [("MOV R1, R2", 4, 2)]
    attention = [("HGMMA.64x128x16.F32.BF16 R24", 1000, 60), ("MUFU.EX2 R3, R3", 1000, 30),
                 ("@!P0  BRA 0x10", 10, 5), ("STS.128 [R4], R8", 10, 4), ("EXIT", 0, 0)]
    path = source_csv(tmp_path / "k.csv", [("fill", fill), ("attention", attention)])
    hdr, data = ncu_stalls.load(path)
    assert len(data) == len(attention)
    found, total = ncu_stalls.regions(hdr, data)
    assert total == 99
    assert found == [(1000, 2, 90.0), (10, 2, 9.0)]  # the loop body, then the tile edge; EXIT never ran


def test_report_small_shapes_show_every_system_of_the_run(tmp_path):
    meta = {"gpu": "test GPU", "sms": 132, "l2_mib": 60, "torch": "-", "cuda": "-", "cudnn": 0, "flashcore": "-",
            "method": "-", "elapsed_s": 0, "date": "-", "dtypes": ["fp16"], "systems": ["flashcore", "cudnn", "fa3"],
            "interleave": False}
    small = [{"tag": "long", "B": 2, "H": 8, "S": 2048, "D": 64, "causal": False, "dtype": "fp16",
              "systems": {"flashcore": {"median_ms": 0.040, "config": "128x128x3-pp-static"}, "cudnn": {"median_ms": 0.042},
                          "fa3": {"median_ms": 0.050}}}]
    path = tmp_path / "report.md"
    cells = [cell(128, True, 8192, {"flashcore": 600.0, "cudnn": 560.0, "fa3": 640.0})]  # both tables in one report
    report.write_markdown(str(path), meta, cells, small, {"grid": {}, "small": {}, "path": None, "machine": None}, [])
    text = path.read_text()
    assert "| FlashCore | cuDNN | FA3 | FlashCore / best other |" in text
    assert "| 2,8,2048,64 | fp16 | none | 40.0 | 42.0 | 50.0 | 1.05 | — | — | — | 128x128x3-pp-static |" in text
