"""The one runner of the bench scenarios of tools/ (issue 49, item 6): warm-up, repeats, alternation
between the sides of a comparison, medians, and one JSON record with the machine, the date and
the command line. Standard library only (the GPU check runs the tools under a bare Python).

A scenario is a name and a `run_once()` that measures once and returns its figures, a dict of
numbers (nested dicts allowed: {"latency_ms": {"p50": ...}}). A comparison is several scenarios,
one a side: each round runs every scenario once, in the order given (A, B, A, B, ...; or A, B,
B, A, ... with alternate="abba"), so a drift of the machine during the run hits every side alike.

    from fastformer_testing.bench import Runner, Scenario

    runner = Runner(rounds=3, warmup=1, tool="compare_builds")
    result = runner.run([Scenario("old", lambda: {"tokens_per_s": measure(old)}),
                         Scenario("new", lambda: {"tokens_per_s": measure(new)})])
    result.median("new")["tokens_per_s"]; result.values("old", "tokens_per_s")  # each round's
    result.write("out.json", model=...)   # record(): tool, date, command, machine, runs, medians

A tool whose table or JSON callers parse keeps printing them and takes its repeats, medians and
machine record from here.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .binaries import REPO, use_tools


@dataclass
class Scenario:
    """One thing measured: `run_once()` measures once and returns its figures. `warm_up`, when
    given, is what a warm-up runs instead of `run_once` (e.g. a shorter load)."""

    name: str
    run_once: Callable[[], dict]
    warm_up: Optional[Callable[[], object]] = None
    params: dict = field(default_factory=dict)  # what it runs with, for the record


def machine() -> dict:
    """The machine a run measured (tools/machine_info.py: the CPU and its GEMM flags), the system,
    the Python and the load average at the time of the call."""
    use_tools()
    import machine_info

    info = machine_info.cpu_info()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"description": machine_info.describe(info), "cpu": info,
            "system": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "load_average": load}


def command() -> str:
    """This process's command line, the interpreter first (which Python ran matters)."""
    return shlex.join([sys.executable, *sys.argv])


def commit() -> Optional[str]:
    """The checkout's commit (with "+dirty" when it has changes), or None outside a git tree."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def provenance() -> dict:
    """command, commit and machine: what a tool that keeps its own date and figures adds to its JSON."""
    return {"command": command(), "commit": commit(), "machine": machine()}


def header(tool: Optional[str] = None, date: Optional[str] = None) -> dict:
    """What every bench record opens with: tool, date (UTC; default now), command, commit, machine."""
    return {"tool": tool or Path(sys.argv[0]).stem, "date": date or utc_now(), **provenance()}


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def medians(runs: list) -> dict:
    """The median of every numeric figure the runs all have (recursing into dicts); a figure
    missing from a run, or not a number in one, has no median."""
    if not runs:
        return {}
    out = {}
    for key, first in runs[0].items():
        values = [r.get(key) for r in runs]
        if all(_is_number(v) for v in values):
            out[key] = statistics.median(values)
        elif all(isinstance(v, dict) for v in values):
            inner = medians(values)
            if inner:
                out[key] = inner
    return out


class Result:
    """The runs of one Runner.run: each scenario's figures round by round, in `order`."""

    def __init__(self, runner: "Runner", scenarios: list):
        self.runner = runner
        self.scenarios = scenarios
        self.runs: dict = {s.name: [] for s in scenarios}
        self.order: list = []  # (round, name) of every measured run, as run
        self.date = utc_now()  # when the run started
        self._header = None

    @property
    def header(self) -> dict:
        """header(): read once, when first asked for (git and /proc: after a run, never inside one)."""
        if self._header is None:
            self._header = header(self.runner.tool, self.date)
        return self._header

    def values(self, name: str, key: str) -> list:
        return [r[key] for r in self.runs[name]]

    def median(self, name: str) -> dict:
        return medians(self.runs[name])

    def record(self, **extra) -> dict:
        """The JSON record: the header, the runner's settings, each scenario's runs and medians,
        the order of the runs, and `extra` (the tool's own figures and settings)."""
        return {**self.header, "rounds": self.runner.rounds, "warmup": self.runner.warmup,
                "alternate": self.runner.alternate,
                "scenarios": {s.name: {"params": s.params, "runs": self.runs[s.name], "median": self.median(s.name)}
                              for s in self.scenarios},
                "order": [[r, name] for r, name in self.order], **extra}

    def write(self, path, **extra) -> dict:
        rec = self.record(**extra)
        Path(path).write_text(json.dumps(rec, indent=2) + "\n")
        return rec


class Runner:
    """Runs scenarios: `warmup` unrecorded calls of each (its `warm_up`, else `run_once`), then
    `rounds` rounds, each running every scenario once in the order given (alternate="abba":
    reversed in every other round). `on_run(round, scenario, figures)` is called after each
    measured run (a tool's progress line); with `json_path` the record is rewritten after every
    run, so a run stopped half way keeps what it measured."""

    def __init__(self, rounds: int = 3, warmup: int = 0, *, alternate: str = "abab", tool: Optional[str] = None,
                 on_run: Optional[Callable] = None, json_path=None):
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1, not {rounds}")
        if alternate not in ("abab", "abba"):
            raise ValueError(f"alternate is 'abab' or 'abba', not {alternate!r}")
        self.rounds, self.warmup, self.alternate = rounds, warmup, alternate
        self.tool, self.on_run, self.json_path = tool, on_run, json_path

    def order(self, scenarios: list, rnd: int) -> list:
        return list(reversed(scenarios)) if self.alternate == "abba" and rnd % 2 == 1 else list(scenarios)

    def run(self, scenarios: list) -> Result:
        names = [s.name for s in scenarios]
        if len(set(names)) != len(names):
            raise ValueError(f"scenario names must differ: {names}")
        result = Result(self, scenarios)
        for _ in range(self.warmup):
            for s in scenarios:
                (s.warm_up or s.run_once)()
        for rnd in range(self.rounds):
            for s in self.order(scenarios, rnd):
                figures = s.run_once()
                if not isinstance(figures, dict):
                    raise TypeError(f"{s.name}: run_once() returned {type(figures).__name__}, not a dict of figures")
                result.runs[s.name].append(figures)
                result.order.append((rnd, s.name))
                if self.on_run:
                    self.on_run(rnd, s, figures)
                if self.json_path:
                    result.write(self.json_path)
        return result
