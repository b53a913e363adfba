"""Real texts available offline on a Debian machine, for the tokenizer parity test.

Two sources, both installed with ordinary Debian packages:
  - the translations in /usr/share/locale/*/LC_MESSAGES/*.mo (gettext catalogues: short
    sentences in ~100 languages and scripts: Latin with accents, Cyrillic, Greek, Arabic,
    Hebrew, Devanagari, CJK, Thai, ...);
  - the English documentation in /usr/share/doc (README, changelog.gz, copyright...), split
    into paragraphs (tabs, newlines, ASCII art and code included).
The selection is deterministic for a given machine (sorted, then ordered by a hash).
"""

from __future__ import annotations

import gettext
import glob
import gzip
import hashlib
import os
import re

MAX_CHARS = 4000


def _mo_texts():
    for path in sorted(glob.glob("/usr/share/locale/*/LC_MESSAGES/*.mo")):
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)
        except Exception:  # a catalogue Python's parser rejects: skip it
            continue
        for msgid, msgstr in catalog._catalog.items():  # noqa: SLF001 (the parsed catalogue)
            for s in (msgstr if isinstance(msgstr, list) else [msgstr]):
                if isinstance(s, str) and s.strip() and msgid:
                    yield s


def _doc_texts():
    for path in sorted(glob.glob("/usr/share/doc/**/*", recursive=True)):
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        try:
            if path.endswith(".gz"):
                with gzip.open(path, "rb") as f:
                    raw = f.read(2_000_000)
            elif os.path.getsize(path) < 2_000_000 and not re.search(r"\.(png|jpg|gif|pdf|ico|svg|woff2?|ttf)$", path):
                with open(path, "rb") as f:
                    raw = f.read()
            else:
                continue
            text = raw.decode("utf-8")
        except (UnicodeDecodeError, OSError, EOFError, gzip.BadGzipFile):
            continue
        if "\x00" in text:
            continue
        for para in re.split(r"\n\s*\n", text):
            if para.strip():
                yield para


def collect(limit: int | None = None) -> list[str]:
    seen = set()
    texts = []
    for source in (_mo_texts(), _doc_texts()):
        for t in source:
            t = t[:MAX_CHARS]
            if t not in seen:
                seen.add(t)
                texts.append(t)
    texts.sort(key=lambda t: hashlib.sha1(t.encode("utf-8", "surrogatepass")).hexdigest())
    # Lone surrogates cannot be UTF-8: keep only texts that encode.
    out = []
    for t in texts:
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            continue
        out.append(t)
    return out[:limit] if limit else out


if __name__ == "__main__":
    texts = collect()
    non_ascii = sum(1 for t in texts if not t.isascii())
    print(f"{len(texts)} texts, {non_ascii} with non-ASCII characters")
