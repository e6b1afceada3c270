"""gpubox.child: the runner for merge and bench children, exercised with real child processes."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from gpubox.child import CHILD_ENV, child_env, import_path, python_module, run_child
from tests.conftest import wait_until

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads process states from /proc (Linux)"),
]

# A child that ignores SIGTERM and starts a grandchild (in its process group) that ignores it too; it prints the
# grandchild's pid once that one runs, then waits for ever.
STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the grandchild across exec
    code = "import sys, time; print('up', flush=True); time.sleep(3600)"
    g = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert g.stdout is not None and g.stdout.readline() == b"up\\n"
    print("grandchild", g.pid, flush=True)
    time.sleep(3600)
    """
)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def gone(pid: int) -> bool:
    """The process has exited (absent, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def grandchild_of(lines: list[str]) -> int:
    found = [int(line.split()[1]) for line in lines if line.startswith("grandchild ")]
    assert found, f"the child never reported its grandchild: {lines}"
    return found[0]


async def test_stdout_lines_are_handed_on_and_kept_and_stdin_reaches_the_child() -> None:
    seen: list[str] = []

    async def on_line(line: str) -> None:
        seen.append(line)

    code = "import sys; data = sys.stdin.read(); print('one'); print(data.upper()); sys.stdout.write('no newline')"
    result = await run_child(python(code), time_limit_s=60, on_line=on_line, stdin=b"hello")
    assert result.ok and result.returncode == 0 and not result.timed_out
    assert seen == ["one", "HELLO", "no newline"] and result.lines == seen
    assert result.stderr == ""


async def test_a_child_that_fails_is_reported_with_its_exit_code_and_stderr() -> None:
    code = "import sys; print('partial'); sys.stderr.write('Traceback: boom\\n'); sys.exit(3)"
    result = await run_child(python(code), time_limit_s=60)
    assert not result.ok and result.returncode == 3 and not result.timed_out
    assert result.lines == ["partial"] and "Traceback: boom" in result.stderr
    merged = await run_child(python(code), time_limit_s=60, stderr_to_stdout=True)
    assert merged.returncode == 3 and "Traceback: boom" in merged.lines and merged.stderr == ""


async def test_the_time_limit_kills_a_child_that_ignores_sigterm_and_its_grandchild() -> None:
    # the limit leaves a loaded box time for two Python start-ups (child, then grandchild) before it fires
    result = await run_child(python(STUBBORN), time_limit_s=10, term_grace_s=0.5)
    assert result.timed_out and not result.ok
    assert result.returncode == -signal.SIGKILL  # SIGTERM was ignored: SIGKILL after the grace
    assert result.elapsed_s < 10 + 0.5 + 10
    grandchild = grandchild_of(result.lines)
    await wait_until(lambda: gone(grandchild), timeout=10)


async def test_cancelling_the_caller_stops_the_whole_group() -> None:
    lines: list[str] = []
    with anyio.CancelScope() as scope:

        async def on_line(line: str) -> None:
            lines.append(line)
            if line.startswith("grandchild "):
                scope.cancel()  # the client cancelled: here, as soon as both processes run

        await run_child(python(STUBBORN), time_limit_s=600, on_line=on_line, term_grace_s=0.5)
        pytest.fail("run_child returned although its caller was cancelled")
    assert scope.cancelled_caught
    await wait_until(lambda: gone(grandchild_of(lines)), timeout=10)


async def test_a_helper_left_holding_the_pipes_neither_delays_the_result_nor_outlives_the_child() -> None:
    # the child exits at once; its grandchild keeps stdout and stderr open (Python 3.11's wait() would wait for it)
    code = textwrap.dedent(
        """
        import subprocess, sys
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print("grandchild", g.pid, flush=True)
        """
    )
    result = await run_child(python(code), time_limit_s=120)
    assert result.returncode == 0 and not result.timed_out
    assert result.elapsed_s < 60
    await wait_until(lambda: gone(grandchild_of(result.lines)), timeout=10)


async def test_an_error_in_the_line_handler_stops_the_child_and_propagates_as_it_is() -> None:
    async def on_line(line: str) -> None:
        if line.startswith("grandchild "):
            lines.append(line)
            raise ValueError("bad progress line")

    lines: list[str] = []
    with pytest.raises(ValueError, match="bad progress line"):
        await run_child(python(STUBBORN), time_limit_s=600, on_line=on_line, term_grace_s=0.5)
    await wait_until(lambda: gone(grandchild_of(lines)), timeout=10)


async def test_a_child_that_exits_without_reading_its_input_is_no_error() -> None:
    result = await run_child(python("import sys; sys.exit(0)"), time_limit_s=60, stdin=b"x" * 4_000_000)
    assert result.returncode == 0 and not result.timed_out


async def test_the_child_environment_is_a_copy_with_the_child_settings() -> None:
    before = dict(os.environ)
    env = child_env(EXTRA_FOR_TEST="1")
    assert dict(os.environ) == before and all(env[k] == v for k, v in CHILD_ENV.items())
    code = "import os; print(os.environ['HF_HUB_OFFLINE'], os.environ.get('EXTRA_FOR_TEST'))"
    assert (await run_child(python(code), time_limit_s=60)).lines == ["1 None"]
    assert (await run_child(python(code), time_limit_s=60, env=env)).lines == ["1 1"]


def test_the_childs_import_path_leaves_out_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [str(tmp_path), "", *sys.path])
    parts = import_path().split(os.pathsep)
    assert str(tmp_path) not in parts and "" not in parts and len(parts) > 1


async def test_a_python_module_child_does_not_import_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "json.py").write_text("raise SystemExit('shadowed')\n")  # a stray file named like a stdlib module
    monkeypatch.chdir(tmp_path)
    result = await run_child(python_module("json.tool", "--help"), time_limit_s=60)
    assert result.ok and "shadowed" not in result.stderr
