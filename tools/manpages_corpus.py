#!/usr/bin/env python3
"""The demo corpus: Debian's `manpages` and `manpages-dev`, labelled by manual section.

    apt-get install manpages manpages-dev      # the only download; no other network

Which pages: the files the two packages install under /usr/share/man/manN/
(`dpkg-query -L`), so pages from other installed packages never enter and the
corpus depends only on the two packages' versions (recorded in the output).
Symbolic links (aliases such as pthread_mutex_unlock.3 -> ...) and `.so` stubs
(a one-line include of another page) are skipped: they would be duplicates.

Text: the roff source with a simple, deterministic strip (`strip_roff`), not
`man -P cat`: rendering depends on groff's version, the terminal width and the
locale, and costs a process per page; the strip needs only Python. The `.TH`
title line is dropped because it states the section (the label) outright.
Comment lines, requests that carry no text (.nf, .PP, .RS, ...), font and
size escapes are removed; text-bearing macros (.SH, .B, .BR, .IP, ...) keep
their arguments; a few character escapes become their characters.

Labels (see LABELS): 2 system calls, 3 library functions, 4+5 special files
and file formats (merged: 29 + 34 pages in 6.03-2), 7 overviews and
conventions. Sections 1, 6 and 8 hold only 20 pages together in these
packages (the commands live in other packages), too few to learn or to test
a class, so they are left out.

Split: a page is in the test split when the first byte of
sha256("<section>/<name>") is below 256 * test_fraction: fixed, independent of
the order files are listed in and of which other pages exist.

Importable: collect_pages(packages) -> list of Page; strip_roff(src) -> str;
split_pages(pages, test_fraction) -> (train, test); package_versions(packages).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

PACKAGES = ("manpages", "manpages-dev")

# section -> (label id, label name); sections not listed are left out
LABELS: Dict[str, Tuple[int, str]] = {
    "2": (0, "system-call"),
    "3": (1, "library-function"),
    "4": (2, "file-or-device"),
    "5": (2, "file-or-device"),
    "7": (3, "overview"),
}
LABEL_NAMES = ["system-call", "library-function", "file-or-device", "overview"]

_MAN_PATH = re.compile(r"^/usr/share/man/man(\d)/([^/]+)\.(\d\w*)(\.gz)?$")


@dataclass
class Page:
    section: str
    name: str
    path: str
    text: str
    label: int


class CorpusError(Exception):
    pass


def package_versions(packages: Sequence[str] = PACKAGES) -> Dict[str, str]:
    out = {}
    for p in packages:
        r = subprocess.run(["dpkg-query", "-W", "-f", "${Status}\t${Version}", p],
                           capture_output=True, text=True)
        if r.returncode != 0 or not r.stdout.startswith("install ok installed"):
            raise CorpusError(f"package {p} is not installed; run: apt-get install -y {' '.join(packages)}")
        out[p] = r.stdout.split("\t", 1)[1]
    return out


def package_man_files(packages: Sequence[str] = PACKAGES) -> List[str]:
    files = []
    for p in packages:
        r = subprocess.run(["dpkg-query", "-L", p], capture_output=True, text=True)
        if r.returncode != 0:
            raise CorpusError(f"dpkg-query -L {p} failed: {r.stderr.strip()}")
        files += [line for line in r.stdout.splitlines() if _MAN_PATH.match(line)]
    return sorted(set(files))


def read_source(path: str) -> str:
    raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    return raw.decode("utf-8", errors="replace")


def is_so_stub(src: str) -> bool:
    lines = [l for l in src.splitlines() if l.strip() and not l.startswith(('.\\"', "'\\\""))]
    return len(lines) <= 2 and any(l.startswith(".so ") for l in lines)


# ----------------------------------------------------------------------------- roff strip

_CHARS = {
    "em": "\u2014", "en": "\u2013", "aq": "'", "dq": '"', "lq": "\u201c", "rq": "\u201d",
    "oq": "\u2018", "cq": "\u2019", "bu": "\u2022", "co": "\u00a9", "rg": "\u00ae",
    "ti": "~", "ha": "^", "rs": "\\", "mu": "\u00d7", "+-": "\u00b1", ">=": "\u2265",
    "<=": "\u2264", "!=": "\u2260", "->": "\u2192", "<-": "\u2190", "hy": "-", "sq": "\u25a1",
    "de": "\u00b0", "ga": "`", "aa": "\u00b4", "at": "@", "sh": "#", "Do": "$", "ba": "|",
    "lB": "[", "rB": "]", "lC": "{", "rC": "}", "la": "\u27e8", "ra": "\u27e9",
}
# macros whose arguments are text; every other request line is dropped
_TEXT_MACROS = {"SH", "SS", "B", "I", "BR", "BI", "IR", "IB", "RB", "RI", "SM", "SB",
                "IP", "TP", "TQ", "UR", "MT", "OP", "SY", "HP"}
# font-alternating macros join their arguments without spaces
_ALTERNATING = {"BR", "BI", "IR", "IB", "RB", "RI"}
_ESC = re.compile(
    r"\\(?:"
    r"f(?:\[[^\]]*\]|\(..|.)"        # font
    r"|s[-+]?\d"                     # size
    r"|\*(?:\[[^\]]*\]|\(..|.)"      # string
    r"|\((..)"                       # \(xx character
    r"|\[([^\]]*)\]"                 # \[name] character
    r"|([-e\\&:%|^c ~0t])"           # one-character escapes
    r"|([a-zA-Z])"                   # other: dropped
    r")")
_ARGS = re.compile(r'"((?:[^"]|"")*)"|(\S+)')


def _esc(m) -> str:
    two, name, one = m.group(1), m.group(2), m.group(3)
    if two is not None:
        return _CHARS.get(two, "")
    if name is not None:
        if name.startswith("u") and re.fullmatch(r"u[0-9A-Fa-f]{4,6}", name):
            return chr(int(name[1:], 16))
        return _CHARS.get(name, "")
    if one is not None:
        return {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "t": "\t"}.get(one, "")
    return ""


def strip_roff(src: str) -> str:
    """Text of a man page's roff source (see the module docstring)."""
    out = []
    for line in src.splitlines():
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        line = re.sub(r'\\".*$', "", line)  # trailing comment
        if line.startswith((".", "'")):
            parts = line[1:].strip().split(None, 1)
            if not parts or parts[0] not in _TEXT_MACROS:
                continue
            args = parts[1] if len(parts) > 1 else ""
            words = [m.group(1).replace('""', '"') if m.group(1) is not None else m.group(2)
                     for m in _ARGS.finditer(args)]
            if parts[0] in _ALTERNATING:  # .BR read () -> "read()": no space between the fonts
                line = "".join(words)
            else:
                line = " ".join(words)
        line = _ESC.sub(_esc, line)
        if line.strip():
            out.append(line.strip())
    return "\n".join(out)


# ----------------------------------------------------------------------------- corpus


def collect_pages(packages: Sequence[str] = PACKAGES) -> List[Page]:
    pages = []
    files = package_man_files(packages)
    absent = [f for f in files if not os.path.lexists(f)]
    if absent:
        raise CorpusError(
            f"{len(absent)} of the {len(files)} man pages that {', '.join(packages)} install are "
            f"absent (first: {absent[0]}); a dpkg path-exclude (e.g. /etc/dpkg/dpkg.cfg.d/excludes "
            f"in minimal container images) drops /usr/share/man: remove it and reinstall the packages")
    for path in files:
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        m = _MAN_PATH.match(path)
        section, name = m.group(1), m.group(2)
        if section not in LABELS:
            continue
        src = read_source(path)
        if is_so_stub(src):
            continue
        text = strip_roff(src)
        if not text:
            continue
        pages.append(Page(section=section, name=name, path=path, text=text, label=LABELS[section][0]))
    if not pages:
        raise CorpusError(f"no man pages found in packages {', '.join(packages)}")
    return pages


def in_test_split(page: Page, test_fraction: float) -> bool:
    h = hashlib.sha256(f"{page.section}/{page.name}".encode()).digest()
    return h[0] < round(256 * test_fraction)


def split_pages(pages: Sequence[Page], test_fraction: float = 0.2) -> Tuple[List[Page], List[Page]]:
    train = [p for p in pages if not in_test_split(p, test_fraction)]
    test = [p for p in pages if in_test_split(p, test_fraction)]
    return train, test


if __name__ == "__main__":  # corpus statistics
    import statistics
    ps = collect_pages()
    print("packages:", package_versions())
    tr, te = split_pages(ps)
    for lab, name in enumerate(LABEL_NAMES):
        n = [len(p.text.split()) for p in ps if p.label == lab]
        print(f"{lab} {name:18s} pages {len(n):4d} (train {sum(p.label == lab for p in tr)}, "
              f"test {sum(p.label == lab for p in te)})  words median {statistics.median(n):.0f} "
              f"mean {statistics.mean(n):.0f} max {max(n)}  >=512: {sum(x >= 512 for x in n)}")
    n = [len(p.text.split()) for p in ps]
    print(f"all pages {len(ps)} words median {statistics.median(n):.0f} mean {statistics.mean(n):.0f}")
