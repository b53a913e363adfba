"""tools/cost_model.py counts what fastformer-bench --profile reports: on a small model, op by op
and layer by layer, the same bytes and FLOPs (the formulas of server/engine/profiling_ops.cc), so the
cost model of docs/kernels.md and a profile on a GPU compare like with like. The CPU engine times its
attention (the cost model's query_pool, key_pool and mix) as one op, whose row is their sum."""

import json
import subprocess

import cost_model
import make_demo_model as mdm


def test_profile_rows_are_the_cost_models_formulas(tmp_path, golden):
    bench = golden.require_binary("fastformer-bench")
    # 2D + H = 144, a multiple of 8: the Q|K|s width is the same padded or not.
    sizes = cost_model.Sizes(D=64, H=16, I=96, layers=2, E=4)  # the CPU engine serves float32
    mdm.make_demo_model(tmp_path / "m", preset="tiny", seed=1, hidden=sizes.D, heads=sizes.H,
                        layers=sizes.layers, intermediate=sizes.I, log=lambda *a: None)
    B, L = 2, 300  # two 300-token sequences: two pooling chunks each
    p = subprocess.run([str(bench), "--backend", "cpu", "--threads", "1", "--model-dir", str(tmp_path / "m"),
                        "--lengths", f"fixed:{L}", "--batch-tokens", str(B * L), "--pool-batches", "1",
                        "--warmup-batches", "0", "--seconds", "0", "--profile", "--json"],
                       capture_output=True, text=True, timeout=120, check=True)
    profile = json.loads(p.stdout)["profile"]
    assert "qks_gemm" in p.stderr  # the table

    expected = []
    for name, layer, _, (bytes_, flops), _, _ in cost_model.ops(B, B * L, m=sizes):
        if name == "ffn_in_bias_gelu":
            continue  # the CUDA engine's pass after ffn_in_gemm, a row of its own there; the CPU engine fuses it into the GEMM
        if name in ("key_pool", "mix"):  # the CPU engine's attention: its three ops in one row
            _, _, attention_bytes, attention_flops = expected.pop()
            expected.append(("attention", layer, attention_bytes + bytes_, attention_flops + flops))
            continue
        expected.append(("attention" if name == "query_pool" else name, layer, bytes_, flops))
    assert [(r["name"], r["layer"]) for r in profile] == [(n, l) for n, l, _, _ in expected]
    for row, (name, layer, bytes_, flops) in zip(profile, expected):
        assert row["calls"] == 1, name
        assert row["bytes"] == bytes_, (name, layer)
        assert row["flops"] == flops, (name, layer)
    assert abs(sum(r["share"] for r in profile) - 1) < 1e-9
    # --profile-rounds' default: three passes, each op's time the median of its three.
    for row in profile:
        assert len(row["ms_rounds"]) == 3, row["name"]
        assert row["ms"] == sorted(row["ms_rounds"])[1], (row["name"], row["layer"])
