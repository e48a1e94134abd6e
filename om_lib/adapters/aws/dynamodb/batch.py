"""`BatchWriteItem` and `BatchGetItem` until every request is processed, backing off between rounds (both DynamoDB
adapters use them).

DynamoDB answers a throttled batch with `UnprocessedItems` / `UnprocessedKeys`; sending them again at once just gets
throttled again. The rounds wait 50 ms doubling to 5 s with full jitter (AWS's advice for batch retries), at most
`MAX_ROUNDS` rounds; then a retryable StorageError, never a partial answer.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from om_lib.adapters.aws.errors import aws_errors
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
    return _until_processed(
        lambda pending: ddb.batch_write_item(RequestItems=pending),
        {table_name: requests},
        'UnprocessedItems',
        what=f'a batch write ({what})',
        sleep=sleep,
    )


def batch_get(
    ddb: DynamoDBClient,
    table_name: str,
    keys: list[dict[str, Any]],
    *,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
) -> list[dict[str, Any]]:
    """The items of `keys` (≤ 100) that exist, read consistently. Raises StorageError (retryable) naming `what` when
    DynamoDB still throttles after `MAX_ROUNDS` rounds: a key it never answered is not a missing item."""
    items: list[dict[str, Any]] = []

    def read(pending: dict[str, Any]) -> Mapping[str, Any]:
        response = ddb.batch_get_item(RequestItems=pending)
        items.extend(response.get('Responses', {}).get(table_name, []))
        return response

    _until_processed(
        read,
        {table_name: {'Keys': keys, 'ConsistentRead': True}},
        'UnprocessedKeys',
        what=f'a batch read ({what})',
        sleep=sleep,
    )
    return items


def _until_processed(
    send: Callable[[dict[str, Any]], Mapping[str, Any]],
    pending: dict[str, Any],
    unprocessed: str,
    *,
    what: str,
    sleep: Callable[[float], None],
) -> int:
    """`send` the batch, then what the answer's `unprocessed` field gives back, until nothing is; returns the rounds."""
    for round_ in range(MAX_ROUNDS):
        if round_:
            sleep(_jitter.uniform(0, min(MAX_DELAY_S, BASE_DELAY_S * 2**round_)))
        with aws_errors():
            response = send(pending)
        pending = dict(response.get(unprocessed) or {})
        if not pending:
            return round_ + 1
    raise StorageError(f'DynamoDB kept throttling {what} after {MAX_ROUNDS} rounds')
