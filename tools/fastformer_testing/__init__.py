"""The Python harness of the tests and the tools (tests/README.md, "Python test support"): what
every pytest suite and every tools/ script that runs fastformer-server needs, written once.
Standard library only, pytest included only where a test runs it (outcome.py): the GPU check
runs the tools under a lent machine's bare Python. It lives in tools/, so a tool run as a script
imports it as it is; a suite's conftest.py puts tools/ on sys.path (binaries.use_tools()) and
imports from here; its own models and protocol clients stay in the conftest.

  binaries       REPO, bin_dir(), binary(name, directory): the built programs ($FASTFORMER_BIN_DIR,
                 default build/bin; a missing one fails the test); child_env(), die_with_parent()
  server_ports   loopback ports: every test listener binds 127.0.0.1:0 (ANY) and its port is read
                 from the log (ServerPorts, wait_for_ports); held_port() for a refused address;
                 free_port() for a tool's fixed port
  server         ServerProcess: one server process (start, wait until ready: wait_for,
                 wait_grpc_health, wait_http_ready; log; stop with the sanitizer check);
                 server_opts(), stop_all(), scrape_metrics()
  outcome        fail(), skip(): pytest's under pytest, HarnessError (a RuntimeError) elsewhere
  sanitizers     SANITIZER_REPORT, the regex of a sanitizer's report; fail_on_sanitizer_reports()
  golden_answers answers against a golden file (issue 33's "behaviour unchanged"); pytest only
  cpu_features   cpu_flags(), has_bf16_gemms(): what --dtype auto should pick on this CPU, read
                 from /proc/cpuinfo and ONEDNN_MAX_CPU_ISA (not from the engine)
  bench          the bench scenarios' runner (import fastformer_testing.bench): Scenario, Runner
                 (warm-up, rounds alternating the sides, medians), the JSON record with machine()
"""

from .binaries import REPO, TOOLS, bin_dir, binary, child_env, die_with_parent, use_tools
from .outcome import HarnessError
from .sanitizers import SANITIZER_REPORT, fail_on_sanitizer_reports, report_excerpt
from .server import ServerProcess, scrape_metrics, server_opts, stop_all
from .server_ports import free_port

__all__ = ["REPO", "TOOLS", "bin_dir", "binary", "child_env", "die_with_parent", "use_tools", "HarnessError",
           "SANITIZER_REPORT", "fail_on_sanitizer_reports", "report_excerpt", "ServerProcess", "scrape_metrics",
           "server_opts", "stop_all", "free_port"]
