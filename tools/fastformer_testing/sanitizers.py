"""A sanitizer's report in a server's log fails the test.

make test-asan (and test-tsan-e2e) run the suites against the sanitized builds (mk/sanitizers.mk).
halt_on_error stops a server at its first report, but a report at exit (a leak) only changes its
exit code, and a server's exit code is no test's answer: so every server's log is searched when
it stops (ServerProcess.stop), and, in tests/e2e, after every test for the shared servers too.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from .outcome import fail

# What ASan, LSan, UBSan and TSan print when they find something.
SANITIZER_REPORT = re.compile(r"^(==\d+==ERROR: \w+Sanitizer|WARNING: ThreadSanitizer|\S+:\d+:\d+: runtime error: )",
                              re.M)


def report_excerpt(text: str) -> Optional[str]:
    """The first sanitizer report in `text` (from a little before it), or None."""
    m = SANITIZER_REPORT.search(text)
    return text[max(0, m.start() - 200):][:12000] if m else None


def fail_on_sanitizer_reports(servers: Iterable):
    """Fails the test when a server's log (ServerProcess: log_text(), title, log_path) holds a
    sanitizer report; each server's report fails one test only."""
    found = []
    for srv in servers:
        if getattr(srv, "sanitizer_reported", False):
            continue
        excerpt = report_excerpt(srv.log_text())
        if excerpt is not None:
            srv.sanitizer_reported = True
            found.append(f"{srv.title} log {srv.log_path}:\n{excerpt}")
    if found:
        fail("sanitizer report in the server log\n" + "\n\n".join(found))
