"""Compile reports kept on disk, each build compiled once per run and shared by the pytest-xdist workers.

The sm_90a compile checks (``test_cute_compile_sm90.py``, ``test_triton_compile_sm90.py``) assert on counts read
from each build's PTX and ptxas's report. A build costs seconds; there are about 190 of them. This module makes
each cost a single compile per run and none on a rerun with the same sources:

* ``ReportStore``: a report per build, a JSON file under ``<root>/<fingerprint>/`` named by a hash of the build's
  spec (the case and every argument its compile takes). The fingerprint, given by the caller, hashes what every
  report depends on (the kernel sources, the compilers' versions, the file that measures): any change to them
  lands in another folder. The first requester of a build takes its file lock (``fcntl.flock``) and compiles it;
  another process (or thread) asking for it meanwhile waits on the lock and then reads the file. Reports are
  written to a temporary name and renamed into place, so a reader never sees half a file (each with its
  compile's seconds, ``compile_s``). A failed compile is not written: it raises ``ReportError`` naming the case;
  a process waiting on it compiles it itself, and so does the next run (within a store, the error is raised
  again for the other tests that need it, without compiling it again).
* ``CompileWorker``: a long-lived compile subprocess (``serve`` on the worker's side), started on the first
  build not on disk and fed one spec at a time over stdin, answering one JSON line on stdout. It runs apart from
  pytest to keep TRITON_INTERPRET out of its way (and because cutlass-dsl reads its target once, when first
  imported); a single process per pytest worker pays the imports (2-10 s) once. Each build has a deadline: a
  worker that dies or overruns it is killed (with the compilers it runs) and the build fails with a
  ``ReportError`` naming the case and quoting the worker's log; the next build starts a fresh worker. A worker
  that cannot start fails every build of its process at once, after the first one's wait.

``report_dir`` puts the reports under ``gdpa_inductor.config.kernel_cache_dir`` (``GDPA_INDUCTOR_CACHE_DIR``),
subfolder ``compile_checks/<fingerprint>``, or under a folder of the run when that is the empty string (or cannot
be written).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: a worker imports gdpa_inductor from here


class ReportError(RuntimeError):
    """A build's report could not be made: the message names the case and says why."""


def case_label(spec: dict) -> str:
    case = spec.get("case")
    return "-".join(str(c) for c in case) if case else json.dumps(spec, sort_keys=True)


def spec_key(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


def report_dir(kernel_cache_dir: str, run_dir: str | os.PathLike, fingerprint: str) -> Path:
    """``<kernel_cache_dir>/compile_checks/<fingerprint>``, created; ``<run_dir>/compile_checks/<fingerprint>``
    when the disk cache is off (``kernel_cache_dir`` empty) or cannot be written: reports then last one run,
    still shared by its workers."""
    for base in filter(None, (kernel_cache_dir, str(run_dir))):
        directory = Path(base) / "compile_checks" / fingerprint
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(directory, os.W_OK):
            return directory
    raise ReportError(f"no writable folder for the compile reports under {kernel_cache_dir!r} or {str(run_dir)!r}")


def run_dir(tmp_path_factory) -> Path:
    """The pytest run's own temporary folder, shared by its xdist workers (each has a subfolder of it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


class ReportStore:
    """Reports by spec, from memory, else from ``directory``, else from ``compile_fn(spec)`` under the spec's
    file lock, written atomically. ``directory`` should name the fingerprint (``report_fingerprint``);
    ``still_current()`` says whether it still holds once a compile is done: a report compiled while the sources
    were edited is used but not written (it may be of either version)."""

    def __init__(self, directory: str | os.PathLike, compile_fn: Callable[[dict], dict],
                 still_current: Callable[[], bool] = lambda: True, lock_timeout_s: float = 1800.0):
        self.directory = Path(directory)
        self.compile_fn = compile_fn
        self.still_current = still_current
        self.lock_timeout_s = lock_timeout_s
        self._memory: dict[str, dict] = {}
        self._failed: dict[str, str] = {}

    def path(self, spec: dict) -> Path:
        return self.directory / f"{spec_key(spec)}.json"

    def report(self, spec: dict) -> dict:
        spec = json.loads(json.dumps(spec))  # as stored: tuples become lists
        key = spec_key(spec)
        if key in self._memory:
            return self._memory[key]
        if key in self._failed:
            raise ReportError(self._failed[key])
        path = self.path(spec)
        report = self._load(path, spec)
        if report is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            with self._locked(path.with_suffix(".lock"), spec):
                report = self._load(path, spec)  # compiled by the holder we waited for
                if report is None:
                    start = time.monotonic()
                    report = self._compile(key, spec)
                    if self.still_current():
                        self._write(path, spec, report, time.monotonic() - start)
        self._memory[key] = report
        return report

    def _compile(self, key: str, spec: dict) -> dict:
        try:
            report = self.compile_fn(spec)
        except ReportError as exc:
            self._failed[key] = str(exc)
            raise
        except Exception as exc:
            self._failed[key] = f"{case_label(spec)}: compile failed: {type(exc).__name__}: {exc}"
            raise ReportError(self._failed[key]) from exc
        if not isinstance(report, dict):
            self._failed[key] = f"{case_label(spec)}: the compile returned {type(report).__name__}, not a report"
            raise ReportError(self._failed[key])
        return report

    @staticmethod
    def _load(path: Path, spec: dict) -> dict | None:
        try:
            with open(path) as f:
                stored = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(stored, dict) or stored.get("spec") != spec or not isinstance(stored.get("report"), dict):
            return None  # not this build's (or not a report): compile it and write over it
        return stored["report"]

    @staticmethod
    def _write(path: Path, spec: dict, report: dict, seconds: float) -> None:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"spec": spec, "report": report, "compile_s": round(seconds, 2)}, f, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _locked(self, lock_path: Path, spec: dict):
        """The spec's lock, exclusive among processes and among this process's threads (each open() is its own
        description for flock); held for as long as the holder compiles, which its own deadlines bound."""
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + self.lock_timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ReportError(f"{case_label(spec)}: waited {self.lock_timeout_s:.0f} s for another "
                                          f"process compiling it (lock {lock_path})") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the lock


class CompileWorker:
    """A compile subprocess answering one spec at a time (``compile(spec)``), started on first use and again
    after a failure killed it. ``argv`` starts a worker loop (``serve``), in a fresh working directory; its
    environment is ``env``, else this one's without TRITON_INTERPRET and with the checkout on the path. The
    worker's stdout carries the protocol alone (one JSON line per answer, a ``{"ready": true}`` line first), its
    stderr goes to a log file quoted in the errors."""

    def __init__(self, argv: list[str], env: dict | None = None, start_timeout_s: float = 300.0,
                 case_timeout_s: float = 300.0):
        self.argv = argv
        self.env = env
        self.start_timeout_s = start_timeout_s
        self.case_timeout_s = case_timeout_s
        self._proc: subprocess.Popen | None = None
        self._dir: str | None = None
        self._log_path: str | None = None
        self._buffer = b""
        self._broken: str | None = None
        self._mutex = threading.Lock()

    def _env(self) -> dict:
        if self.env is not None:
            return dict(self.env)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        return env

    def _start(self, label: str) -> None:
        self._dir = tempfile.mkdtemp(prefix="gdpa_compile_")
        self._log_path = os.path.join(self._dir, "worker.log")
        self._buffer = b""
        with open(self._log_path, "ab") as log:  # appended to by the worker alone, read here by path
            # a process group of its own: killing the group kills the ptxas or nvdisasm it runs too
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                          env=self._env(), cwd=self._dir, start_new_session=True)
        try:
            answer = self._answer(label, self.start_timeout_s, "starting the compile worker", 0)
            if not answer.get("ready"):
                self._fail(label, f"the compile worker started with {answer!r}, not ready", 0)
        except ReportError as exc:
            self._broken = str(exc)
            raise

    def compile(self, spec: dict) -> dict:
        label = case_label(spec)
        with self._mutex:
            if self._broken is not None:
                raise ReportError(f"{label}: the compile worker could not start; the first attempt:\n{self._broken}")
            if self._proc is None:
                self._start(label)
            log_start = os.path.getsize(self._log_path)
            try:
                self._proc.stdin.write((json.dumps(spec) + "\n").encode())
                self._proc.stdin.flush()
            except OSError as exc:
                self._fail(label, f"could not send the spec to the compile worker ({exc})", log_start)
            answer = self._answer(label, self.case_timeout_s, "compiling", log_start)
        if "report" in answer:
            return answer["report"]
        raise ReportError(f"{label}: compile failed in the worker:\n{answer.get('error', answer)}")

    def _answer(self, label: str, timeout_s: float, doing: str, log_start: int) -> dict:
        deadline = time.monotonic() + timeout_s
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(label, f"no answer after {timeout_s:.0f} s {doing} (worker killed)", log_start)
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                rc = self._proc.wait()
                self._fail(label, f"the compile worker exited (status {rc}) while {doing}", log_start)
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            self._fail(label, f"the compile worker answered {line[:200]!r}, not JSON", log_start)

    def _fail(self, label: str, why: str, log_start: int):
        tail = self._log_tail(log_start)
        self._stop(kill=True)
        raise ReportError(f"{label}: {why}" + (f"\n--- worker log ---\n{tail}" if tail else ""))

    def _log_tail(self, start: int, limit: int = 4000) -> str:
        try:
            with open(self._log_path, "rb") as f:
                end = f.seek(0, os.SEEK_END)
                f.seek(max(start, end - limit))
                return f.read().decode(errors="replace").strip()
        except (OSError, TypeError):
            return ""

    def _stop(self, kill: bool) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if kill:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
            else:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def close(self) -> None:
        with self._mutex:
            self._stop(kill=False)


def serve(compile_fn: Callable[[dict, str], dict]) -> None:
    """The worker loop: one spec a line on stdin, one answer a line on stdout (``{"report": ...}`` or
    ``{"error": traceback}``), a ``{"ready": true}`` line first; anything else printed goes to stderr, so stdout
    carries the answers alone. ``compile_fn(spec, workdir)`` makes a report; the working directory is the
    worker's own, removed when it stops."""
    import traceback

    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    workdir = os.getcwd()

    def answer(obj: dict) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    answer({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            spec = json.loads(line)
            start = time.monotonic()
            report = compile_fn(spec, workdir)
            print(f"{case_label(spec)}: {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
        except Exception:
            answer({"error": traceback.format_exc()})
        else:
            answer({"report": report})
