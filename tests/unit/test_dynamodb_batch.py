"""Batch writes and reads back off between rounds instead of resending throttled items at once, and never give up
silently."""

from __future__ import annotations

from typing import Any

import pytest

from om_lib.adapters.aws.dynamodb.batch import MAX_ROUNDS, batch_get, batch_write
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


class ThrottledReads:
    """A DynamoDB client that answers one key per BatchGetItem (the rest unprocessed), `answered` keys at the most."""

    def __init__(self, answered: int) -> None:
        self.answered = answered
        self.calls = 0

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:  # noqa: N803 - boto3's name
        self.calls += 1
        ((table, request),) = RequestItems.items()
        keys = request['Keys']
        if self.calls > self.answered:
            return {'Responses': {table: []}, 'UnprocessedKeys': RequestItems}
        rest = {table: {**request, 'Keys': keys[1:]}} if keys[1:] else {}
        return {'Responses': {table: [{**keys[0], 'v': {'S': 'x'}}]}, 'UnprocessedKeys': rest}


def _keys(n: int) -> list[dict[str, Any]]:
    return [{'PK': {'S': f'k{i}'}, 'SK': {'S': 'META'}} for i in range(n)]


def test_unprocessed_keys_are_read_again_after_jittered_waits_until_every_item_is_in():
    client = ThrottledReads(answered=3)
    waits: list[float] = []
    items = batch_get(client, 't', _keys(3), what='test', sleep=waits.append)  # type: ignore[arg-type]
    assert [item['PK']['S'] for item in items] == ['k0', 'k1', 'k2'] and client.calls == 3
    assert len(waits) == 2 and all(0 <= w <= 0.05 * 2**i for i, w in enumerate(waits, start=1))


def test_a_read_still_throttled_after_every_round_is_an_error_not_missing_items():
    client = ThrottledReads(answered=1)
    with pytest.raises(StorageError, match='batch read') as info:
        batch_get(client, 't', _keys(3), what='test', sleep=lambda _: None)  # type: ignore[arg-type]
    assert info.value.retryable and client.calls == MAX_ROUNDS
