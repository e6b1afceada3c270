"""Retrying flaky calls."""

import random
import time


def retry_with_backoff(fn, attempts: int = 5, base_delay: float = 0.1):
    """Call fn until it succeeds, sleeping exponentially longer (with jitter) after each failure."""
    for attempt in range(attempts):
        try:
            return fn()
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(base_delay * (2**attempt) * (1 + random.random()))
    return None
