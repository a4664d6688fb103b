"""The sandbox contains hostile programs, and the host is unharmed afterwards.

Every test checks the program's outcome (score 0 for the attacks) and, through the autouse fixture, that no
sandbox process is left running and that this test process has no new descendants. Attacks that bypass the
Python guard (``ctypes``) are only run where the kernel-level protection they target is active.
"""

from __future__ import annotations

import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from hf_diversed.evaluation.sandbox import SandboxResult, run_code, sandbox_info

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux")

INFO = sandbox_info() if sys.platform.startswith("linux") else None
needs_uid_drop = pytest.mark.skipif(
    INFO is None or not INFO.privileges_dropped, reason="kernel-level check needs the uid drop (root parent)"
)
needs_netns = pytest.mark.skipif(
    INFO is None or not INFO.network_isolated, reason="no network namespace on this machine"
)
# A guard-bypassing fork loop is only safe to try where the kernel blocks it (RLIMIT_NPROC binds non-root).
kernel_blocks_fork = pytest.mark.skipif(
    INFO is None or (os.geteuid() == 0 and not INFO.privileges_dropped),
    reason="running as root without the uid drop: RLIMIT_NPROC would not bind",
)


def _pids() -> set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _descendants(root: int) -> set[int]:
    parents = {pid: _ppid(pid) for pid in _pids()}
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier and pid not in found}
        found |= frontier
    return found


def _processes_mentioning(text: str) -> list[int]:
    hits = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    hits.append(pid)
        except OSError:
            pass
    return hits


def _is_live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture(autouse=True)
def host_unharmed():
    """No new live descendants of this test process, no live process from any sandbox of this test."""
    results: list[SandboxResult] = []
    before = {p for p in _descendants(os.getpid()) if _is_live(p)}
    yield results
    after = {p for p in _descendants(os.getpid()) if _is_live(p)}
    assert after <= before, f"new child processes left behind: {sorted(after - before)}"
    for result in results:
        assert not os.path.exists(result.workdir), f"{result.workdir} was not deleted"
        leftovers = [p for p in _processes_mentioning(result.workdir) if _is_live(p)]
        assert not leftovers, f"sandbox processes still running: {leftovers}"


def run(results: list[SandboxResult], program: str, **kwargs: object) -> SandboxResult:
    result = run_code(textwrap.dedent(program), **kwargs)  # type: ignore[arg-type]
    results.append(result)
    return result


def score(result: SandboxResult) -> float:
    return 1.0 if result.passed else 0.0


def test_correct_program_passes_in_a_fresh_deleted_dir(host_unharmed, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("HF_TOKEN", "secret-token-value")
    result = run(
        host_unharmed,
        """
        import os
        with open("scratch.txt", "w") as f:   # writing inside the working directory is allowed
            f.write("ok")
        print(open("scratch.txt").read(), os.getcwd(), sorted(os.environ), sep="|")
        """,
        timeout_s=5,
    )
    assert result.passed and result.status == "passed" and result.returncode == 0
    text, cwd, env = result.stdout.strip().split("|")
    assert text == "ok"
    assert os.path.realpath(cwd) == result.workdir
    assert "PROXY" not in env.upper() and "TOKEN" not in env.upper()
    assert "secret-token-value" not in result.stdout + result.stderr
    assert not os.path.exists(result.workdir)


def test_ordinary_stdlib_and_file_use_passes(host_unharmed):
    # The guard must not break normal solutions: random/tempfile/shutil inside the working directory.
    result = run(
        host_unharmed,
        """
        import collections, heapq, itertools, json, math, random, re, shutil, tempfile, os
        random.seed(0)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "a.txt"), "w") as f:
                f.write("x")
        os.makedirs("tree/sub")
        shutil.copy(__file__, "tree/sub/copy.py")
        shutil.rmtree("tree")
        assert sorted(os.listdir(".")) == ["solution.py"]
        print(math.comb(5, 2), heapq.nsmallest(1, [3, 1]), random.randint(1, 1))
        """,
        timeout_s=5,
    )
    assert result.passed, result.stderr
    assert result.stdout.split() == ["10", "[1]", "1"]


def test_failing_assert_and_early_exit_score_zero(host_unharmed):
    failed = run(host_unharmed, "assert 1 + 1 == 3\n", timeout_s=5)
    assert failed.status == "failed" and score(failed) == 0.0 and "AssertionError" in failed.stderr
    # exit(0) before the appended tests must not count as success.
    skipped = run(host_unharmed, "import sys\nsys.exit(0)\nassert False\n", timeout_s=5)
    assert skipped.status == "failed" and score(skipped) == 0.0
    hard = run(host_unharmed, "import os\nos._exit(0)\nassert False\n", timeout_s=5)
    assert hard.status == "failed" and score(hard) == 0.0


def test_infinite_loop_times_out(host_unharmed, monkeypatch):
    """The sandbox waits for the program once, for its limit, then kills it (the autouse fixture checks that nothing
    is left running); asserted on the wait asked for, not on the wall clock."""
    from hf_diversed.evaluation import sandbox

    waits = []
    real_wait = sandbox._wait_exited

    def recording_wait(proc, timeout_s):
        exited = real_wait(proc, timeout_s)
        waits.append((timeout_s, exited))
        return exited

    monkeypatch.setattr(sandbox, "_wait_exited", recording_wait)
    result = run(host_unharmed, "while True:\n    pass\n", timeout_s=2)
    assert result.status == "timeout" and score(result) == 0.0
    assert waits == [(2, False)]


def test_fork_bomb_is_contained(host_unharmed):
    before = len(_pids())
    result = run(
        host_unharmed,
        """
        import os
        while True:
            os.fork()
        """,
        timeout_s=2,
    )
    assert score(result) == 0.0 and result.status == "failed"
    assert "PermissionError" in result.stderr
    # Allow a little unrelated activity on the machine; a fork bomb would add hundreds.
    assert len(_pids()) <= before + 5


def test_subprocess_and_system_are_blocked(host_unharmed):
    for program in (
        "import subprocess\nsubprocess.run(['true'])\n",
        "import os\nos.system('true')\n",
        "import os\nos.execv('/bin/true', ['true'])\n",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()\n",
    ):
        result = run(host_unharmed, program, timeout_s=5)
        assert score(result) == 0.0, program


@kernel_blocks_fork
def test_fork_through_ctypes_is_blocked_by_rlimit_nproc(host_unharmed):
    # Bypasses the Python guard; RLIMIT_NPROC=1 (binding after the uid drop) must make every fork fail.
    # Bounded (50 tries, children exit at once) so a failure of the limit cannot hurt the host.
    result = run(
        host_unharmed,
        """
        import ctypes
        libc = ctypes.CDLL(None)
        forked = 0
        for _ in range(50):
            pid = libc.fork()
            if pid == 0:
                libc._exit(0)
            forked += pid > 0
        print(forked)
        """,
        timeout_s=5,
    )
    assert result.stdout.strip() == "0", result.stdout + result.stderr


def test_huge_allocation_fails(host_unharmed):
    result = run(host_unharmed, "x = bytearray(10**11)\nprint(len(x))\n", timeout_s=5, memory_mb=512)
    assert result.status == "failed" and score(result) == 0.0
    assert "MemoryError" in result.stderr


def test_output_flood_is_capped(host_unharmed):
    result = run(
        host_unharmed,
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
        timeout_s=5,
        max_file_mb=1,
    )
    assert score(result) == 0.0 and result.status in ("failed", "timeout")
    assert len(result.stdout) <= 4000


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    path = tmp_path / "canary_dir" / "canary.txt"
    path.parent.mkdir()
    path.write_text("alive")
    return path


@pytest.mark.parametrize(
    "attack",
    [
        "import os\nos.remove({path!r})\n",
        "import os\nos.unlink({path!r})\n",
        "with open({path!r}, 'w') as f:\n    f.write('pwned')\n",
        "with open({path!r}, 'a') as f:\n    f.write('pwned')\n",
        "import pathlib\npathlib.Path({path!r}).write_text('pwned')\n",
        "import shutil\nshutil.rmtree({dir!r})\n",
        "import os\nos.rename({path!r}, 'stolen.txt')\n",
        "import os\nfd = os.open({path!r}, os.O_WRONLY | os.O_TRUNC)\n",
        "import os\nopen(os.path.relpath({path!r}), 'w').write('pwned')\n",
        "import os\nos.symlink({path!r}, 'link')\nopen('link', 'w').write('pwned')\n",
        "import os\nfd = os.open({dir!r}, os.O_RDONLY)\nos.unlink('canary.txt', dir_fd=fd)\n",
    ],
    ids=[
        "remove",
        "unlink",
        "open-w",
        "open-a",
        "pathlib",
        "rmtree",
        "rename",
        "os.open",
        "relative",
        "symlink",
        "dir_fd",
    ],
)
def test_files_outside_workdir_are_untouched(host_unharmed, canary, attack):
    program = attack.format(path=str(canary), dir=str(canary.parent))
    result = run(host_unharmed, program, timeout_s=5)
    assert score(result) == 0.0 and result.status == "failed"
    assert "PermissionError" in result.stderr
    assert canary.read_text() == "alive"


@needs_uid_drop
def test_files_outside_workdir_survive_a_guard_bypass(host_unharmed, canary):
    # ctypes skips the Python guard: file permissions (the uid drop) must still protect the canary.
    result = run(
        host_unharmed,
        f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.unlink({str(canary).encode()!r}) == 0, "unlink refused"
        """,
        timeout_s=5,
    )
    assert score(result) == 0.0
    assert canary.read_text() == "alive"


@needs_uid_drop
def test_cannot_signal_host_processes(host_unharmed):
    # Signal 0 only checks permission, so this probe is harmless even if the protection failed.
    result = run(
        host_unharmed,
        f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.kill({os.getpid()}, 0) == 0, "kill refused"
        """,
        timeout_s=5,
    )
    assert score(result) == 0.0


@pytest.fixture
def listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.3)
    yield server
    server.close()


def _assert_no_connection(server: socket.socket) -> None:
    try:
        conn, _ = server.accept()
    except TimeoutError:
        return
    conn.close()
    raise AssertionError("the sandboxed program reached the host's listening socket")


def test_network_is_blocked(host_unharmed, listener):
    port = listener.getsockname()[1]
    result = run(
        host_unharmed,
        f"""
        import socket
        s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
        s.sendall(b"hello")
        """,
        timeout_s=5,
    )
    assert score(result) == 0.0 and result.status == "failed"
    _assert_no_connection(listener)


@needs_netns
def test_network_is_blocked_even_bypassing_the_guard(host_unharmed, listener):
    port = listener.getsockname()[1]
    result = run(
        host_unharmed,
        f"""
        import _socket
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        s.settimeout(1)
        s.connect(("127.0.0.1", {port}))
        """,
        timeout_s=5,
    )
    assert score(result) == 0.0 and result.status == "failed"
    assert "unreachable" in result.stderr.lower() or "OSError" in result.stderr
    _assert_no_connection(listener)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="timeout_s"):
        run_code("pass", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        run_code("pass", memory_mb=8)


def test_sandbox_info_reports_protections():
    info = sandbox_info()
    assert os.path.isfile(info.interpreter)
    if os.geteuid() == 0 and info.privileges_dropped:
        assert not any("no Python" in note for note in info.notes)
