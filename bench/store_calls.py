"""DynamoDB cost of a steady-state step, at 100 and at 10,000 stored messages in the thread.

    .venv/bin/python bench/store_calls.py [--steps 20] [--unobserved 20]

A steady-state step is a real `MemoryEngine.prepare_step` over the DynamoDB store when no observation is due: save the
step's new message (the OM head comes back with the append), read the messages after the head's cursor. For
comparison, `store: no head in append` makes the same store calls the engine made before it took the head from the
append (append + get_record + list).

Calls are counted with boto3 event hooks (`provide-client-params.dynamodb`, once per API call; `after-call` for
the responses). Read units are computed from the bytes of the
items each read returned, with DynamoDB's rules (strongly consistent; GetItem rounds each item up to 4 KB, Query
rounds the sum of its items up to 4 KB): moto's ConsumedCapacity is a fixed number per call and measures nothing.
Write units are estimated the same way (1 KB rounding; an UpdateItem is charged for the larger of the old and new
item, known here from ReturnValues=ALL_OLD). Everything runs in-process on moto; 10,000 messages are seeded with
BatchWriteItem.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from om_lib.adapters.aws.dynamodb.items import thread_pk as _thread_pk  # noqa: E402
from om_lib.adapters.aws.dynamodb.schema import create_table  # noqa: E402
from om_lib.adapters.aws.dynamodb.store import DynamoMemoryStore  # noqa: E402
from om_lib.adapters.tiktoken_counter import get_tokenizer  # noqa: E402
from om_lib.clock import ManualClock  # noqa: E402
from om_lib.config import OMConfig  # noqa: E402
from om_lib.context.tokens import TokenCounter  # noqa: E402
from om_lib.engine.engine import MemoryEngine  # noqa: E402
from om_lib.messages import Message  # noqa: E402
from om_lib.models.model_router import ModelRouter  # noqa: E402
from om_lib.models.offline_model import OfflineLanguageModel  # noqa: E402
from om_lib.records import OMRecord  # noqa: E402

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
MESSAGE_TEXT = 'I would like to plan a trip to Lisbon in May; what should I pack for the weather there? ' * 4


def attr_size(value: dict[str, Any]) -> int:
    """Bytes DynamoDB counts for one attribute value."""
    kind, raw = next(iter(value.items()))
    if kind == 'S':
        return len(raw.encode())
    if kind == 'N':
        digits = raw.lstrip('-').replace('.', '').strip('0') or '0'
        return math.ceil(len(digits) / 2) + 1
    if kind == 'B':
        return len(raw)
    if kind in {'BOOL', 'NULL'}:
        return 1
    if kind == 'M':
        return 3 + sum(len(k.encode()) + attr_size(v) + 1 for k, v in raw.items())
    if kind == 'L':
        return 3 + sum(attr_size(v) + 1 for v in raw)
    return sum(len(x.encode()) if isinstance(x, str) else len(x) for x in raw)  # sets


def item_size(item: dict[str, Any]) -> int:
    """Bytes DynamoDB counts for an item: attribute names plus values."""
    return sum(len(name.encode()) + attr_size(value) for name, value in item.items())


@dataclass
class Meter:
    """Counts DynamoDB/S3 calls and the capacity units their items imply."""

    calls: Counter[str] = field(default_factory=Counter)
    s3_calls: Counter[str] = field(default_factory=Counter)
    read_units: float = 0.0
    write_units: float = 0.0
    read_bytes: int = 0

    def before(self, model: Any, params: dict[str, Any], **_: Any) -> None:
        self.calls[model.name] += 1
        if model.name == 'PutItem':
            # A message item is also written to LSI1 (projection ALL): a second write of the same size.
            copies = 2 if 'seq' in params['Item'] else 1
            self.write_units += copies * math.ceil(item_size(params['Item']) / 1024)

    def after(self, model: Any, parsed: dict[str, Any], **_: Any) -> None:
        name = model.name
        if name == 'GetItem' and 'Item' in parsed:
            size = item_size(parsed['Item'])
            self.read_bytes += size
            self.read_units += max(1, math.ceil(size / 4096))
        elif name == 'GetItem':
            self.read_units += 1
        elif name == 'Query':
            size = sum(item_size(i) for i in parsed.get('Items', []))
            self.read_bytes += size
            self.read_units += max(1, math.ceil(size / 4096))
        elif name == 'BatchGetItem':
            for items in parsed.get('Responses', {}).values():
                for item in items:
                    size = item_size(item)
                    self.read_bytes += size
                    self.read_units += max(1, math.ceil(size / 4096))
        elif name == 'UpdateItem':
            old = item_size(parsed.get('Attributes', {})) if parsed.get('Attributes') else 0
            self.write_units += max(1, math.ceil((old + 64) / 1024))  # + the few bytes an append adds

    def s3(self, model: Any, **_: Any) -> None:
        self.s3_calls[model.name] += 1


def seed(store: DynamoMemoryStore, ddb: Any, count: int, unobserved: int) -> OMRecord:
    """A thread with `count` messages and a head whose cursor leaves the last `unobserved` of them unobserved."""
    store._allocate(_thread_pk('r1', 't1'), 'r1', 't1', count, T0)
    requests = []
    for seq in range(1, count + 1):
        message = Message.model_validate(
            {
                'id': f'm{seq:06d}',
                'role': 'user' if seq % 2 else 'assistant',
                'createdAt': T0.isoformat(),
                'content': MESSAGE_TEXT,
            }
        )
        item = store._message_item(
            _thread_pk('r1', 't1'), 'r1/threads/t1/', message, message.content_hash(), 'r1', seq, 1
        )
        requests.append({'PutRequest': {'Item': item}})
        if len(requests) == 25:
            ddb.batch_write_item(RequestItems={store.table_name: requests})
            requests = []
    if requests:
        ddb.batch_write_item(RequestItems={store.table_name: requests})
    observations = '\n'.join(f'* 🔴 (09:{i % 60:02d}) User fact number {i} about the trip' for i in range(400))
    record = OMRecord(
        id='rec',
        key='thread:r1/t1',
        scope='thread',
        resource_id='r1',
        thread_id='t1',
        created_at=T0,
        updated_at=T0,
        active_observations=observations,
        observation_tokens=6000,
        cursors={'t1': count - unobserved},
    )
    return store.put_record(record, expected_version=None)


def make_engine(store: DynamoMemoryStore) -> MemoryEngine:
    """The real engine over the store; thresholds high enough that no model is ever called."""
    clock = ManualClock(T0)
    config = OMConfig.model_validate(
        {
            'model': 'offline',
            'observation': {'messageTokens': 1_000_000, 'bufferTokens': False},
            'reflection': {'observationTokens': 1_000_000},
        }
    )
    offline = OfflineLanguageModel()
    router = ModelRouter({'offline': offline, 'google': offline}, clock=clock)
    return MemoryEngine(config, store=store, router=router, counter=TokenCounter(get_tokenizer()), clock=clock)


def step(store: DynamoMemoryStore, n: int, *, include_record: bool, engine: MemoryEngine | None = None) -> int:
    """One steady-state step; returns how many messages the Actor would get."""
    message = Message.model_validate(
        {'id': f'step-{include_record}-{n}', 'role': 'user', 'createdAt': T0.isoformat(), 'content': MESSAGE_TEXT}
    )
    if engine is not None:
        return len(engine.prepare_step('r1', 't1', [message]).messages)
    appended = store.append_messages('r1', 't1', [message], now=T0, include_record=include_record)
    record = appended.record if appended.record_included else store.get_record('thread:r1/t1')
    assert record is not None
    after, seen = record.cursor('t1'), 0
    while True:  # the engine's _load_unobserved
        page = store.list_messages('r1', 't1', after_seq=after, limit=500)
        seen += len(page.messages)
        if not page.has_more or not page.messages:
            return seen
        after = page.messages[-1].seq or after


def measure(count: int, steps: int, unobserved: int) -> dict[str, dict[str, float]]:
    """Per-step figures for a thread of `count` messages."""
    ddb = boto3.client('dynamodb', region_name='us-east-1')
    s3 = boto3.client('s3', region_name='us-east-1')
    table, bucket = f'bench-{count}', f'bench-{count}'
    create_table(ddb, table)
    s3.create_bucket(Bucket=bucket)
    store = DynamoMemoryStore(table, bucket, dynamodb_client=ddb, s3_client=s3, clock=ManualClock(T0))
    started = time.monotonic()
    seed(store, ddb, count, unobserved)
    seeded_in = time.monotonic() - started
    out: dict[str, dict[str, float]] = {}
    engine = make_engine(store)
    for include_record in (False, True):
        use_engine = engine if include_record else None
        step(store, 0, include_record=include_record, engine=use_engine)  # warm: the head's S3 document is cached
        # Same starting window for both variants: the cursor leaves the last `unobserved` messages unobserved.
        head = store.get_record('thread:r1/t1')
        assert head is not None
        newest = store.list_messages('r1', 't1', limit=1, newest_first=True).messages[0].seq or 0
        store.put_record(
            head.model_copy(update={'cursors': {'t1': newest - unobserved}}), expected_version=head.version
        )
        meter = Meter()
        ddb.meta.events.register('provide-client-params.dynamodb', meter.before)
        ddb.meta.events.register('after-call.dynamodb', meter.after)
        s3.meta.events.register('provide-client-params.s3', meter.s3)
        for n in range(1, steps + 1):
            step(store, n + (1000 if include_record else 0), include_record=include_record, engine=use_engine)
        ddb.meta.events.unregister('provide-client-params.dynamodb', meter.before)
        ddb.meta.events.unregister('after-call.dynamodb', meter.after)
        s3.meta.events.unregister('provide-client-params.s3', meter.s3)
        out['engine step' if include_record else 'store: no head in append'] = {
            'calls': sum(meter.calls.values()) / steps,
            'read_units': meter.read_units / steps,
            'read_kb': meter.read_bytes / steps / 1024,
            'write_units': meter.write_units / steps,
            's3_calls': sum(meter.s3_calls.values()) / steps,
            'breakdown': dict(meter.calls),  # type: ignore[dict-item]
        }
    out['_seeded_s'] = {'value': seeded_in}
    return out


def main() -> int:
    """Print the figures and check the goals (≤ 3 calls per step; read units at 10,000 within 1.1× of 100)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--steps', type=int, default=20)
    parser.add_argument('--unobserved', type=int, default=20, help='messages after the cursor when the run starts')
    args = parser.parse_args()
    for name, value in {
        'AWS_ACCESS_KEY_ID': 'testing',
        'AWS_SECRET_ACCESS_KEY': 'testing',
        'AWS_DEFAULT_REGION': 'us-east-1',
        'AWS_ACCOUNT_ID_ENDPOINT_MODE': 'disabled',
    }.items():
        os.environ[name] = value
    results: dict[int, dict[str, dict[str, float]]] = {}
    with mock_aws(config={'core': {'reset_boto3_session': False}}):
        for count in (100, 10_000):
            results[count] = measure(count, args.steps, args.unobserved)
    print(
        f'steady-state step, {args.steps} steps, {args.unobserved} unobserved messages at the start (moto, in-process)'
    )
    print(
        f'{"messages":>9} {"variant":<25} {"calls/step":>10} {"RCU/step":>9} {"KB read":>8} '
        f'{"WCU/step":>9} {"S3/step":>8}  breakdown'
    )
    for count, by_variant in results.items():
        for variant, r in by_variant.items():
            if variant.startswith('_'):
                continue
            breakdown = ', '.join(f'{k} {v / args.steps:g}' for k, v in sorted(r['breakdown'].items()))  # type: ignore[union-attr]
            print(
                f'{count:>9} {variant:<25} {r["calls"]:>10.2f} {r["read_units"]:>9.2f} {r["read_kb"]:>8.1f} '
                f'{r["write_units"]:>9.2f} {r["s3_calls"]:>8.2f}  {breakdown}'
            )
    small, large = results[100]['engine step'], results[10_000]['engine step']
    ratio = large['read_units'] / small['read_units']
    calls_ok = large['calls'] <= 3 and small['calls'] <= 3
    print(f'goal ≤ 3 calls/step (engine step): {"met" if calls_ok else "NOT met"} ({large["calls"]:.2f})')
    print(f'goal RCU(10,000) ≤ 1.1 × RCU(100): {"met" if ratio <= 1.1 else "NOT met"} (ratio {ratio:.3f})')
    return 0 if calls_ok and ratio <= 1.1 else 1


if __name__ == '__main__':
    sys.exit(main())
