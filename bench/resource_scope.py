"""DynamoDB cost of a resource-scope step, for a resource with 10 threads and with 1,000 threads.

    .venv/bin/python bench/resource_scope.py [--steps 20] [--pending 3]

A steady-state step is a real `MemoryEngine.prepare_step` in resource scope over the DynamoDB store (moto,
in-process) when no observation is due: save the message, read the resource's record, list the pending threads, read
the current thread's unobserved messages and the other pending threads' (for the `<other-conversation>` blocks).
Every thread of the resource has been observed once (the record holds a cursor for each); `--pending` other threads
have new messages. The goal: calls and read units per step within 1.2× of each other at 10 and 1,000 threads — a
step must not read every thread of the resource.

Calls and read units are counted as in bench/store_calls.py (boto3 event hooks; read units from the bytes of the items
each read returned, with DynamoDB's rounding; moto's ConsumedCapacity measures nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402
from store_calls import MESSAGE_TEXT, T0, Meter  # noqa: E402

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


def message(mid: str) -> Message:
    return Message.model_validate({'id': mid, 'role': 'user', 'createdAt': T0.isoformat(), 'content': MESSAGE_TEXT})


def measure(threads: int, steps: int, pending: int) -> dict[str, Any]:
    ddb = boto3.client('dynamodb', region_name='us-east-1')
    s3 = boto3.client('s3', region_name='us-east-1')
    name = f'resource-{threads}'
    create_table(ddb, name)
    s3.create_bucket(Bucket=name)
    clock = ManualClock(T0)
    store = DynamoMemoryStore(name, name, dynamodb_client=ddb, s3_client=s3, clock=clock)
    thread_ids = [f'thread-{i:05d}-{"x" * 24}' for i in range(threads)]  # uuid-sized ids: the cursors map grows
    for tid in thread_ids:
        store.append_messages('r1', tid, [message(f'{tid}-first')], now=T0)
    observations = '\n'.join(
        f'<thread id="{thread_ids[i % threads]}">\nDate: Mar 1, 2025\n* 🔴 (09:00) User fact {i}\n</thread>'
        for i in range(200)
    )
    store.put_record(
        OMRecord(
            id='rec',
            key='resource:r1',
            scope='resource',
            resource_id='r1',
            thread_id=None,
            created_at=T0,
            updated_at=T0,
            active_observations=observations,
            observation_tokens=6000,
            cursors=dict.fromkeys(thread_ids, 1),
        ),
        expected_version=None,
    )
    for tid in thread_ids[1 : pending + 1]:
        store.append_messages('r1', tid, [message(f'{tid}-new')], now=T0 + timedelta(minutes=1), mark_pending=True)
    config = OMConfig.model_validate(
        {
            'model': 'offline',
            'scope': 'resource',
            'obscureThreadIds': False,
            'observation': {'messageTokens': 1_000_000},
            'reflection': {'observationTokens': 1_000_000},
        }
    )
    offline = OfflineLanguageModel()
    engine = MemoryEngine(
        config,
        store=store,
        router=ModelRouter({'offline': offline, 'google': offline}, clock=clock),
        counter=TokenCounter(get_tokenizer()),
        clock=clock,
    )
    current = thread_ids[0]
    engine.prepare_step('r1', current, [message('warm-up')])  # the record's S3 document is cached from here on
    meter = Meter()
    ddb.meta.events.register('provide-client-params.dynamodb', meter.before)
    ddb.meta.events.register('after-call.dynamodb', meter.after)
    s3.meta.events.register('provide-client-params.s3', meter.s3)
    others = 0
    for n in range(steps):
        result = engine.prepare_step('r1', current, [message(f'step-{n}')])
        others = result.system.count('<other-conversation')
    ddb.meta.events.unregister('provide-client-params.dynamodb', meter.before)
    ddb.meta.events.unregister('after-call.dynamodb', meter.after)
    s3.meta.events.unregister('provide-client-params.s3', meter.s3)
    return {
        'calls': sum(meter.calls.values()) / steps,
        'read_units': meter.read_units / steps,
        'read_kb': meter.read_bytes / steps / 1024,
        's3_calls': sum(meter.s3_calls.values()) / steps,
        'others': others,
        'breakdown': {k: v / steps for k, v in sorted(meter.calls.items())},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--steps', type=int, default=20)
    parser.add_argument('--pending', type=int, default=3, help='other threads with unobserved messages')
    args = parser.parse_args()
    for name, value in {
        'AWS_ACCESS_KEY_ID': 'testing',
        'AWS_SECRET_ACCESS_KEY': 'testing',
        'AWS_DEFAULT_REGION': 'us-east-1',
        'AWS_ACCOUNT_ID_ENDPOINT_MODE': 'disabled',
    }.items():
        os.environ[name] = value
    results: dict[int, dict[str, Any]] = {}
    with mock_aws(config={'core': {'reset_boto3_session': False}}):
        for threads in (10, 1000):
            results[threads] = measure(threads, args.steps, args.pending)
    print(f'resource-scope step, {args.steps} steps, {args.pending} other pending threads (moto, in-process)')
    print(f'{"threads":>8} {"calls/step":>10} {"RCU/step":>9} {"KB read":>8} {"S3/step":>8} {"blocks":>6}  breakdown')
    for threads, r in results.items():
        breakdown = ', '.join(f'{k} {v:g}' for k, v in r['breakdown'].items())
        print(
            f'{threads:>8} {r["calls"]:>10.2f} {r["read_units"]:>9.2f} {r["read_kb"]:>8.1f} {r["s3_calls"]:>8.2f} '
            f'{r["others"]:>6}  {breakdown}'
        )
    small, large = results[10], results[1000]
    calls_ratio = large['calls'] / small['calls']
    rcu_ratio = large['read_units'] / small['read_units']
    ok = calls_ratio <= 1.2 and rcu_ratio <= 1.2
    print(
        f'goal calls and RCU at 1,000 threads ≤ 1.2 × at 10: {"met" if ok else "NOT met"} '
        f'(calls {calls_ratio:.2f}×, RCU {rcu_ratio:.2f}×)'
    )
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
