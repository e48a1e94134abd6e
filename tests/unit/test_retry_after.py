"""The wait a provider asks for, read from its answer's headers (every model adapter uses this one reader)."""

from __future__ import annotations

import pytest

from om_lib.adapters.models.retry_after import retry_after_s


@pytest.mark.parametrize(
    ('headers', 'seconds'),
    [
        ({'retry-after': '12'}, 12.0),
        ({'retry-after': '0.5'}, 0.5),
        ({'retry-after-ms': '1500', 'retry-after': '9'}, 1.5),  # OpenAI's finer value wins
        ({'retry-after-ms': 'soon', 'retry-after': '9'}, 9.0),  # an unreadable one is skipped
        ({'retry-after': 'Wed, 21 Oct 2026 07:28:00 GMT'}, None),  # HTTP dates are not honoured
        ({'retry-after': '-3'}, 0.0),
        ({'retry-after': 'inf'}, None),
        ({}, None),
        (None, None),
    ],
)
def test_retry_after_reads_seconds_or_milliseconds(headers: dict[str, str] | None, seconds: float | None) -> None:
    assert retry_after_s(headers) == seconds
