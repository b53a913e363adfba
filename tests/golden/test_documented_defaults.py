"""One default per setting (issue 23, point 4): the defaults docs/operations.md's flag table
states are the ones fastformer-server's --help reports, and fastformer-encode and
fastformer-bench report the same default for every flag they share with the server (all
three take them from common/defaults.h). The deliberate differences are named here:
fastformer-bench measures one engine in one named dtype, so its --backend defaults to cpu and
its --dtype to float32 (the others' auto would make its figures depend on the machine)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Flags whose default differs on purpose, per binary.
DELIBERATE = {"fastformer-bench": {"--backend": "cpu", "--dtype": "float32"}}


def help_defaults(binary: Path) -> dict:
    """--flag -> its default as CLI11's --help prints it: the text after '=', 'off' for a
    flag without a value, 'required', or None for an option without a default."""
    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30).stdout
    flags = {}
    for line in out.splitlines():
        # CLI11: the type (and =default) one space after the flag; the help text two or more.
        m = re.match(r"^\s+(?:-\w,)?(--[a-z0-9-]+)(?: ([A-Z]\S*))?(?:\s|$)", line)
        if not m or m.group(1) == "--help":
            continue
        flag, spec = m.group(1), m.group(2)
        if spec is None:
            flags[flag] = "off"
        elif "REQUIRED" in line:
            flags[flag] = "required"
        elif "=" in spec:
            flags[flag] = spec.split("=", 1)[1]
        else:
            flags[flag] = None
    return flags


def documented_defaults() -> dict:
    """--flag -> the default column of docs/operations.md's flag table: the first `code`
    value, else its first word (off, required), or None for a bare "none" (no default; a
    `none` in backticks is the value none, as --model-control-mode's default is)."""
    rows = {}
    for line in (REPO / "docs/operations.md").read_text().splitlines():
        m = re.match(r"^\| `(--[a-z0-9-]+)` \| `FASTFORMER_[A-Z0-9_]+` \| ([^|]+) \|", line)
        if m:
            cell = m.group(2).strip()
            code = re.match(r"`([^`]*)`", cell)
            word = cell.split()[0]
            rows[m.group(1)] = code.group(1) if code else (None if word == "none" else word)
    return rows


def test_the_table_states_what_the_server_reports(golden):
    docs = documented_defaults()
    reported = help_defaults(golden.require_binary("fastformer-server"))
    assert len(docs) >= 20, f"the flag table did not parse: {sorted(docs)}"
    assert set(docs) == set(reported), (f"flags only in the docs: {sorted(set(docs) - set(reported))}; "
                                        f"only in --help: {sorted(set(reported) - set(docs))}")
    for flag, want in docs.items():
        got = reported[flag]
        if want is None:
            assert got is None, f"{flag}: documented without a default, --help says {got!r}"
        else:
            assert got == want, f"{flag}: docs/operations.md says {want!r}, fastformer-server --help says {got!r}"


@pytest.mark.parametrize("binary", ["fastformer-encode", "fastformer-bench"])
def test_the_other_binaries_share_the_server_defaults(golden, binary):
    server = help_defaults(golden.require_binary("fastformer-server"))
    theirs = help_defaults(golden.require_binary(binary))
    shared = sorted(set(server) & set(theirs) - {"--model-dir"})
    assert "--threads" in shared and "--dtype" in shared, (binary, shared)
    for flag in shared:
        want = DELIBERATE.get(binary, {}).get(flag, server[flag])
        assert theirs[flag] == want, f"{binary} {flag}: default {theirs[flag]!r}, the server's is {server[flag]!r}"
