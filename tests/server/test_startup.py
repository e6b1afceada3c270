"""`gpubox serve` start-up checks on the token, through the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import GPUBOX, child_env, free_port

pytestmark = pytest.mark.slow


def _serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # The timeout only turns a regression (a server that starts instead of refusing) into a failure.
    return subprocess.run(
        [GPUBOX, "serve", "--transport", "http", "--port", str(free_port()), *args],
        env=child_env(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _assert_clean_refusal(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("gpubox: "), out.stderr
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in out.stderr


def _token_file(tmp_path: Path, content: bytes, mode: int = 0o600) -> Path:
    f = tmp_path / "token"
    f.write_bytes(content)
    f.chmod(mode)
    return f


def test_a_missing_token_file_is_a_clean_error(tmp_path: Path) -> None:
    _assert_clean_refusal(_serve(tmp_path, "--token-file", str(tmp_path / "nope")), "does not exist")


@pytest.mark.parametrize("content", [b"", b"\n", b"   \t \nsecond-line\n"])
def test_an_empty_or_blank_token_file_is_a_clean_error(tmp_path: Path, content: bytes) -> None:
    f = _token_file(tmp_path, content)
    _assert_clean_refusal(_serve(tmp_path, "--token-file", str(f)), "is empty")


def test_a_non_utf8_token_file_is_a_clean_error(tmp_path: Path) -> None:
    f = _token_file(tmp_path, b"\xff\xfe\x00token\n")
    _assert_clean_refusal(_serve(tmp_path, "--token-file", str(f)), "not UTF-8")


def test_an_unreadable_token_file_is_a_clean_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root reads any mode; /proc/self/mem is a regular file whose read fails (EIO) for everyone
        f = Path("/proc/self/mem")
        if not f.is_file():
            pytest.skip("needs a non-root user or Linux /proc to make an unreadable file")
    else:
        f = _token_file(tmp_path, b"a-good-long-token-value\n", mode=0o000)
    _assert_clean_refusal(_serve(tmp_path, "--token-file", str(f)), "cannot be read")


@pytest.mark.parametrize("token", ["   ", "\t\n"])
def test_a_whitespace_only_gpubox_token_is_refused_like_a_blank_file(tmp_path: Path, token: str) -> None:
    _assert_clean_refusal(_serve(tmp_path, GPUBOX_TOKEN=token), "blank")


def test_a_short_token_is_refused_for_a_network_bind(tmp_path: Path) -> None:
    out = _serve(tmp_path, "--host", "0.0.0.0", GPUBOX_TOKEN="short-token")
    _assert_clean_refusal(out, "11-character token", "at least 16")


def test_an_invalid_setting_is_a_clean_error_without_a_traceback(tmp_path: Path) -> None:
    _assert_clean_refusal(_serve(tmp_path, GPUBOX_MAX_REQUEST_BODY_BYTES="12"), "max_request_body_bytes")


def test_a_token_file_readable_by_others_gets_a_warning(tmp_path: Path) -> None:
    f = _token_file(tmp_path, b"a-good-long-token-value\n", mode=0o644)
    log = tmp_path / "server.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [GPUBOX, "serve", "--transport", "http", "--port", str(free_port()), "--token-file", str(f)],
            env=child_env(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            deadline = time.monotonic() + 60
            while "gpubox listening" not in log.read_text() and proc.poll() is None:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    text = log.read_text()
    assert "readable by group/others" in text and "chmod 600" in text
    assert "a-good-long-token-value" not in text
