"""How long a rate-limited or overloaded provider asks us to wait: its `Retry-After`, read once for every adapter.

The model router's backoff and circuit breaker honour it (`ModelUnavailableError.retry_after_s`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from a 429/503's headers: `retry-after-ms` (OpenAI sends it) or `retry-after` in seconds.

    An HTTP-date `Retry-After`, a missing or unreadable value give None. `headers` is any mapping whose `get` takes
    lower-case names (httpx's headers, botocore's `HTTPHeaders`).
    """
    if headers is None:
        return None
    for name, scale in (('retry-after-ms', 0.001), ('retry-after', 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except (TypeError, ValueError):
            continue
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None
