"""The bench scenarios' runner (tools/fastformer_testing/bench.py) with fake scenarios: warm-up,
repeats, alternation order, medians, and the JSON record with its machine block."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fastformer_testing.bench import Runner, Scenario, machine, medians, provenance


def fake(name, log, values):
    """A scenario whose k-th call returns values[k] (warm-ups included) and logs its name."""
    calls = iter(values)

    def run_once():
        log.append(name)
        return next(calls)

    return Scenario(name, run_once, params={"side": name})


def test_rounds_alternate_the_sides_after_the_warm_up_and_take_medians(tmp_path):
    log, seen = [], []
    a = fake("a", log, [{"x": 100}, {"x": 3, "lat": {"p50": 1.0}}, {"x": 1, "lat": {"p50": 5.0}},
                        {"x": 2, "lat": {"p50": 2.0}}])
    b = fake("b", log, [{"x": 100}, {"x": 10, "tag": "s"}, {"x": 30, "tag": "s"}, {"x": 20, "tag": "s"}])
    runner = Runner(rounds=3, warmup=1, tool="fake", on_run=lambda r, s, f: seen.append((r, s.name, f["x"])),
                    json_path=tmp_path / "partial.json")
    result = runner.run([a, b])
    assert log == ["a", "b"] * 4  # one warm-up each, then a, b in every round
    assert seen == [(0, "a", 3), (0, "b", 10), (1, "a", 1), (1, "b", 30), (2, "a", 2), (2, "b", 20)]
    assert result.values("a", "x") == [3, 1, 2]  # the warm-up's 100 is not recorded
    assert result.median("a") == {"x": 2, "lat": {"p50": 2.0}}
    assert result.median("b") == {"x": 20}  # "tag" is not a number: no median

    rec = json.loads((tmp_path / "partial.json").read_text())  # rewritten after every run: the whole run now
    assert rec == json.loads(json.dumps(result.record()))
    assert set(rec) >= {"tool", "date", "command", "commit", "machine", "rounds", "warmup", "scenarios", "order"}
    assert rec["tool"] == "fake" and rec["rounds"] == 3 and rec["warmup"] == 1
    assert rec["order"] == [[0, "a"], [0, "b"], [1, "a"], [1, "b"], [2, "a"], [2, "b"]]
    assert rec["scenarios"]["b"] == {"params": {"side": "b"}, "runs": [{"x": 10, "tag": "s"}, {"x": 30, "tag": "s"},
                                                                        {"x": 20, "tag": "s"}], "median": {"x": 20}}
    assert sys.executable in rec["command"]
    m = rec["machine"]
    assert m["description"] and m["cpu"]["model_name"] and isinstance(m["cpu"]["flags"], dict)
    assert m["cpu"]["logical_cpus"] >= 1 and m["python"] and m["system"]

    out = result.write(tmp_path / "r.json", model="m")
    assert json.loads((tmp_path / "r.json").read_text())["model"] == out["model"] == "m"


def test_abba_reverses_every_other_round_and_warm_up_uses_its_own_call():
    log = []
    warm = []
    a = Scenario("a", lambda: log.append("a") or {"x": 1}, warm_up=lambda: warm.append("a"))
    b = Scenario("b", lambda: log.append("b") or {"x": 2}, warm_up=lambda: warm.append("b"))
    result = Runner(rounds=4, warmup=2, alternate="abba").run([a, b])
    assert warm == ["a", "b", "a", "b"] and log == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert result.median("a") == {"x": 1} and result.median("b") == {"x": 2}


def test_the_runner_refuses_what_it_cannot_record():
    with pytest.raises(ValueError):
        Runner(rounds=0)
    with pytest.raises(ValueError):
        Runner(alternate="random")
    with pytest.raises(ValueError):
        Runner(rounds=1).run([Scenario("a", dict), Scenario("a", dict)])
    with pytest.raises(TypeError, match="a: run_once"):
        Runner(rounds=1).run([Scenario("a", lambda: 3.0)])


def test_medians_of_even_counts_and_missing_figures():
    assert medians([{"x": 1, "y": 1}, {"x": 4}]) == {"x": 2.5}
    assert medians([]) == {}
    assert medians([{"ok": True}, {"ok": False}]) == {}  # a bool is no figure


def test_machine_block_and_the_runner_import_under_a_bare_python(tmp_path):
    """The GPU check runs the tools under the lent machine's bare Python (-S: no site packages)."""
    from fastformer_testing.binaries import TOOLS

    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from fastformer_testing.bench import Runner, Scenario; "
            "r = Runner(rounds=2).run([Scenario('s', lambda: {'v': 1.5})]); print(json.dumps(r.record()))")
    p = subprocess.run([sys.executable, "-S", "-c", code, str(TOOLS)], capture_output=True, text=True, check=True)
    rec = json.loads(p.stdout)
    assert rec["scenarios"]["s"]["median"] == {"v": 1.5} and rec["machine"]["cpu"]["flags"]
    assert machine()["description"] == rec["machine"]["description"]
    assert set(provenance()) == {"command", "commit", "machine"}  # what bench_swap/bench_kserve add to their JSON
