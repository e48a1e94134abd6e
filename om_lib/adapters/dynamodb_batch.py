"""`BatchWriteItem` until every request is processed, backing off between rounds (both DynamoDB adapters use it).

DynamoDB answers a throttled batch with `UnprocessedItems`; sending them again at once just gets throttled again. The
rounds wait 50 ms doubling to 5 s with full jitter (AWS's advice for batch retries), at most `MAX_ROUNDS` rounds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from om_lib.adapters.aws_errors import aws_errors
from om_lib.errors import StorageError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

MAX_ROUNDS = 10
BASE_DELAY_S = 0.05
MAX_DELAY_S = 5.0
_jitter = random.SystemRandom()


def batch_write(
    ddb: DynamoDBClient,
    table_name: str,
    requests: list[dict[str, Any]],
    *,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Write `requests` (≤ 25 put/delete requests) to `table_name`; returns the rounds it took. Raises StorageError
    (retryable) naming `what` when DynamoDB still throttles after `MAX_ROUNDS` rounds."""
    pending: dict[str, Any] = {table_name: requests}
    for round_ in range(MAX_ROUNDS):
        if round_:
            sleep(_jitter.uniform(0, min(MAX_DELAY_S, BASE_DELAY_S * 2**round_)))
        with aws_errors():
            response = ddb.batch_write_item(RequestItems=pending)
        pending = dict(response.get('UnprocessedItems') or {})
        if not pending:
            return round_ + 1
    raise StorageError(f'DynamoDB kept throttling a batch write ({what}) after {MAX_ROUNDS} rounds')
