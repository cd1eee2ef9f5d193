"""The test zygote's server (the client, and why, in tests/helpers/zygote.py): imports the training stack once, then
forks a child per program. ``python -m tests.helpers.zygote_server SOCKET``, started by the client, which writes the
socket's key to its stdin.

A child sets its environment, working directory and output files, then runs its program as the interpreter would.
Its ``PYTHONPATH`` comes first on its ``sys.path``, as in a fresh interpreter; but a module the zygote imported before
it forked stays the one it imported. So the client asks (:func:`shadowed`) which preloaded modules a child's
``PYTHONPATH`` would find elsewhere, and runs such a child in a fresh interpreter instead (a test's stand-in package
put first on the path, say).
"""

from __future__ import annotations

import os
import signal
import sys
from importlib.machinery import ModuleSpec, PathFinder
from multiprocessing.connection import Listener
from typing import Optional

from tests.helpers.zygote import CONFIG_CLASSES, NOT_PRELOADED, PRELOAD


def child_path(pythonpath: str, cwd: str) -> list[str]:
    """A child's ``sys.path``: its ``PYTHONPATH`` entries first, in order, as a fresh interpreter puts them, then the
    zygote's own (relative entries are relative to the child's working directory)."""
    entries = [os.path.join(cwd, p) for p in pythonpath.split(os.pathsep) if p]
    return entries + [p for p in sys.path if p not in entries]


def _location(spec: Optional[ModuleSpec]):
    """Where a module's code comes from: its file, or a package's directories."""
    if spec is None:
        return None
    if spec.submodule_search_locations is not None:
        return tuple(os.path.realpath(p) for p in spec.submodule_search_locations)
    return os.path.realpath(spec.origin) if spec.origin else None


def shadowed(pythonpath: str, cwd: str) -> list[str]:
    """The top-level modules the zygote has imported that a child with this ``PYTHONPATH`` would import from
    elsewhere, were it a fresh interpreter. Built-in and frozen modules are found before any path entry; a package's
    submodules come from its own directory, so the top-level names decide."""
    path = child_path(pythonpath, cwd)
    if path == sys.path:
        return []
    found_elsewhere = []
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if "." in name or spec is None or spec.origin in ("built-in", "frozen"):
            continue
        try:
            child, zygote = PathFinder.find_spec(name, path), PathFinder.find_spec(name, sys.path)
        except (ImportError, ValueError):
            continue
        # Unchanged by the child's path (a module a meta-path finder loaded, say), or found where it was loaded from.
        if child is not None and _location(child) not in (_location(zygote), _location(spec)):
            found_elsewhere.append(name)
    return sorted(found_elsewhere)


def _serve(address: str):
    """Imports, then forks a child per request. Returns only in a child, with its request."""
    import ctypes
    import importlib

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: end with the test session
    authkey = bytes.fromhex(sys.stdin.readline().strip())
    listener = Listener(address, family="AF_UNIX", authkey=authkey)
    conn = listener.accept()
    listener.close()
    for module in PRELOAD:
        importlib.import_module(module)
    _read_config_help()
    _check_fork_safe()
    conn.send("ready")
    children: set[int] = set()
    while True:
        try:
            kind, *request = conn.recv()
        except EOFError:
            kind = "exit"
        if kind == "shadowed":
            conn.send(shadowed(*request))
        elif kind == "reap":
            children.discard(request[0])
            conn.send(os.waitstatus_to_exitcode(os.waitpid(request[0], 0)[1]))
        elif kind == "spawn":
            sys.stdout.flush(), sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                conn.close()
                ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # and with the zygote
                return request
            children.add(pid)
            conn.send(pid)
        else:
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            conn.send(None)
            sys.exit(0)


def _read_config_help() -> None:
    import importlib

    from draccus.argparsing import ArgumentParser

    for module, name in CONFIG_CLASSES:
        ArgumentParser(config_class=getattr(importlib.import_module(module), name))


def _check_fork_safe() -> None:
    import threading

    from jax._src import xla_bridge

    problems = []
    if threading.active_count() != 1:
        problems.append(f"threads {[t.name for t in threading.enumerate()]}")
    if xla_bridge._backends:
        problems.append(f"JAX backends {list(xla_bridge._backends)}")
    problems += [f"{m} imported" for m in NOT_PRELOADED if m in sys.modules]
    if problems:
        raise RuntimeError("the zygote cannot fork safely: " + "; ".join(problems))


def _redirect(fd: int, path: str, mode: int) -> None:
    if path:
        target = os.open(path, mode, 0o644)
        os.dup2(target, fd)
        os.close(target)


def _become(args: list[str], cwd: str, env: dict[str, str], stdout: str, stderr: str):
    """In the child: the process ``python ARGS`` would have been, up to running its program (returned)."""
    import runpy
    import types

    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = child_path(env.get("PYTHONPATH", ""), cwd)  # the client checked that it shadows no preloaded module
    os.chdir(cwd)
    _redirect(0, os.devnull, os.O_RDONLY)
    _redirect(1, stdout, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    _redirect(2, stderr, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    if args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        return lambda: exec(compile(args[1], "<string>", "exec"), main.__dict__)
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.modules.pop(args[1], None)  # preloaded: `python -m` runs it as __main__ only
        return lambda: runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    sys.argv = list(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
    return lambda: runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    _program = _become(*_serve(sys.argv[1]))
    try:
        _program()
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - reported as the interpreter would, without the zygote's frames
        error = error.with_traceback(error.__traceback__.tb_next.tb_next)
        sys.excepthook(type(error), error, error.__traceback__)
        sys.exit(1)
