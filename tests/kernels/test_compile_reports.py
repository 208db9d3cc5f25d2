"""The machinery behind the sm_90a compile checks (``compile_reports``), with fake compiles: a report on disk is
reused, a new fingerprint or spec compiles afresh, concurrent requesters of one build (threads, processes) compile
it once, a failed compile names the case and is not kept, and a compile worker that dies, hangs or prints stays
a clear failure naming the case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import cute_compile_reports as ccr
import pytest
from compile_reports import CompileWorker, ReportError, ReportStore, report_dir

HERE = Path(__file__).resolve().parent
SPEC = {"case": ["fwd", 128, 128, "relu"], "build": "fwd", "args": {"head_dim": 128, "activation": "relu"}}


class Counting:
    """A fake compile: the report names the spec; counts its calls."""

    def __init__(self, sleep_s: float = 0.0, fail: Exception | None = None):
        self.calls = 0
        self.sleep_s = sleep_s
        self.fail = fail
        self._lock = threading.Lock()

    def __call__(self, spec: dict) -> dict:
        with self._lock:
            self.calls += 1
        time.sleep(self.sleep_s)
        if self.fail is not None:
            raise self.fail
        return {"wgmma": 40, "case": spec["case"]}


def never(spec):
    raise AssertionError("compiled a build whose report was on disk")


def test_report_on_disk_is_reused_without_compiling(tmp_path):
    compile_fn = Counting()
    first = ReportStore(tmp_path / "fp", compile_fn).report(SPEC)
    assert first == ReportStore(tmp_path / "fp", compile_fn).report(SPEC) == {"wgmma": 40, "case": SPEC["case"]}
    assert compile_fn.calls == 1
    # a later run (a fresh store) reads it back; tuples in the spec name the same build as lists
    again = ReportStore(tmp_path / "fp", never).report({**SPEC, "case": tuple(SPEC["case"])})
    assert again == first
    # written under a temporary name and renamed: nothing else left beside the report and its lock
    assert sorted(p.suffix for p in (tmp_path / "fp").iterdir()) == [".json", ".lock"]


def test_new_fingerprint_or_spec_compiles_afresh(tmp_path):
    compile_fn = Counting()
    ReportStore(tmp_path / "fp_a", compile_fn).report(SPEC)
    ReportStore(tmp_path / "fp_b", compile_fn).report(SPEC)
    assert compile_fn.calls == 2
    other = {**SPEC, "args": {**SPEC["args"], "causal": True}}
    ReportStore(tmp_path / "fp_a", compile_fn).report(other)
    assert compile_fn.calls == 3


def test_report_compiled_while_the_sources_changed_is_not_kept(tmp_path):
    compile_fn = Counting()
    assert ReportStore(tmp_path / "fp", compile_fn, still_current=lambda: False).report(SPEC)["wgmma"] == 40
    assert not list((tmp_path / "fp").glob("*.json"))
    ReportStore(tmp_path / "fp", compile_fn).report(SPEC)
    assert compile_fn.calls == 2


def test_unreadable_or_foreign_file_is_compiled_again(tmp_path):
    compile_fn = Counting()
    store = ReportStore(tmp_path / "fp", compile_fn)
    path = store.path(SPEC)
    path.parent.mkdir(parents=True)
    path.write_text('{"spec": ')  # a torn file
    assert store.report(SPEC)["wgmma"] == 40
    path.write_text(json.dumps({"spec": {**SPEC, "build": "bwd"}, "report": {"wgmma": 1}}))
    assert ReportStore(tmp_path / "fp", compile_fn).report(SPEC)["wgmma"] == 40
    assert compile_fn.calls == 2


def test_fingerprint_follows_kernel_sources_and_measuring_code(tmp_path, monkeypatch):
    from gdpa_inductor.kernels.cute import compile_cache

    monkeypatch.setattr(compile_cache, "source_fingerprint", lambda: "kernels-a")
    base = ccr.report_fingerprint()
    assert ccr.report_fingerprint() == base
    monkeypatch.setattr(compile_cache, "source_fingerprint", lambda: "kernels-b")
    assert ccr.report_fingerprint() != base
    monkeypatch.setattr(compile_cache, "source_fingerprint", lambda: "kernels-a")
    edited = tmp_path / "cute_compile_reports.py"
    edited.write_bytes(Path(ccr.__file__).read_bytes().replace(b"wgmma=ptx.count", b"wgmma=1 + ptx.count"))
    monkeypatch.setattr(ccr, "__file__", str(edited))
    assert ccr.report_fingerprint() != base


def test_report_dir_is_the_runs_without_a_disk_cache(tmp_path):
    cache, run = tmp_path / "cache", tmp_path / "run"
    assert report_dir(str(cache), run, "fp") == cache / "compile_checks" / "fp"
    assert report_dir("", run, "fp") == run / "compile_checks" / "fp"
    (tmp_path / "a_file").touch()  # a cache folder that cannot be made
    assert report_dir(str(tmp_path / "a_file"), run, "fp") == run / "compile_checks" / "fp"
    assert (run / "compile_checks" / "fp").is_dir()


def test_concurrent_threads_compile_once(tmp_path):
    compile_fn = Counting(sleep_s=0.3)
    barrier = threading.Barrier(4)
    got = []

    def request():
        store = ReportStore(tmp_path / "fp", compile_fn)  # one store each, as separate workers have
        barrier.wait()
        got.append(store.report(SPEC))

    threads = [threading.Thread(target=request) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert compile_fn.calls == 1 and len(got) == 4 and all(r == got[0] for r in got)


REQUESTER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from compile_reports import ReportStore
    directory, calls, go = sys.argv[1:4]
    def compile_fn(spec):
        with open(calls, "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(1.0)
        return {"by": os.getpid()}
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    print(json.dumps(ReportStore(directory, compile_fn).report(json.loads(sys.argv[4]))), flush=True)
""")


def test_concurrent_processes_compile_once(tmp_path):
    calls, go = tmp_path / "calls", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, "-c", REQUESTER, str(tmp_path / "fp"), str(calls), str(go),
                               json.dumps(SPEC)], stdout=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.touch()  # all three ask at once; one compiles, the others wait for it on the lock
        answers = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs)
    assert len(calls.read_text().split()) == 1
    assert answers[0] == answers[1] == answers[2]


def test_failed_compile_names_the_case_and_is_not_kept(tmp_path):
    failing = Counting(fail=ValueError("ptxas ran out of registers"))
    store = ReportStore(tmp_path / "fp", failing)
    with pytest.raises(ReportError, match=r"fwd-128-128-relu: compile failed: ValueError: ptxas ran out"):
        store.report(SPEC)
    # the other tests needing it get the error without a second compile; nothing is written
    with pytest.raises(ReportError, match="fwd-128-128-relu"):
        store.report(SPEC)
    assert failing.calls == 1
    assert not list((tmp_path / "fp").glob("*.json"))
    # the next run compiles it again
    working = Counting()
    assert ReportStore(tmp_path / "fp", working).report(SPEC)["wgmma"] == 40
    assert working.calls == 1


def test_lock_wait_has_a_deadline(tmp_path):
    import fcntl

    store = ReportStore(tmp_path / "fp", never, lock_timeout_s=0.3)
    (tmp_path / "fp").mkdir()
    with open(store.path(SPEC).with_suffix(".lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        start = time.monotonic()
        with pytest.raises(ReportError, match="fwd-128-128-relu: waited 0 s for another process"):
            store.report(SPEC)
        assert time.monotonic() - start < 5


# --- the compile worker, with fake workers (no cutlass-dsl) ---

FAKE_WORKER = textwrap.dedent("""
    import os, sys, time
    from compile_reports import serve
    def compile_fn(spec, workdir):
        what = spec["case"][-1]
        print("some chatter on stdout", flush=True)
        if what == "die":
            print("the worker fell over", file=sys.stderr, flush=True)
            os._exit(3)
        if what == "hang":
            import subprocess
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            with open(spec["args"]["child_pid_file"], "w") as f:
                f.write(str(child.pid))
            time.sleep(600)
        if what == "raise":
            raise RuntimeError("no such activation")
        return {"pid": os.getpid(), "case": spec["case"]}
    serve(compile_fn)
""")


def fake_worker(**kwargs) -> CompileWorker:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    return CompileWorker(argv=[sys.executable, "-c", FAKE_WORKER], env=env, **kwargs)


def spec(what: str) -> dict:
    return {"case": ["fwd", 64, 64, what], "build": "fwd", "args": {}}


def test_worker_answers_one_spec_at_a_time_and_prints_only_answers():
    worker = fake_worker()
    try:
        first, second = worker.compile(spec("relu")), worker.compile(spec("silu"))
    finally:
        worker.close()
    assert first["case"] == ["fwd", 64, 64, "relu"] and second["case"] == ["fwd", 64, 64, "silu"]
    assert first["pid"] == second["pid"]  # one process, its imports paid once


def test_worker_that_dies_fails_naming_the_case_and_is_restarted():
    worker = fake_worker()
    try:
        before = worker.compile(spec("relu"))["pid"]
        with pytest.raises(ReportError, match=r"(?s)fwd-64-64-die: the compile worker exited \(status 3\).*fell over"):
            worker.compile(spec("die"))
        assert worker.compile(spec("relu"))["pid"] != before
    finally:
        worker.close()


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_worker_that_hangs_is_killed_at_the_deadline_with_its_children(tmp_path):
    worker = fake_worker(case_timeout_s=1.0)
    hang = {**spec("hang"), "args": {"child_pid_file": str(tmp_path / "child")}}
    try:
        start = time.monotonic()
        with pytest.raises(ReportError, match=r"fwd-64-64-hang: no answer after 1 s compiling \(worker killed\)"):
            worker.compile(hang)
        assert time.monotonic() - start < 10
        child = int((tmp_path / "child").read_text())
        deadline = time.monotonic() + 5
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(child), "the worker's own subprocess outlived it"
        assert worker.compile(spec("relu"))["case"][-1] == "relu"
    finally:
        worker.close()


def test_worker_that_never_starts_fails_naming_the_case():
    worker = CompileWorker(argv=[sys.executable, "-c", "import time; time.sleep(600)"], start_timeout_s=1.0)
    with pytest.raises(ReportError, match="fwd-64-64-relu: no answer after 1 s starting the compile worker"):
        worker.compile(spec("relu"))
    worker = CompileWorker(argv=[sys.executable, "-c", "import sys; print('no module', file=sys.stderr)"])
    with pytest.raises(ReportError, match=r"(?s)fwd-64-64-relu: the compile worker exited \(status 0\).*no module"):
        worker.compile(spec("relu"))
    # the next builds fail at once, naming their case and the first failure
    start = time.monotonic()
    with pytest.raises(ReportError, match=r"(?s)fwd-64-64-silu: the compile worker could not start.*no module"):
        worker.compile(spec("silu"))
    assert time.monotonic() - start < 1


def test_compile_error_in_the_worker_names_the_case_and_keeps_the_worker():
    worker = fake_worker()
    try:
        before = worker.compile(spec("relu"))["pid"]
        with pytest.raises(ReportError, match=r"(?s)fwd-64-64-raise: compile failed in the worker.*no such activation"):
            worker.compile(spec("raise"))
        assert worker.compile(spec("relu"))["pid"] == before
    finally:
        worker.close()
