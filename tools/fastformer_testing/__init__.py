"""Python test support for the pytest suites (tests/README.md, "Python test support"): what every
suite that runs fastformer-server needs, written once. A suite's conftest.py puts tests/pysupport
on sys.path and imports from here; its own models and protocol clients stay in the conftest.

  binaries       REPO, bin_dir(), binary(name): the built programs ($FASTFORMER_BIN_DIR, default
                 build/bin; a missing one fails the test); child_env(), die_with_parent()
  server_ports   free loopback ports: every listener binds 127.0.0.1:0 (ANY) and its port is read
                 from the log (ServerPorts, wait_for_ports); held_port() for a refused address
  server         ServerProcess: one server process (start, wait until ready, log, stop with the
                 sanitizer check); server_opts(), stop_all(), scrape_metrics()
  sanitizers     SANITIZER_REPORT, the regex of a sanitizer's report; fail_on_sanitizer_reports()
  golden_answers answers against a golden file (issue 33's "behaviour unchanged")
  cpu_features   cpu_flags(), has_bf16_gemms(): what --dtype auto should pick on this CPU, read
                 from /proc/cpuinfo and ONEDNN_MAX_CPU_ISA (not from the engine)
"""

from .binaries import REPO, TOOLS, bin_dir, binary, child_env, die_with_parent
from .sanitizers import SANITIZER_REPORT, fail_on_sanitizer_reports, report_excerpt
from .server import ServerProcess, scrape_metrics, server_opts, stop_all

__all__ = ["REPO", "TOOLS", "bin_dir", "binary", "child_env", "die_with_parent", "SANITIZER_REPORT",
           "fail_on_sanitizer_reports", "report_excerpt", "ServerProcess", "scrape_metrics", "server_opts",
           "stop_all"]
