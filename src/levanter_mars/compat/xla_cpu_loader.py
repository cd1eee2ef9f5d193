"""Defect 38: jaxlib 0.9's XLA:CPU, loading a program from the compilation cache, logs an ERROR (``cpu_aot_loader.cc
... Target machine feature +prefer-no-gather is not supported on the host machine ... This could lead to execution
errors such as SIGILL.``) for each LLVM tuning pseudo-feature (``prefer-*``, ``fast-*``) the compile recorded: they
are never among a host's features, so every cache hit on such a machine prints one (pages of them per run), though the
program runs. XLA later skips those features (jaxlib 0.10 does).

:func:`quiet_pseudo_feature_warnings` routes this process's stderr (fd 2, where C++ logs) through a small filter
process that drops those lines and the loader's "Assume version compatibility" notice, and passes everything else on,
line by line. A warning about a real feature the host lacks still shows. The filter is a separate process, not a
thread: it reads until every writer is gone, so the last words of a process that aborts (a fatal C++ log, a
coordination-service shutdown) still reach the terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys

#: Lines of this shape are dropped: the loader's warning for a pseudo-feature, and its notice on every load.
PSEUDO_FEATURE_WARNING = rb"cpu_aot_loader\.cc.*Target machine feature \+(prefer|fast)-[\w.-]* is not"
LOAD_NOTICE = rb"pjrt_executable\.cc.*Assume version compatibility\. PjRt-IFRT does not track XLA executable versions"

_FILTER = r"""
import os, re
dropped = re.compile(rb"%s|%s")
pending = b""
while True:
    chunk = os.read(0, 1 << 16)
    if not chunk:
        break
    lines = (pending + chunk).splitlines(keepends=True)
    pending = lines.pop() if lines and not lines[-1].endswith((b"\n", b"\r")) else b""
    if pending and not (b"cpu_aot_loader" in pending or b"pjrt_executable" in pending):
        lines.append(pending)  # a partial line of anything else (a progress bar) goes on at once
        pending = b""
    out = b"".join(line for line in lines if not dropped.search(line))
    if out:
        os.write(1, out)
if pending and not dropped.search(pending):
    os.write(1, pending)
""" % (PSEUDO_FEATURE_WARNING.decode(), LOAD_NOTICE.decode())

_filter_process = None


def affected() -> bool:
    import jaxlib

    return tuple(int(p) for p in jaxlib.__version__.split(".")[:2]) < (0, 10)


def quiet_pseudo_feature_warnings(force: bool = False) -> None:
    """Filters this process's stderr as the module docstring says (on affected jaxlibs; ``force``: on any)."""
    global _filter_process
    if _filter_process is not None or not (force or affected()):
        return
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    terminal = os.dup(2)
    # close_fds: the filter must not hold the pipe's write end, or it would never see the end of the input.
    _filter_process = subprocess.Popen([sys.executable, "-c", _FILTER], stdin=read_end, stdout=terminal,
                                       stderr=terminal, close_fds=True)  # fmt: skip
    os.close(read_end)
    os.close(terminal)
    os.dup2(write_end, 2)
    os.close(write_end)
