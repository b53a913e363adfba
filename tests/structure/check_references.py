#!/usr/bin/env python3
"""What the docs and the comments cite exists: repository paths, sections and fastformer:: names.

    check_references.py --root REPO     check the tree; exit status 1 lists each finding as
                                        file:line: what is missing
    check_references.py --self-test     a doc and comments that cite what is not there must be
                                        caught, and what is there must pass

Where it looks:
- docs/*.md and docs/**/*.md, all of their text;
- the comments of the C++ under server/, kernels/, common/, client/ and tests/ (`//` and
  `/* */`; string literals are skipped);
- the `#` comments and the docstrings of the Python under tools/ and tests/ (other strings are
  skipped).

What it checks there:
- **paths**: a token that starts with a known top-level directory of the repository (server/,
  kernels/, common/, client/, tools/, tests/, docs/, deploy/, mk/, proto/, models/, .ci/)
  must name a file or directory of the checkout (tracked, or new and not ignored). A trailing
  `:line` is allowed; `{a,b}` is expanded, and `*`, `**`, `<placeholder>` and a `...`
  component match as globs do. A path cited in docs that is made by a build or at run time
  belongs in the allow-list, with its reason.
- **links** (docs only): a Markdown link's relative target, resolved from the doc's folder,
  must exist, and its `#anchor`, where the target is Markdown, must be one of its headings
  (GitHub's slugs).
- **sections**: `some.md, "Section"` (or `some.md "Section"`, the path in backticks or not)
  must find the quoted words in one of that file's headings; `some.md` is resolved from the
  citing doc's folder, from the repository root, then from docs/.
- **names**: `fastformer::<a>::<b>` must be declared in the C++ sources or the protos: every
  qualifier a namespace or type declared somewhere, and the last name declared as one, or
  named in the code (comments and strings aside) of a file that declares its qualifier.

The allow-list (reference_allowlist.txt, beside this script) holds what is allowed to be
missing, one entry a line: `CITING_FILE_GLOB KIND:WHAT_GLOB  # why`, KIND one of path, link,
section, name. An entry that matches nothing fails too, so that a mended citation takes its
entry with it.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import pathlib
import re
import subprocess
import sys
import tempfile

TOPS = ["server", "kernels", "common", "client", "tools", "tests", "docs", "deploy", "mk", "proto", "models",
        ".ci"]
CPP_DIRS = ["server", "kernels", "common", "client", "tests"]
CPP_EXT = {".h", ".hh", ".hpp", ".cc", ".cpp", ".cu", ".cuh"}
PY_DIRS = ["tools", "tests"]
DECL_DIRS = ["server", "kernels", "common", "client", "tests", "tools"]
ALLOWLIST = pathlib.Path(__file__).with_name("reference_allowlist.txt")

# A path: a known top-level directory, then path characters, {a,b} groups and <placeholders>.
PATH_RE = re.compile(r"(?<![\w.\-/~$@:#])((?:%s)/(?:[\w.\-*+]|\{[^{}\s]*\}|<[\w .\-]+>|/)*)"
                     % "|".join(re.escape(t) for t in TOPS))
NAME_RE = re.compile(r"(?<![\w:])fastformer((?:::\w+)+)")
LINK_RE = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SECTION_RE = re.compile(r"`?([\w./\-]+\.md)`?\)?,?\s+\(?\"([^\"\n]{2,}?)\"")
CPP_LEX = re.compile(r"//[^\n]*|/\*.*?\*/|(?:u8|[uUL])?R\"([^()\\ \n]{0,16})\(.*?\)\1\""
                     r"|(?<![\w])(?:u8|[uUL])?\"(?:\\.|[^\"\\\n])*\"|(?<![\w])'(?:\\.|[^'\\\n])*'", re.S)
PY_LEX = re.compile(r"(?i:[rbfu]{0,2})(?:'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\")"
                    r"|#[^\n]*", re.S)
WORD_RE = re.compile(r"[A-Za-z_]\w*")
NS_RE = re.compile(r"\bnamespace\s+([\w:]+)\s*(?:\{|=)")
TYPE_RE = re.compile(r"\b(?:class|struct|union|enum(?:\s+class|\s+struct)?|concept)\s+(?:\[\[[^\]]*\]\]\s*)?"
                     r"(?:alignas\s*\([^)]*\)\s*)?(\w+)")
USING_RE = re.compile(r"\busing\s+(\w+)\s*=|\btypedef\b[^;]*?\b(\w+)\s*;")
PROTO_RE = re.compile(r"^\s*(?:message|enum|service)\s+(\w+)", re.M)


class Finding:
    def __init__(self, file: str, line: int, kind: str, what: str, detail: str = ""):
        self.file, self.line, self.kind, self.what, self.detail = file, line, kind, what, detail

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.kind} {self.what}" + (f" ({self.detail})" if self.detail else "")


# ---- the checkout -----------------------------------------------------------------------------

def listed_files(root: pathlib.Path) -> list[str]:
    """The checkout's files: tracked, and new ones git does not ignore; a walk without git."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
                             capture_output=True, check=True).stdout.decode()
        return [f for f in out.split("\0") if f and (root / f).exists()]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            dirnames[:] = [d for d in dirnames if not (d.startswith((".git", ".venv", "build", ".deps", "__pycache__"))
                                                       or (rel == "." and d == "models"))]
            files += [os.path.normpath(os.path.join(rel, f)) for f in filenames]
        return files


class Tree:
    def __init__(self, root: pathlib.Path):
        self.root = root
        self.files = set(listed_files(root))
        self.dirs = {str(p) for f in self.files for p in pathlib.PurePosixPath(f).parents if str(p) != "."}
        self.all = sorted(self.files | self.dirs)
        self._headings: dict[str, list[str] | None] = {}

    def exists(self, path: str) -> bool:
        path = path.rstrip("/")
        if any(c in path for c in "*?["):
            pat = re.compile(glob_to_regex(path))
            return any(pat.fullmatch(p) for p in self.all)
        return path in self.files or path in self.dirs

    def text(self, rel: str) -> str:
        return (self.root / rel).read_text(errors="replace")

    def headings(self, rel: str) -> list[str] | None:
        if rel not in self._headings:
            self._headings[rel] = markdown_headings(self.text(rel)) if rel in self.files else None
        return self._headings[rel]


def glob_to_regex(pattern: str) -> str:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return out


def expand_braces(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",") for q in expand_braces(path[:m.start()] + alt + path[m.end():])]


def normalise_cited(path: str) -> str:
    path = re.sub(r"<[^<>]*>", "*", path)
    path = re.sub(r"(^|/)\.\.\.(?=/|$)", r"\1**", path)
    return path


def strip_path_token(token: str) -> str:
    while token and token[-1] in ".-+":
        token = token[:-1]
    return token


# ---- Markdown ---------------------------------------------------------------------------------

def slug(heading: str) -> str:
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def markdown_headings(text: str) -> list[str]:
    heads, fence = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence and re.match(r"#{1,6}\s", line):
            heads.append(line.lstrip("#").strip())
    return heads


def anchors(headings: list[str]) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in headings:
        s = slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def plain(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[`*_\\]", "", text)).strip().lower()


# ---- where citations are: (file, text, offset -> line) -----------------------------------------

class Source:
    """One file's checked text: the whole of a doc, or its comments joined (offsets map to lines)."""

    def __init__(self, rel: str, pieces: list[tuple[int, str]], is_doc: bool):
        self.rel, self.is_doc = rel, is_doc
        self.text = ""
        self.starts: list[tuple[int, int]] = []  # (offset in self.text, line of that piece)
        for line, piece in pieces:
            self.starts.append((len(self.text), line))
            self.text += piece + "\n"

    def line_of(self, offset: int) -> int:
        lo, line = 0, 1
        for start, first_line in self.starts:
            if start > offset:
                break
            lo, line = start, first_line
        return line + self.text.count("\n", lo, offset)


def is_docstring(text: str, m: re.Match) -> bool:
    """A triple-quoted string that opens the module, or a def's or class's body."""
    before = re.sub(r"#[^\n]*", "", text[max(0, m.start() - 4000):m.start()]).rstrip()
    return m.group(0).lstrip("rRuUbBfF").startswith(('"""', "'''")) and (not before or before.endswith(":"))


def comments(text: str, lexer: re.Pattern, comment_prefixes: tuple[str, ...],
             docstrings: bool = False) -> list[tuple[int, str]]:
    pieces = []
    for m in lexer.finditer(text):
        if m.group(0).startswith(comment_prefixes) or (docstrings and is_docstring(text, m)):
            body = m.group(0)
            body = re.sub(r"^\s*(?://+|/\*+|#+)|\*+/$", "", body)
            body = re.sub(r"\n\s*(?:\*(?!/)|//+|#+)?", "\n", body)
            pieces.append((text.count("\n", 0, m.start()) + 1, body))
    # Consecutive line comments form one block, so a citation may wrap from one to the next.
    merged: list[tuple[int, str]] = []
    for line, body in pieces:
        if merged and merged[-1][0] + merged[-1][1].count("\n") + 1 == line:
            merged[-1] = (merged[-1][0], merged[-1][1] + "\n" + body)
        else:
            merged.append((line, body))
    return merged


def code_only(text: str, lexer: re.Pattern) -> str:
    return lexer.sub(" ", text)


def sources(tree: Tree) -> list[Source]:
    out = []
    for rel in sorted(tree.files):
        p = pathlib.PurePosixPath(rel)
        top = p.parts[0]
        if top == "docs" and p.suffix == ".md":
            out.append(Source(rel, [(1, tree.text(rel))], True))
        elif top in CPP_DIRS and p.suffix in CPP_EXT:
            out.append(Source(rel, comments(tree.text(rel), CPP_LEX, ("//", "/*")), False))
        elif top in PY_DIRS and p.suffix == ".py":
            out.append(Source(rel, comments(tree.text(rel), PY_LEX, ("#",), docstrings=True), False))
    return out


# ---- the declared names -----------------------------------------------------------------------

class Declarations:
    def __init__(self, tree: Tree):
        self.scopes: set[str] = set()         # namespaces and types
        self.by_scope: dict[str, set[str]] = {}  # scope name -> words in the code of files declaring it
        for rel in sorted(tree.files):
            p = pathlib.PurePosixPath(rel)
            if p.suffix == ".proto":
                text = tree.text(rel)
                pkg = re.search(r"^\s*package\s+([\w.]+)\s*;", text, re.M)
                if not pkg:
                    continue
                parts = pkg.group(1).split(".")
                declared = set(parts) | set(PROTO_RE.findall(text))
                words = set(WORD_RE.findall(text))
                self._add(declared, parts[-1:] + PROTO_RE.findall(text), words)
                continue
            if p.parts[0] not in DECL_DIRS or p.suffix not in CPP_EXT:
                continue
            code = code_only(tree.text(rel), CPP_LEX)
            namespaces = [part for m in NS_RE.findall(code) for part in m.split("::") if part]
            types = TYPE_RE.findall(code) + [a or b for a, b in USING_RE.findall(code)]
            self._add(set(namespaces) | set(types), namespaces + types, set(WORD_RE.findall(code)))

    def _add(self, declared: set[str], scopes: list[str], words: set[str]) -> None:
        self.scopes |= declared
        for s in set(scopes):
            self.by_scope.setdefault(s, set()).update(words)

    def missing_part(self, parts: list[str]) -> str | None:
        """The first part of fastformer::parts that is not declared, or None."""
        for part in parts[:-1]:
            if part not in self.scopes:
                return part
        last, parent = parts[-1], (parts[-2] if len(parts) > 1 else "fastformer")
        if last in self.scopes or last in self.by_scope.get(parent, ()):
            return None
        return last


# ---- the check --------------------------------------------------------------------------------

def resolve_doc(tree: Tree, src: Source, target: str) -> str | None:
    """A cited .md file as a repository path: from the citing doc's folder, the root, docs/."""
    bases = ([str(pathlib.PurePosixPath(src.rel).parent)] if src.is_doc else []) + ["", "docs"]
    for base in bases:
        rel = os.path.normpath(os.path.join(base, target))
        if rel in tree.files:
            return rel
    return None


def check_source(tree: Tree, decls: Declarations, src: Source) -> list[Finding]:
    found = []
    text = src.text
    for m in PATH_RE.finditer(text):
        cited = normalise_cited(strip_path_token(m.group(1)))  # a :line after it is not in the token
        if not cited or cited.rstrip("/") in TOPS:
            continue
        for path in expand_braces(cited):
            if not tree.exists(path):
                found.append(Finding(src.rel, src.line_of(m.start()), "path", path))
    for m in NAME_RE.finditer(text):
        parts = m.group(1).split("::")[1:]
        missing = decls.missing_part(parts)
        if missing:
            found.append(Finding(src.rel, src.line_of(m.start()), "name", "fastformer::" + "::".join(parts),
                                 f"{missing} is declared nowhere"))
    if src.is_doc:
        base = pathlib.PurePosixPath(src.rel).parent
        for m in LINK_RE.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.\-]*:", target, re.I):
                continue  # https:, mailto:, ...
            path, _, frag = target.partition("#")
            rel = os.path.normpath(os.path.join(str(base), path)) if path else src.rel
            line = src.line_of(m.start())
            if rel.startswith(".."):
                found.append(Finding(src.rel, line, "link", target, "outside the repository"))
            elif not tree.exists(rel):
                found.append(Finding(src.rel, line, "link", target, f"{rel} does not exist"))
            elif frag and rel.endswith(".md") and rel in tree.files:
                if frag.lower() not in anchors(tree.headings(rel) or []):
                    found.append(Finding(src.rel, line, "link", target, f"no heading of {rel} has that anchor"))
    for m in SECTION_RE.finditer(text):
        target, quoted = m.group(1), plain(m.group(2))
        rel = resolve_doc(tree, src, target)
        if rel is None or not quoted:
            continue  # a missing file is the path check's (or not a repository path)
        if not any(quoted in plain(h) for h in tree.headings(rel) or []):
            found.append(Finding(src.rel, src.line_of(m.start()), "section", f'{rel} "{m.group(2)}"',
                                 "no heading there has those words"))
    return found


def read_allowlist(path: pathlib.Path) -> list[tuple[int, str, str, str]]:
    entries = []
    if not path.exists():
        return entries
    for n, line in enumerate(path.read_text().split("\n"), 1):
        body = re.split(r"^#|\s#(?:\s|$)", line, maxsplit=1)[0].strip()
        if not body:
            continue
        citing, _, what = body.partition(" ")
        kind, _, pattern = what.strip().partition(":")
        if kind not in {"path", "link", "section", "name"} or not pattern:
            raise SystemExit(f"{path}:{n}: expected `CITING_FILE_GLOB KIND:WHAT_GLOB  # why`, got {line!r}")
        entries.append((n, citing, kind, pattern))
    return entries


def check_tree(root: pathlib.Path, allowlist: pathlib.Path = ALLOWLIST) -> list[str]:
    tree = Tree(root)
    decls = Declarations(tree)
    findings = [f for src in sources(tree) for f in check_source(tree, decls, src)]
    entries = read_allowlist(allowlist)
    used = set()
    kept = []
    for f in findings:
        hit = [e for e in entries if e[2] == f.kind and fnmatch.fnmatchcase(f.file, e[1])
               and fnmatch.fnmatchcase(f.what, e[3])]
        used.update(e[0] for e in hit)
        if not hit:
            kept.append(str(f))
    try:
        shown = allowlist.relative_to(root)
    except ValueError:
        shown = allowlist
    kept += [f"{shown}:{n}: {citing} {kind}:{pattern} matches nothing now: remove the entry"
             for n, citing, kind, pattern in entries if n not in used]
    return kept


# ---- self-test --------------------------------------------------------------------------------

def self_test() -> list[str]:
    """Citations of what is missing are caught; what exists, run-time paths allowed, passes."""
    files = {
        "server/engine/engine.h": "namespace fastformer::engine {\nclass Engine {};\nint run_it();\n}\n"
                                  "// see docs/design.md and server/engine/{engine.h,gone.cc}\n"
                                  "/* fastformer::engine::Engine, fastformer::engine::Missing */\n"
                                  "const char* s = \"server/in/a/string.h\";  // tests/x/*.py\n",
        "tests/x/check.py": "#!/usr/bin/env python3\n\"\"\"The module's docstring: tools/gone_too.py.\"\"\"\n"
                            "# tools/gone.py and tests/x/check.py:12 and fastformer::rpc::Intake\n"
                            "s = '# server/in/a/string.h'\n\"\"\"docs/in/a/string.md\"\"\"\n\n\n"
                            "def f():\n    \"\"\"A function's: tools/gone_three.py\"\"\"\n",
        "docs/design.md": "# Design\n\n## The layers\n\nSee [ops](ops.md#nothing), [layers](#the-layers), "
                          "models/official (run time), docs/gone.md,\n`design.md`, \"The layers\" and "
                          "design.md, \"No such part\"; fastformer::engine::run_it.\n\n```sh\n# not a heading\n```\n",
        "docs/ops.md": "# Ops\n",
        "docs/sub/log.md": "[up](../design.md#the-layers) [bad](../design.md#nope)\n",
    }
    allow = "docs/* path:models/*  # made at run time\n"
    want = {
        "server/engine/engine.h:5: path server/engine/gone.cc",
        "server/engine/engine.h:6: name fastformer::engine::Missing (Missing is declared nowhere)",
        "tests/x/check.py:2: path tools/gone_too.py",
        "tests/x/check.py:3: path tools/gone.py",
        "tests/x/check.py:3: name fastformer::rpc::Intake (rpc is declared nowhere)",
        "tests/x/check.py:9: path tools/gone_three.py",
        "docs/design.md:5: link ops.md#nothing (no heading of docs/ops.md has that anchor)",
        "docs/design.md:5: path docs/gone.md",
        "docs/design.md:6: section docs/design.md \"No such part\" (no heading there has those words)",
        "docs/sub/log.md:1: link ../design.md#nope (no heading of docs/design.md has that anchor)",
    }
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        (root / "allow.txt").write_text(allow + "docs/none.md path:nothing  # stale\n")
        got = set(check_tree(root, root / "allow.txt"))
    stale = {"allow.txt:2: docs/none.md path:nothing matches nothing now: remove the entry"}
    errors = [f"not caught: {w}" for w in sorted((want | stale) - got)]
    errors += [f"wrongly reported: {g}" for g in sorted(got - want - stale)]
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=pathlib.Path, help="the repository to check")
    ap.add_argument("--self-test", action="store_true", help="check that missing citations are caught")
    args = ap.parse_args()
    if args.self_test:
        errors = self_test()
        if errors:
            print("check_references.py --self-test:\n  " + "\n  ".join(errors))
            return 1
        print("self-test: every planted citation of something missing was caught")
        return 0
    if not args.root:
        ap.error("--root or --self-test")
    root = args.root.resolve()
    errors = check_tree(root)
    if errors:
        print(f"{len(errors)} citation(s) of something that does not exist "
              f"(mend the citation, or allow it in {ALLOWLIST.relative_to(root) if ALLOWLIST.is_relative_to(root) else ALLOWLIST} with why):")
        print("\n".join("  " + e for e in errors))
        return 1
    print("every cited path, section and fastformer:: name exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
