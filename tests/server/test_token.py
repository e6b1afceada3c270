"""The bearer token: characters a client can send, read once from its file (which may be a pipe)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpubox.errors import ConfigError
from gpubox.http import check_bind
from gpubox.settings import Settings


@pytest.mark.parametrize("token", ["pässwörd-0123456789abc", "token with a space 0123", "tab\tinside-0123456789"])
def test_a_token_no_client_can_send_is_refused_at_startup(tmp_path: Path, token: str) -> None:
    by_value = Settings.load(state_dir=tmp_path / "s", host="0.0.0.0", token=token)
    with pytest.raises(ConfigError, match="Authorization header") as caught:
        check_bind(by_value)
    assert token not in str(caught.value)  # a token is never echoed
    f = tmp_path / "token"
    f.write_text(token + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"the token in {f}"):
        Settings.load(state_dir=tmp_path / "s", token_file=f).resolved_token()


def test_a_token68_token_is_accepted(tmp_path: Path) -> None:
    token = "Ab0-._~+/Zz9xxxxxxxx=="
    assert Settings.load(state_dir=tmp_path / "s", token=token).resolved_token() == token
