"""Static bearer-token auth for the HTTP transports, through the SDK's TokenVerifier + AuthSettings."""

from __future__ import annotations

import hmac

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings

SCOPE = "gpubox"


class StaticTokenVerifier:
    """Accepts exactly one token, compared in constant time."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token=token, client_id="gpubox-client", scopes=[SCOPE])
        return None


def auth_settings() -> AuthSettings:
    # issuer_url is required by the SDK model but unused with a static verifier (no OAuth routes).
    return AuthSettings(issuer_url="http://127.0.0.1/", resource_server_url=None, required_scopes=[SCOPE])  # type: ignore[arg-type]
