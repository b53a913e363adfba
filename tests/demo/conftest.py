"""Fixtures for the tests on the trained demo model (run: make test-demo).

The model is the one tools/train_demo_model.py writes (docs/demo-model.md): config.json,
model.safetensors, test.jsonl (text and label per held-out page), test_ids.jsonl (the
notebook's token ids, fastformer-encode's input) and test_logits.jsonl (the PyTorch model's
logits). Training takes minutes, so the tests do not train: they take the directory from
$FASTFORMER_DEMO_MODEL_DIR and are SKIPPED, with the reason, when it is unset or incomplete
(`make test-demo` trains into $(BUILD_DIR)/demo-model when missing and sets it).

The C++ binaries are looked up in $FASTFORMER_BIN_DIR (default <repo>/build/bin) by
tools/fastformer_testing. A missing binary is a test FAILURE
(FASTFORMER_ALLOW_MISSING_BINARIES=1 turns it into a skip, while developing). Helpers come through fixtures, never `from conftest import ...` (which breaks
when several test directories with a conftest.py are collected together).

Tests add their figures (accuracy, worst errors) with the `demo_report` fixture; they are
printed in pytest's terminal summary, passed or failed, without -s.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List

import numpy as np
import pytest

if str(Path(__file__).resolve().parents[2] / "tools") not in sys.path:  # tools/: fastformer_testing, the tools
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from fastformer_testing import binary  # noqa: E402

MODEL_ENV = "FASTFORMER_DEMO_MODEL_DIR"
SPLIT_FILES = ("config.json", "model.safetensors", "test.jsonl", "test_ids.jsonl", "test_logits.jsonl")

_report: List[str] = []


def _read_jsonl(path: Path) -> list:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass
class DemoSplit:
    """The held-out test split of the demo model, in page order."""
    model_dir: Path
    ids_path: Path            # test_ids.jsonl: {"token_ids": [...]} per page
    texts: List[str]          # test.jsonl "text"
    labels: np.ndarray        # [pages] the true labels (test.jsonl "label")
    torch_logits: np.ndarray  # [pages, labels] float64, the PyTorch model's (test_logits.jsonl)

    @property
    def torch_labels(self) -> np.ndarray:
        return self.torch_logits.argmax(1)


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    value = os.environ.get(MODEL_ENV)
    if not value:
        pytest.skip(f"{MODEL_ENV} is not set: `make test-demo` trains the demo model and sets it")
    path = Path(value)
    missing = [name for name in SPLIT_FILES if not (path / name).is_file()]
    if missing:
        pytest.skip(f"{MODEL_ENV}={path} lacks {', '.join(missing)}: train it with "
                    f"/usr/bin/python3 tools/train_demo_model.py --out {path}")
    return path


@pytest.fixture(scope="session")
def demo_split(demo_model_dir) -> DemoSplit:
    pages = _read_jsonl(demo_model_dir / "test.jsonl")
    logits = np.array([r["logits"] for r in _read_jsonl(demo_model_dir / "test_logits.jsonl")],
                      dtype=np.float64)
    assert len(pages) == len(logits), "test.jsonl and test_logits.jsonl disagree on the number of pages"
    return DemoSplit(model_dir=demo_model_dir, ids_path=demo_model_dir / "test_ids.jsonl",
                     texts=[p["text"] for p in pages], labels=np.array([p["label"] for p in pages]),
                     torch_logits=logits)


@pytest.fixture(scope="session")
def require_binary():
    """require_binary(name) -> its path; fails the test (or skips, see above) when missing."""
    return binary


@pytest.fixture(scope="session")
def demo_report():
    """demo_report(line): a line for the terminal summary."""
    return _report.append


def pytest_terminal_summary(terminalreporter):
    if _report:
        terminalreporter.section("demo model figures")
        for line in _report:
            terminalreporter.write_line(line)
