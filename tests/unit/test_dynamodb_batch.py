"""Batch writes back off between rounds instead of resending throttled items at once."""

from __future__ import annotations

from typing import Any

import pytest

from om_lib.adapters.dynamodb_batch import MAX_ROUNDS, batch_write
from om_lib.errors import StorageError


class ThrottlingClient:
    """A DynamoDB client that leaves `unprocessed` rounds' worth of items unprocessed."""

    def __init__(self, unprocessed: int) -> None:
        self.unprocessed = unprocessed
        self.calls: list[dict[str, Any]] = []

    def batch_write_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:  # noqa: N803 - boto3's name
        self.calls.append(RequestItems)
        if len(self.calls) <= self.unprocessed:
            return {'UnprocessedItems': RequestItems}
        return {'UnprocessedItems': {}}


def test_unprocessed_items_are_sent_again_after_growing_jittered_waits():
    client = ThrottlingClient(unprocessed=3)
    waits: list[float] = []
    rounds = batch_write(client, 't', [{'DeleteRequest': {}}], what='test', sleep=waits.append)  # type: ignore[arg-type]
    assert rounds == 4 and len(client.calls) == 4
    assert len(waits) == 3 and all(0 <= w <= 0.05 * 2**i for i, w in enumerate(waits, start=1))


def test_a_batch_still_throttled_after_every_round_is_a_retryable_storage_error():
    client = ThrottlingClient(unprocessed=100)
    with pytest.raises(StorageError) as info:
        batch_write(client, 't', [{'DeleteRequest': {}}], what='test', sleep=lambda _: None)  # type: ignore[arg-type]
    assert info.value.retryable and len(client.calls) == MAX_ROUNDS
