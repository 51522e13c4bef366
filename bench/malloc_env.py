"""Fixed glibc malloc settings for the benchmarks: this VM's default thresholds give timing outliers
(mmap/trim churn). glibc reads them at start, so a benchmark re-executes itself once with them set."""
from __future__ import annotations

import os
import sys

STEADY = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "268435456", "MALLOC_TOP_PAD_": "67108864"}


def pin_malloc(settings: dict[str, str] = STEADY) -> None:
    """Re-exec the running benchmark (as `python -m <its module>`) with `settings` in the environment,
    unless they are all set already; values the caller set themselves win."""
    if all(name in os.environ for name in settings):
        return
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    argv = ["-m", spec.name, *sys.argv[1:]] if spec is not None else sys.argv
    os.execvpe(sys.executable, [sys.executable, *argv], {**settings, **os.environ})
