"""The server's flags as `fastformer-server --help` prints them (CLI11), and checks of the
environment variables, ports and values a deployment file gives the server against them.

  flags = parse_help(text)            # {"listen": Flag(name="listen", env="FASTFORMER_LISTEN", default="0.0.0.0:50051", ...)}
  effective(flags, env)["listen"]     # the value the server would use with that environment
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional

# "  --listen TEXT=0.0.0.0:50051 (Env:FASTFORMER_LISTEN)", "  --allow-tf32 (Env:FASTFORMER_ALLOW_TF32)",
# "  --model-dir TEXT REQUIRED (Env:FASTFORMER_MODEL_DIR)", "  --backend TEXT:{auto,cpu,cuda}=auto (Env:...)"
_OPTION_RE = re.compile(r"^\s+(?:-\w,)?--(?P<name>[A-Za-z0-9][\w-]*)(?P<rest>[^\n]*?)\(Env:(?P<env>\w+)\)")


@dataclass
class Flag:
    name: str
    env: str
    type: str                 # TEXT, INT, FLOAT, or "" for a switch
    default: Optional[str]    # None when --help shows none
    choices: Optional[List[str]]
    required: bool


def parse_help(text: str) -> Dict[str, Flag]:
    flags: Dict[str, Flag] = {}
    for line in text.splitlines():
        m = _OPTION_RE.match(line)
        if not m:
            continue
        rest = m.group("rest").split()
        spec = rest[0] if rest and rest[0] != "REQUIRED" else ""
        typ, _, default = spec.partition("=")
        choices = None
        cm = re.search(r"\{([^}]*)\}", typ)
        if cm:
            choices = cm.group(1).split(",")
        base = typ.split(":")[0]
        flags[m.group("name")] = Flag(m.group("name"), m.group("env"), base, default if "=" in spec else None,
                                      choices, "REQUIRED" in rest)
    return flags


def env_names(flags: Dict[str, Flag]) -> Dict[str, str]:
    """{env var name: flag name}"""
    return {f.env: f.name for f in flags.values()}


def unknown_env(flags: Dict[str, Flag], env: Dict[str, str]) -> List[str]:
    """FASTFORMER_* names in env that the server does not declare (a typo is silently ignored by it)."""
    known = env_names(flags)
    return sorted(k for k in env if k.startswith("FASTFORMER_") and k not in known)


def effective(flags: Dict[str, Flag], env: Dict[str, str]) -> Dict[str, Optional[str]]:
    """{flag name: value} the server would run with: the env var's value where set, else the default."""
    by_env = env_names(flags)
    out = {name: f.default for name, f in flags.items()}
    for k, v in env.items():
        if k in by_env:
            out[by_env[k]] = str(v)
    return out


def port_of(address: str) -> int:
    """The port of host:port (also [v6]:port)."""
    m = re.fullmatch(r"(?:\[[^\]]*\]|[^:\[\]]*):(\d+)", address.strip())
    if not m:
        raise ValueError(f"not a host:port address: {address!r}")
    return int(m.group(1))


def compose_value(value) -> str:
    """A compose environment value with ${VAR:-default} / ${VAR-default} interpolated to its default
    (the value the stack runs with when the caller sets nothing); plain ${VAR} becomes ''."""
    def sub(m):
        return m.group("default") or ""
    return re.sub(r"\$\{(?P<var>\w+)(?::?[-?](?P<default>[^}]*))?\}", sub, str(value))


def duration_seconds(text) -> float:
    """A compose / Go duration ("40s", "1m30s", "500ms") or a number of seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    total, pos, s = 0.0, 0, str(text).strip()
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"not a duration: {text!r}")
    return total
