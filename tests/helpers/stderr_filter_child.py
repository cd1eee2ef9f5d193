"""``python -m tests.helpers.stderr_filter_child``: installs the XLA:CPU loader's warning filter (compat defect 38,
forced on any jaxlib), writes lines to fd 2 as C++ would (raw writes), and aborts, as a fatal C++ log does."""

import os

from levanter_mars.compat import xla_cpu_loader

xla_cpu_loader.quiet_pseudo_feature_warnings(force=True)
lines = [
    b"before\n",
    b"E1202 10:54:18.815177   11836 cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target machine feature "
    b"+prefer-no-gather is not  supported on the host machine. This could lead to execution errors such as SIGILL.\n",
    b"W1202 10:54:18.814404   11814 pjrt_executable.cc:642] Assume version compatibility. PjRt-IFRT does not track "
    b"XLA executable versions.\n",
    b"E1202 10:54:18.815177   11836 cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target machine feature "
    b"+avx512f is not  supported on the host machine. This could lead to execution errors such as SIGILL.\n",
    b"\rprogress 50%",
    b"\rprogress 100%\n",
    b"F1202 the last words before an abort\n",
]
for line in lines:
    os.write(2, line)
os.abort()
