"""tools/plot_loadgen.py on a small synthetic sweep CSV (no server needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "plot_loadgen.py"
HEADER = "step,requests_per_second,tokens_per_second,p50_ms,p90_ms,p99_ms,p999_ms,max_ms,errors\n"
ROWS = ["1,95.2,48742,10.4,11.0,12.5,14.0,15.1,0", "2,180.1,92211,11.0,12.2,14.8,17.0,19.2,0",
        "4,330.5,169216,12.0,14.1,18.9,22.0,25.0,0", "8,520.0,266240,15.3,19.8,27.5,33.1,40.2,0",
        "16,610.3,312474,26.1,33.0,48.0,60.2,71.0,0", "32,640.2,327782,49.8,61.2,88.1,120.5,140.0,3"]


def _run(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=120)


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plot_sweep_csv(tmp_path):
    csv = tmp_path / "sweep.csv"
    csv.write_text(HEADER + "\n".join(ROWS) + "\n")
    out = tmp_path / "plots" / "sweep.png"
    p = _run("--csv", csv, "--out", out, "--title", "synthetic sweep")
    assert p.returncode == 0, p.stderr
    w, h = _png_size(out)
    assert w >= 600 and h >= 400 and out.stat().st_size > 10_000
    # requests/s on x, extra columns ignored, two sweeps compared, log scale
    csv2 = tmp_path / "other.csv"
    csv2.write_text(HEADER.rstrip("\n") + ",sequences_per_second\n" + "\n".join(r + ",1" for r in ROWS) + "\n")
    out2 = tmp_path / "compare.png"
    p = _run("--csv", csv, "--csv", csv2, "--label", "cpu", "--label", "gpu", "--x", "requests", "--logy",
             "--percentiles", "p50,p90,p99,p999,max", "--out", out2)
    assert p.returncode == 0, p.stderr
    _png_size(out2)


@pytest.mark.parametrize("content,needle", [
    ("step,requests_per_second\n1,2\n", "missing column(s) tokens_per_second"),
    (HEADER, "no data rows"),
    (HEADER + "1,2,3,x,5,6,7,8,0\n", "p50_ms: not a number"),
])
def test_plot_bad_csv(tmp_path, content, needle):
    csv = tmp_path / "bad.csv"
    csv.write_text(content)
    p = _run("--csv", csv, "--out", tmp_path / "x.png")
    assert p.returncode == 1 and needle in p.stderr, p.stderr
    assert not (tmp_path / "x.png").exists()
    p = _run("--csv", tmp_path / "missing.csv", "--out", tmp_path / "x.png")
    assert p.returncode == 1 and "missing.csv" in p.stderr
