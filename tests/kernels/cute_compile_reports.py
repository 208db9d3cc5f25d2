"""Compile reports of the CuTe-DSL kernels for sm_90a, each build compiled once and kept on disk.

``test_cute_compile_sm90.py`` asserts on counts read from each build's PTX, ptxas's ``-v`` report and the SASS
(``extract_report``). A build costs 3-5 s on an idle core (cutlass-dsl's IR generation and MLIR passes, about
2-3 s, then ptxas and nvdisasm on the PTX, about 1 s); the file has about 170 of them. This module makes each one
cost a single compile per run, shared by the pytest-xdist workers, and none on a rerun with the same sources:

* ``ReportStore``: a report per build, a JSON file under ``<root>/<fingerprint>/`` named by a hash of the build's
  spec (the case and every argument its compile takes). The fingerprint (``report_fingerprint``) hashes the kernel
  sources, the cutlass-dsl, TVM-FFI and Python versions (``compile_cache.source_fingerprint``), the target, the
  Triton version (its ptxas and nvdisasm read the PTX) and this file, which holds what is measured: any change
  to them lands in another folder. The first requester of a build takes its file lock (``fcntl.flock``) and
  compiles it; another process (or thread) asking for it meanwhile waits on the lock and then reads the file.
  Reports are written to a temporary name and renamed into place, so a reader never sees half a file (each with
  its compile's seconds, ``compile_s``). A failed compile is not written: it raises ``ReportError`` naming the
  case; a process waiting on it compiles it itself, and so does the next run (within a store, the error is
  raised again for the other tests that need it, without compiling it again).
* ``CompileWorker``: a long-lived compile subprocess (this file's ``__main__``), started on the first build not
  on disk and fed one spec at a time over stdin, answering one JSON line on stdout. It runs apart from pytest
  because cutlass-dsl reads its dump directory (where ``--keep-ptx`` writes the PTX; otherwise the working
  directory) and its target once, when first imported, and to keep TRITON_INTERPRET out of its way; a single
  process per pytest worker pays the imports (2-10 s) once. Each build has a deadline: a worker that dies or
  overruns it is killed (with its ptxas or nvdisasm) and the build fails with a ``ReportError`` naming the case
  and quoting the worker's log; the next build starts a fresh worker. A worker that cannot start fails every
  build of its process at once, after the first one's wait.

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
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

TARGET = "sm_90a"
ROOT = Path(__file__).resolve().parents[2]  # the checkout: the worker imports gdpa_inductor from here


class ReportError(RuntimeError):
    """A build's report could not be made: the message names the case and says why."""


def case_label(spec: dict) -> str:
    case = spec.get("case")
    return "-".join(str(c) for c in case) if case else json.dumps(spec, sort_keys=True)


def spec_key(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


def report_fingerprint() -> str:
    """What every report depends on besides its spec: the kernel sources and the versions compiling them
    (``source_fingerprint``, computed afresh so that this process's cached value is left alone), the target,
    Triton (its ptxas and nvdisasm) and this file (what is measured, and how)."""
    import triton

    from gdpa_inductor.kernels.cute.compile_cache import source_fingerprint

    kernels = getattr(source_fingerprint, "__wrapped__", source_fingerprint)()
    h = hashlib.sha256(f"{kernels} {TARGET} triton={triton.__version__} ".encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:32]


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
    after a failure killed it. ``argv`` defaults to this file's worker loop; the worker's stdout carries the
    protocol alone (one JSON line per answer, a ``{"ready": true}`` line first), its stderr goes to a log file
    quoted in the errors."""

    def __init__(self, argv: list[str] | None = None, env: dict | None = None, start_timeout_s: float = 300.0,
                 case_timeout_s: float = 300.0):
        self.argv = argv or [sys.executable, str(Path(__file__).resolve())]
        self.env = env
        self.start_timeout_s = start_timeout_s
        self.case_timeout_s = case_timeout_s
        self._proc: subprocess.Popen | None = None
        self._dir: str | None = None
        self._log_path: str | None = None
        self._buffer = b""
        self._broken: str | None = None
        self._mutex = threading.Lock()

    def _env(self, dump_dir: str) -> dict:
        if self.env is not None:
            return dict(self.env)
        # cutlass-dsl's own settings (kept files, compiler options) would change what is measured: only ours
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and not k.startswith("CUTE_DSL_")}
        env.update(CUTE_DSL_ARCH=TARGET, CUTE_DSL_DUMP_DIR=dump_dir,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
        return env

    def _start(self, label: str) -> None:
        self._dir = tempfile.mkdtemp(prefix="gdpa_cute_compile_")
        self._log_path = os.path.join(self._dir, "worker.log")
        self._buffer = b""
        with open(self._log_path, "ab") as log:  # appended to by the worker alone, read here by path
            # a process group of its own: killing the group kills the ptxas or nvdisasm it runs too
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                          env=self._env(self._dir), cwd=self._dir, start_new_session=True)
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


# --- what a build reports (the worker's side) ---

def compile_ptx(spec: dict) -> str:
    """The PTX of the build ``spec`` names: ``build`` "fwd" (``compile_fwd``) or "bwd" (``compile_bwd``),
    ``args`` its arguments, ``dtype`` by torch's name."""
    import torch

    from gdpa_inductor.kernels.cute.gdpa_bwd import compile_bwd
    from gdpa_inductor.kernels.cute.gdpa_fwd import compile_fwd

    args = dict(spec["args"])
    build = {"fwd": compile_fwd, "bwd": compile_bwd}[spec["build"]]
    dtype = getattr(torch, args.pop("dtype"))
    return build(dtype, args.pop("head_dim"), args.pop("activation"), keep_ptx=True, **args).artifacts.PTX


def ptxas_and_sass(ptx: str, workdir: str, sass: bool = True) -> tuple[str, str | None]:
    """ptxas -v's report on ``ptx`` (Triton's ptxas for sm_90a) and nvdisasm's SASS of the cubin it wrote (None
    without ``sass``: the disassembly is a sixth of a build's time, and most tests read the PTX alone)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    ptx_path, cubin_path = os.path.join(workdir, "k.ptx"), os.path.join(workdir, "k.cubin")
    with open(ptx_path, "w") as f:
        f.write(ptx)
    log = subprocess.run([ptxas, "-v", f"--gpu-name={TARGET}", ptx_path, "-o", cubin_path],
                         capture_output=True, text=True, check=True).stderr
    if not sass:
        return log, None
    sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "nvdisasm"), "-c", cubin_path],
                          capture_output=True, text=True, check=True).stdout
    return log, sass


def extract_report(ptx: str, log: str, sass: str | None) -> dict:
    """The counts the compile tests assert on, from the PTX, ptxas's ``-v`` report and the SASS (its counts None
    where it was not disassembled, so that a test reading them fails instead of seeing zeros)."""
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if not spills:
        raise ValueError(f"ptxas -v reported no spill line:\n{log[-2000:]}")
    return dict(
        target=re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1),
        wgmma=ptx.count("wgmma.mma_async"),
        mbarrier_init=len(re.findall(r"mbarrier\.init", ptx)),
        tma_loads=len(re.findall(r"cp\.async\.bulk\.tensor\.\w+\.shared::cta\.global", ptx)),
        tma_stores=len(re.findall(r"cp\.async\.bulk\.tensor\.\w+\.global\.shared::cta", ptx)),
        tma_reduce=len(re.findall(r"cp\.reduce\.async\.bulk\.tensor", ptx)),
        bulk_reduce=len(re.findall(r"cp\.reduce\.async\.bulk\.global", ptx)),
        wgmma_n80=len(re.findall(r"wgmma\.mma_async\S*m64n80k16", ptx)),
        st_global=len(re.findall(r"\bst\.global\.", ptx)),
        stmatrix=ptx.count("stmatrix"),
        ldmatrix=ptx.count("ldmatrix"),
        red_v2_f32=len(re.findall(r"red\.global\.add\.v2\.f32", ptx)),
        count_acq_rel=len(re.findall(r"\batom\.global\.acq_rel(?:\.gpu)?\.add", ptx)),
        ld_global_cg_v4=ptx.count("ld.global.cg.v4.f32"),
        proxy_fence_global=ptx.count("fence.proxy.async.global"),
        count_reset=ptx.count("st.global.relaxed.gpu.b32"),
        zero_stores=len(re.findall(r"st\.global\.v4\.b32 \[%rd\d+\], \{ 0, 0, 0, 0 \}", ptx)),
        tma_5d=len(re.findall(r"cp\.(?:reduce\.)?async\.bulk\.tensor\.5d", ptx)),
        ld_global_s32=len(re.findall(r"\bld\.global\.\S*[bsu]32", ptx)),
        setmaxnreg=ptx.count("setmaxnreg."),
        tanh_approx=ptx.count("tanh.approx.f32"),
        tanh_approx_bf16x2=ptx.count("tanh.approx.bf16x2"),
        fma_bf16x2=ptx.count("fma.rn.bf16x2"),
        selp_f32=ptx.count("selp.f32"),
        add_f32=len(re.findall(r"\badd\.(?:rn\.)?(?:ftz\.)?f32", ptx)),
        mul_f32=len(re.findall(r"\bmul\.(?:rn\.)?(?:ftz\.)?f32", ptx)),
        fma_f32=len(re.findall(r"\bfma\.rn\.(?:ftz\.)?f32", ptx)),
        ld_global_32=len(re.findall(r"\bld\.global\.\S*[bf]32", ptx)),
        ld_global_pairs=len(re.findall(r"\bld\.global\.v2\.b16", ptx)),
        spill_stores=sum(int(s) for s, _ in spills),
        spill_loads=sum(int(x) for _, x in spills),
        wgmma_serialized="wgmma.mma_async instructions are serialized" in log,
        st_async=len(re.findall(r"\bst\.async\.shared::cluster\.mbarrier::complete_tx::bytes", ptx)),
        cluster_arrives=len(re.findall(r"\bmbarrier\.arrive\.release\.cluster\.shared::cluster", ptx)),
        named_barrier_arrives=len(re.findall(r"\bbarrier\.(?:cta\.)?arrive|\bbar\.arrive", ptx)),
        sass_r2ur=None if sass is None else len(re.findall(r"\bR2UR\b", sass)),
        sass_sts128=None if sass is None else len(re.findall(r"\bSTS\.128\b", sass)),
    )


def compile_report(spec: dict, workdir: str) -> dict:
    """The build's counts (``extract_report``), its SASS disassembled where ``spec["sass"]`` asks, and the
    deprecation warnings raised while it was built (``deprecations``: an API that a pinned cutlass-dsl still has
    but a later one may not)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        ptx = compile_ptx(spec)
    log, sass = ptxas_and_sass(ptx, workdir, spec.get("sass", True))
    deprecations = sorted({f"{w.message} ({Path(w.filename).name}:{w.lineno})" for w in caught
                           if issubclass(w.category, DeprecationWarning)})
    return {**extract_report(ptx, log, sass), "deprecations": deprecations}


def _clear_dumps(workdir: str) -> None:
    """The PTX cutlass-dsl dumped for the build just reported (``--keep-ptx``): read from memory, not needed."""
    for name in os.listdir(workdir):
        if name.endswith((".ptx", ".cubin")):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(workdir, name))


def serve(compile_fn: Callable[[dict, str], dict] | None = None) -> None:
    """The worker loop: one spec a line on stdin, one answer a line on stdout (``{"report": ...}`` or
    ``{"error": traceback}``), a ``{"ready": true}`` line first, once the imports are done; anything else printed
    goes to stderr, so stdout carries the answers alone. ``compile_fn(spec, workdir)``: ``compile_report``."""
    import traceback

    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    workdir = os.getcwd()
    if compile_fn is None:
        # the imports, once (cutlass-dsl reads CUTE_DSL_DUMP_DIR and CUTE_DSL_ARCH here)
        import torch  # noqa: F401

        from gdpa_inductor.kernels.cute import gdpa_bwd, gdpa_fwd  # noqa: F401

        compile_fn = compile_report

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
        finally:
            _clear_dumps(workdir)


if __name__ == "__main__":
    serve()
