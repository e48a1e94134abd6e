"""DynamoDB cost of the history routes: listing a resource's threads, and recalling messages with context.

    .venv/bin/python bench/history.py [--threads 1000] [--messages 10000] [--repeat 5]

What is measured (the same functions the API routes call, over the DynamoDB store on moto, in-process):
- `GET /threads?resourceId=…` — `list_resource_threads` for a resource with 1,000 threads (and with 10 for
  comparison): first page of 100 by `createdAt` DESC, by `updatedAt` DESC, with a metadata filter, and `perPage=false`.
- `POST /threads/{id}/messages/query` — `query_messages` in a thread of 10,000 messages: the first page of 40, a page
  deep in the thread (page 200), three messages by id with 2 before and 2 after each, and a date range.

Calls are counted with boto3 event hooks; read units are computed from the bytes of the items each read returned with
DynamoDB's rules (see bench/store_calls.py: moto's ConsumedCapacity is a fixed figure and measures nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402
from store_calls import Meter  # noqa: E402

from om_lib.adapters.aws.dynamodb.schema import create_table  # noqa: E402
from om_lib.adapters.aws.dynamodb.store import DynamoMemoryStore  # noqa: E402
from om_lib.clock import ManualClock  # noqa: E402
from om_lib.history.history import Include, query_messages  # noqa: E402
from om_lib.history.threads import list_resource_threads  # noqa: E402
from om_lib.messages import Message  # noqa: E402

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
MESSAGE_TEXT = 'I would like to plan a trip to Lisbon in May; what should I pack for the weather there? ' * 4


def _aws_env() -> None:
    for name, value in {
        'AWS_ACCESS_KEY_ID': 'testing',
        'AWS_SECRET_ACCESS_KEY': 'testing',
        'AWS_DEFAULT_REGION': 'us-east-1',
        'AWS_ACCOUNT_ID_ENDPOINT_MODE': 'disabled',
    }.items():
        os.environ[name] = value


def _store(name: str) -> tuple[DynamoMemoryStore, Any, Any]:
    ddb = boto3.client('dynamodb', region_name='us-east-1')
    s3 = boto3.client('s3', region_name='us-east-1')
    create_table(ddb, name)
    s3.create_bucket(Bucket=name)
    return DynamoMemoryStore(name, name, dynamodb_client=ddb, s3_client=s3, clock=ManualClock(T0)), ddb, s3


def _metered(ddb: Any, s3: Any, action: Callable[[], Any], repeat: int) -> dict[str, float]:
    meter = Meter()
    ddb.meta.events.register('provide-client-params.dynamodb', meter.before)
    ddb.meta.events.register('after-call.dynamodb', meter.after)
    s3.meta.events.register('provide-client-params.s3', meter.s3)
    started = time.perf_counter()
    try:
        for _ in range(repeat):
            action()
    finally:
        ddb.meta.events.unregister('provide-client-params.dynamodb', meter.before)
        ddb.meta.events.unregister('after-call.dynamodb', meter.after)
        s3.meta.events.unregister('provide-client-params.s3', meter.s3)
    return {
        'calls': sum(meter.calls.values()) / repeat,
        'read_units': meter.read_units / repeat,
        'read_kb': meter.read_bytes / repeat / 1024,
        's3_calls': sum(meter.s3_calls.values()) / repeat,
        'ms_moto': (time.perf_counter() - started) * 1000 / repeat,
    }


def bench_threads(count: int, repeat: int) -> dict[str, dict[str, float]]:
    store, ddb, s3 = _store(f'threads-{count}')
    for i in range(count):
        store.create_thread(
            'r1',
            f't{i:05d}',
            title=f'Conversation {i}',
            metadata={'project': 'alpha' if i % 10 == 0 else 'beta', 'n': i},
            now=T0 + timedelta(minutes=i),
        )
    store.create_thread('r2', 'other', title='another resource', now=T0)
    cases: dict[str, Callable[[], Any]] = {
        'page 0 of 100, createdAt DESC': lambda: list_resource_threads(store, 'r1', per_page=100),
        'page 0 of 100, updatedAt DESC': lambda: list_resource_threads(store, 'r1', order_by='updatedAt'),
        'metadata filter project=alpha': lambda: list_resource_threads(store, 'r1', metadata={'project': 'alpha'}),
        'perPage=false (all)': lambda: list_resource_threads(store, 'r1', per_page=None),
    }
    return {name: _metered(ddb, s3, action, repeat) for name, action in cases.items()}


def bench_messages(count: int, repeat: int) -> dict[str, dict[str, float]]:
    store, ddb, s3 = _store(f'messages-{count}')
    store.create_thread('r1', 't1', title='long', now=T0)
    batch: list[Message] = []
    for seq in range(1, count + 1):
        batch.append(
            Message.model_validate(
                {
                    'id': f'm{seq:06d}',
                    'role': 'user' if seq % 2 else 'assistant',
                    'createdAt': (T0 + timedelta(seconds=seq)).isoformat(),
                    'content': MESSAGE_TEXT,
                }
            )
        )
        if len(batch) == 100:
            store.append_messages('r1', 't1', batch, now=T0)
            batch = []
    if batch:
        store.append_messages('r1', 't1', batch, now=T0)
    anchors = [Include(f'm{n:06d}', with_previous=2, with_next=2) for n in (500, 5000, 9500)]
    middle = T0 + timedelta(seconds=count // 2)
    cases: dict[str, Callable[[], Any]] = {
        'page 0, perPage 40': lambda: query_messages(store, 'r1', 't1', page=0, per_page=40),
        'page 200, perPage 40': lambda: query_messages(store, 'r1', 't1', page=200, per_page=40),
        '3 ids ±2 context, perPage 0': lambda: query_messages(store, 'r1', 't1', per_page=0, include=anchors),
        'date range (60 s), perPage 40': lambda: query_messages(
            store, 'r1', 't1', per_page=40, date_range=(middle, middle + timedelta(seconds=60))
        ),
    }
    return {name: _metered(ddb, s3, action, repeat) for name, action in cases.items()}


def _print(title: str, rows: dict[str, dict[str, float]]) -> None:
    print(title)
    print(f'  {"request":<34} {"calls":>7} {"RCU":>9} {"KB read":>9} {"S3":>4} {"ms (moto)":>10}')
    for name, r in rows.items():
        print(
            f'  {name:<34} {r["calls"]:>7.1f} {r["read_units"]:>9.1f} {r["read_kb"]:>9.1f} '
            f'{r["s3_calls"]:>4.0f} {r["ms_moto"]:>10.1f}'
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--threads', type=int, default=1000)
    parser.add_argument('--messages', type=int, default=10_000)
    parser.add_argument('--repeat', type=int, default=3)
    args = parser.parse_args()
    _aws_env()
    with mock_aws(config={'core': {'reset_boto3_session': False}}):
        for count in (10, args.threads):
            _print(f'list threads: a resource with {count} threads', bench_threads(count, args.repeat))
        _print(f'recall: a thread with {args.messages} messages', bench_messages(args.messages, args.repeat))
    return 0


if __name__ == '__main__':
    sys.exit(main())
