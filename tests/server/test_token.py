"""The bearer token: characters a client can send, read once from its file (which may be a pipe)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from gpubox import settings as settings_module
from gpubox.errors import ConfigError
from gpubox.http import check_bind, connect_hint
from gpubox.settings import Settings


@pytest.mark.parametrize("token", ["pässwörd-0123456789abc", "tab\tinside-0123456789", "bell\x07inside-0123456789"])
def test_a_token_no_client_can_send_is_refused_at_startup(tmp_path: Path, token: str) -> None:
    by_value = Settings.load(state_dir=tmp_path / "s", host="0.0.0.0", token=token)
    with pytest.raises(ConfigError, match="Authorization header") as caught:
        check_bind(by_value)
    assert token not in str(caught.value)  # a token is never echoed
    f = tmp_path / "token"
    f.write_text(token + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"the token in {f}"):
        Settings.load(state_dir=tmp_path / "s", token_file=f).resolved_token()


def test_a_passphrase_with_spaces_is_accepted(tmp_path: Path) -> None:
    # clients send it (httpx does) and the MCP SDK's bearer check takes everything after 'Bearer '
    token = "correct horse battery staple"
    assert Settings.load(state_dir=tmp_path / "s", token=token).resolved_token() == token


def test_a_token68_token_is_accepted(tmp_path: Path) -> None:
    token = "Ab0-._~+/Zz9xxxxxxxx=="
    assert Settings.load(state_dir=tmp_path / "s", token=token).resolved_token() == token


def test_the_token_file_is_read_once_per_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "token"
    f.write_text("a-good-long-token-value\n")
    reads: list[Path] = []
    real = settings_module.read_token_file
    monkeypatch.setattr(settings_module, "read_token_file", lambda p: reads.append(p) or real(p))
    settings = Settings.load(state_dir=tmp_path / "s", host="0.0.0.0", token_file=f)
    check_bind(settings)
    connect_hint(settings)
    assert settings.resolved_token() == "a-good-long-token-value" and reads == [f]


def test_a_token_file_that_is_a_pipe_is_accepted(tmp_path: Path) -> None:
    fifo = tmp_path / "token-pipe"  # what `--token-file <(cat tok)` hands over
    os.mkfifo(fifo)
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError), fifo.open("w") as fh:  # blocks until a reader opens it
                fh.write("a-good-long-token-value\n")

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        settings = Settings.load(state_dir=tmp_path / "s", host="0.0.0.0", token_file=fifo)
        check_bind(settings)
        assert settings.resolved_token() == "a-good-long-token-value"
    finally:
        stop.set()
        release = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets a writer blocked in open finish
        thread.join(timeout=5)
        os.close(release)
