"""Password hashing and session tokens."""

import hashlib
import hmac
import os
import time

TOKEN_TTL_SECONDS = 3600


def hash_password(password: str, salt: bytes | None = None) -> tuple[bytes, bytes]:
    """Derive a key from the password with PBKDF2-SHA256 and a random salt."""
    salt = salt or os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 200_000)
    return salt, digest


def verify_password(password: str, salt: bytes, expected: bytes) -> bool:
    """Check a password against a stored digest in constant time."""
    _, digest = hash_password(password, salt)
    return hmac.compare_digest(digest, expected)


def refresh_token(token: dict) -> dict:
    """Issue a new session token when the old one is close to expiry."""
    now = time.time()
    if token["expires_at"] - now > TOKEN_TTL_SECONDS / 4:
        return token
    return {"user": token["user"], "expires_at": now + TOKEN_TTL_SECONDS}
