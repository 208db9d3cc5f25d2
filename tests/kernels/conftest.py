"""Fixtures of the kernel tests."""

from __future__ import annotations

import pytest
from compile_reports import CompileWorker, ReportStore, report_dir, run_dir
from triton_compile_reports import WORKER_ARGV, report_fingerprint

from gdpa_inductor import config


@pytest.fixture(scope="module")
def triton_reports(tmp_path_factory):
    """The Triton compile reports (``triton_compile_reports``): compiled by one worker per module, kept on disk."""
    fingerprint, worker = report_fingerprint(), CompileWorker(WORKER_ARGV)
    directory = report_dir(config.kernel_cache_dir, run_dir(tmp_path_factory), f"triton-{fingerprint}")
    yield ReportStore(directory, worker.compile, still_current=lambda: report_fingerprint() == fingerprint)
    worker.close()
