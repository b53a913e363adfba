"""Load before unload, and nothing lost: version swaps under load (fastformer-loadgen in open
loop at about 80% of saturation, a checker verifying every answer against the reference of the
version that says it computed it), and an unload while requests are in flight.

The swap test prints its figures and, when $FASTFORMER_SWAP_REPORT names a file, writes them
there as JSON: each load's time to ready (the RepositoryModelLoad call, and the log's own
"READY in S s (load L s, warm-up W s)"), the checker's p99 during the swaps against its p99 in a
quiet phase before them (same load, no swap), and the server's peak memory during the swaps
(VmRSS sampled from /proc every 20 ms, and VmHWM). $FASTFORMER_SWAP_COUNT sets the number of
swaps (default 10; test-tsan runs fewer under the slower TSan server)."""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time

import tritonclient.grpc as grpcclient

from conftest import (LoadgenProcess, assert_no_loadgen_errors, desc, grpc_error, ids_input, infer, matches,
                      percentile, response_model, run_loadgen)

SWAPS = int(os.environ.get("FASTFORMER_SWAP_COUNT", "10"))
LENGTHS = "uniform:16:128"  # fastformer-loadgen's requests (one sequence each)
QUIET_S = 5.0               # the phase before the swaps: the same load, no swap
READY_LINE = re.compile(r"model embed version (\d+) READY in ([0-9.]+) s \(load ([0-9.]+) s, warm-up ([0-9.]+) s\)")


def source_of(sources, version: int):
    """Version k holds version 1's weights when k is odd, version 2's when even."""
    return sources.v1 if version % 2 else sources.v2


class Checker(threading.Thread):
    """Sends ModelInfer("embed", version "") one at a time, continuously, and records each
    answer: (sent, answered, version, name, matches its version's reference) or the error."""

    def __init__(self, srv, sources, seqs, pause_s=0.002):
        super().__init__(daemon=True)
        self.srv, self.sources, self.seqs, self.pause_s = srv, sources, seqs, pause_s
        self.records = []   # (t_sent, t_answered, version, model_name, ok)
        self.errors = []    # (t_sent, t_answered, message)
        self.stop_event = threading.Event()

    def run(self):
        c = self.srv.grpc()
        i = 0
        try:
            while not self.stop_event.is_set():
                seq = self.seqs[i % len(self.seqs)]
                i += 1
                t0 = time.monotonic()
                try:
                    result = infer(c, grpcclient, "embed", [seq])
                except Exception as e:  # every failure is a finding
                    self.errors.append((t0, time.monotonic(), repr(e)))
                    continue
                t1 = time.monotonic()
                name, version = response_model(result)
                try:
                    v = int(version)
                    ok = matches(result, source_of(self.sources, v), [seq])
                except ValueError:
                    v, ok = -1, False
                self.records.append((t0, t1, v, name, ok))
                time.sleep(self.pause_s)
        finally:
            c.close()

    def stop(self):
        self.stop_event.set()
        self.join(timeout=30)
        assert not self.is_alive(), "the checker's request hangs"

    def latencies(self, t_from, t_to):
        return [t1 - t0 for t0, t1, *_ in self.records if t_from <= t0 < t_to]


class RssSampler(threading.Thread):
    def __init__(self, srv, every_s=0.02):
        super().__init__(daemon=True)
        self.srv, self.every_s = srv, every_s
        self.samples = []  # (t, VmRSS KiB)
        self.stop_event = threading.Event()

    def run(self):
        while not self.stop_event.is_set():
            try:
                self.samples.append((time.monotonic(), self.srv.rss_kib()[0]))
            except OSError:
                return
            time.sleep(self.every_s)

    def peak(self, t_from, t_to):
        return max((r for t, r in self.samples if t_from <= t < t_to), default=0)

    def stop(self):
        self.stop_event.set()
        self.join(timeout=5)


def test_hot_swap_under_load(start, repo, sources):
    """Ten swaps of embed (version N -> N+1, weights alternating between two seeds) in explicit
    mode, policy latest 1, each by RepositoryModelLoad after the new version directory appears,
    under fastformer-loadgen in open loop at 80% of the saturation rate measured just before.
    No request fails (loadgen and checker), every answer carries the version that computed it
    and equals that version's reference, versions never go back, a request sent after a load
    returned is answered by the new version, and every old version ends unloaded."""
    repo.add("embed", 1, sources.v1)
    # one engine thread: the load generator and the checker share the 2-core CI machine with it
    srv = start(repo, model_control_mode="explicit", load_model="embed", threads=1)
    seqs = sources.v1.seqs([8, 16, 24, 32, 48, 64, 12, 40])
    for s in seqs:  # the references of both weight sets, computed before the clock starts
        sources.v1.reference(s)
        sources.v2.reference(s)
    m = READY_LINE.search(srv.log_text())
    assert m, f"no 'model embed version 1 READY in ...' line in the log\n{srv.log_tail()}"
    start_ready_s = float(m.group(2))
    gap_s = max(1.0, 3 * start_ready_s + 0.3)  # between swap starts, from what the first load took

    checker = Checker(srv, sources, seqs)
    rss = RssSampler(srv)
    checker.start()
    rss.start()
    loadgen = None
    try:
        # saturation, with the checker running (it takes its share of the server too)
        sat = run_loadgen(srv, "--concurrency", 8, "--lengths", LENGTHS, "--warmup", 0.5, "--duration", 3)[-1]
        assert_no_loadgen_errors(sat, "the saturation run")
        rate = round(0.8 * sat["requests_per_second"], 1)
        assert rate > 0, sat

        warmup_s, tail_s = 1.0, 3.0
        duration_s = QUIET_S + SWAPS * gap_s + tail_s
        t_launch = time.monotonic()
        loadgen = LoadgenProcess(srv, "--rate", rate, "--lengths", LENGTHS, "--warmup", warmup_s,
                                 "--duration", round(duration_s, 1))
        t_quiet = t_launch + warmup_s + 0.3
        t_swaps = t_quiet + QUIET_S
        t_load_end = t_launch + warmup_s + duration_s
        time.sleep(max(0.0, t_swaps - time.monotonic()))

        c = srv.grpc()
        swaps = []  # (version, t_call, t_return)
        try:
            for i in range(SWAPS):
                version = i + 2
                time.sleep(max(0.0, t_swaps + i * gap_s - time.monotonic()))
                repo.add("embed", version, source_of(sources, version))
                t0 = time.monotonic()
                c.load_model("embed")
                t1 = time.monotonic()
                swaps.append((version, t0, t1))
                index, _ = srv.index(c)
                assert index[("embed", str(version))][0] == "READY", (version, index)
                assert c.is_model_ready("embed", str(version))
        finally:
            c.close()
        t_swaps_end = time.monotonic()
        assert loadgen.proc.poll() is None and t_swaps_end < t_load_end, \
            f"the swaps outlasted the load: they ended {t_swaps_end - t_load_end:.1f} s after it (loads took " \
            f"{[round(t1 - t0, 3) for _, t0, t1 in swaps]} s)"
        step = loadgen.result(timeout=duration_s + 60)[-1]
        loadgen = None
    finally:
        if loadgen:
            loadgen.kill()
        checker.stop()
        rss.stop()
    _, vmhwm = srv.rss_kib()

    # ---- nothing lost
    assert_no_loadgen_errors(step, "fastformer-loadgen during the swaps")
    assert not checker.errors, f"{len(checker.errors)} checker requests failed, e.g. {checker.errors[:3]}"
    bad = [r for r in checker.records if not r[4] or r[3] != "embed"]
    assert not bad, f"{len(bad)} answers differ from their version's reference or name another model, " \
                    f"e.g. {bad[:3]}"
    versions = [r[2] for r in sorted(checker.records)]
    back = [(a, b) for a, b in zip(versions, versions[1:]) if b < a]
    assert not back, f"a later request was answered by an older version: {back[:5]}"
    for version, _, t_return in swaps:
        late = [r for r in checker.records if r[0] > t_return and r[2] < version]
        assert not late, f"sent after load of version {version} returned, answered by {late[0][2]}"
        assert any(r[2] == version for r in checker.records), f"no checker answer came from version {version}"
    final = SWAPS + 1
    srv.wait_for(lambda: all(srv.index()[0][("embed", str(v))] == ("UNAVAILABLE", "unloaded") for v in range(1, final)),
                 "every replaced version unloaded", timeout=10)
    assert srv.index()[0][("embed", str(final))][0] == "READY"

    # ---- the figures
    log_ready = {int(m.group(1)): [float(m.group(k)) for k in (2, 3, 4)] for m in READY_LINE.finditer(srv.log_text())}
    in_loads = [lat for _, t0, t1 in swaps for lat in checker.latencies(t0, t1 + 0.1)]
    report = {
        "swaps": SWAPS,
        "saturation_requests_per_second": sat["requests_per_second"],
        "rate_requests_per_second": rate,
        "loadgen": {"requests": step["requests"], "succeeded": step["succeeded"], "errors": step["errors"],
                    "latency_ms": step["latency_ms"]},
        "time_to_ready_s": [round(t1 - t0, 4) for _, t0, t1 in swaps],
        "log_ready_s": {str(v): {"ready": r[0], "load": r[1], "warm_up": r[2]} for v, r in sorted(log_ready.items())},
        "checker": {
            "answers": len(checker.records),
            "p50_ms_quiet": 1e3 * percentile(checker.latencies(t_quiet, t_swaps), 50),
            "p99_ms_quiet": 1e3 * percentile(checker.latencies(t_quiet, t_swaps), 99),
            "answers_quiet": len(checker.latencies(t_quiet, t_swaps)),
            "p50_ms_swaps": 1e3 * percentile(checker.latencies(t_swaps, t_swaps_end), 50),
            "p99_ms_swaps": 1e3 * percentile(checker.latencies(t_swaps, t_swaps_end), 99),
            "answers_swaps": len(checker.latencies(t_swaps, t_swaps_end)),
            "p99_ms_during_loads": 1e3 * percentile(in_loads, 99),
            "answers_during_loads": len(in_loads),
        },
        "rss_kib": {"quiet_peak": rss.peak(t_quiet, t_swaps), "swaps_peak": rss.peak(t_swaps, t_swaps_end + 0.5),
                    "vmhwm_end": vmhwm},
    }
    print("hot swap figures:", json.dumps(report, indent=1))
    if path := os.environ.get("FASTFORMER_SWAP_REPORT"):
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")


# ----------------------------------------------------------------------------- unload in flight


def test_unload_while_requests_are_in_flight(start, repo, sources):
    """Requests admitted to embed before its unload all complete OK, and the unload returns only
    after the last of them; requests sent while it is unloading either complete OK or fail cleanly
    (UNAVAILABLE / NOT_FOUND naming embed); nothing hangs; classify serves throughout."""
    repo.add("embed", 1, sources.v1)
    repo.add("classify", 1, sources.classify)
    # One request a batch (two sequences of 300 tokens, batches of at most 1024 tokens), and each
    # batch of them held STALL_MS before its compute (the server's test-only fault injection:
    # sequences starting with token STALL_TOKEN): the admitted requests stay queued and running
    # for about a second, whatever the machine's speed.
    stall_token, stall_ms = 7, 40
    srv = start(repo, model_control_mode="explicit", load_model=["embed", "classify"], threads=1,
                max_batch_tokens=1024,
                env_extra={"FASTFORMER_TEST_FAULTS": f"stall_first_token={stall_token}:{stall_ms}"})
    n_admitted, n_during = 24, 12
    base = sources.v1.seqs([299, 299])
    seqs = [[[stall_token] + s for s in base] for _ in range(n_admitted + n_during)]
    done = {}  # i -> (t, result, error)
    all_done = threading.Condition()

    def callback(i, result, error):
        with all_done:
            done[i] = (time.monotonic(), result, error)
            all_done.notify_all()

    c = srv.grpc()
    try:
        for i in range(n_admitted):
            c.async_infer("embed", _inputs(seqs[i]), functools.partial(callback, i),
                          outputs=[grpcclient.InferRequestedOutput("embedding")])
        srv.wait_for(lambda: srv.metric("fastformer_inflight_requests") >= n_admitted or len(done) == n_admitted,
                     "the requests admitted", timeout=20, interval=0.002)
        time.sleep(0.02)  # the gauge counts a call just before its model lookup: let the last one finish it
        unloaded = {}

        def unload():
            u = srv.grpc()
            try:
                unloaded["t0"] = time.monotonic()
                u.unload_model("embed")
            except Exception as e:
                unloaded["error"] = e
            finally:
                unloaded["t1"] = time.monotonic()
                u.close()

        t = threading.Thread(target=unload)
        t.start()
        while "t0" not in unloaded:
            time.sleep(0.001)
        finished_before_unload = sum(1 for i in list(done) if done[i][0] < unloaded["t0"])
        for i in range(n_admitted, n_admitted + n_during):
            c.async_infer("embed", _inputs(seqs[i]), functools.partial(callback, i),
                          outputs=[grpcclient.InferRequestedOutput("embedding")])
            time.sleep(0.005)
        cseqs = sources.classify.seqs([10])
        result = infer(c, grpcclient, "classify", cseqs)  # another model, unaffected
        assert response_model(result) == ("classify", "1")
        t.join(timeout=60)
        assert not t.is_alive(), f"RepositoryModelUnload did not return within 60 s\n{srv.log_tail()}"
        assert "error" not in unloaded, unloaded.get("error")
        with all_done:
            assert all_done.wait_for(lambda: len(done) == n_admitted + n_during, timeout=60), \
                f"{n_admitted + n_during - len(done)} requests never answered\n{srv.log_tail()}"
    finally:
        c.close()

    assert finished_before_unload < n_admitted, \
        "every request finished before the unload began: the test did not test anything (make them larger)"
    for i in range(n_admitted):
        t_done, result, error = done[i]
        assert error is None, f"admitted request {i} failed: {error}"
        assert response_model(result) == ("embed", "1")
        assert matches(result, sources.v1, seqs[i]), f"admitted request {i}: not version 1's reference"
        assert t_done <= unloaded["t1"], f"the unload returned {t_done - unloaded['t1']:.3f} s before request {i} ended"
    outcomes = {"ok": 0, "refused": 0}
    for i in range(n_admitted, n_admitted + n_during):
        _, result, error = done[i]
        if error is None:
            assert matches(result, sources.v1, seqs[i]), f"request {i} during the unload: wrong values"
            outcomes["ok"] += 1
        else:
            assert error.status() in ("StatusCode.UNAVAILABLE", "StatusCode.NOT_FOUND"), desc(error)
            assert "embed" in error.message(), desc(error)
            outcomes["refused"] += 1
    print(f"unload in flight: {n_admitted - finished_before_unload} of {n_admitted} admitted requests still running "
          f"at the unload; during it {outcomes}; unload took {unloaded['t1'] - unloaded['t0']:.3f} s")

    index, _ = srv.index()
    assert index[("embed", "1")] == ("UNAVAILABLE", "unloaded"), index
    c = srv.grpc()
    try:
        e = grpc_error(infer, c, grpcclient, "embed", seqs[0])
        assert e.status() == "StatusCode.UNAVAILABLE" and "embed" in e.message(), desc(e)
    finally:
        c.close()


def _inputs(seqs):
    return ids_input(grpcclient, seqs)
