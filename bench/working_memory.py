"""What working memory costs: time per update (merge + JSON Schema validation) and DynamoDB calls per read and update.

    .venv/bin/python bench/working_memory.py [--updates 1000]

Runs in-process: the in-memory store for the CPU cost of an update, moto for the DynamoDB calls (counted with boto3's
`provide-client-params.dynamodb` hook, once per API call). Also prints the o200k size of the Actor's working-memory
block, which every step pays in input tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SCHEMA = {
    'type': 'object',
    'properties': {
        'name': {'type': 'string'},
        'location': {'type': 'string'},
        'preferences': {
            'type': 'object',
            'properties': {'style': {'type': 'string'}, 'deadlines': {'type': 'array', 'items': {'type': 'string'}}},
        },
    },
    'additionalProperties': False,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--updates', type=int, default=1000)
    args = parser.parse_args()

    from om_lib.adapters.memory.store import InMemoryStore
    from om_lib.adapters.tiktoken_counter import get_tokenizer
    from om_lib.clock import SystemClock
    from om_lib.config import WorkingMemoryConfig
    from om_lib.history.working_memory import WorkingMemory

    clock = SystemClock()
    for label, config, update in (
        ('markdown', {'enabled': True}, lambda i: f'# User\n- Name: Sam\n- Counter: {i}\n'),
        (
            'json',
            {'enabled': True, 'schema': SCHEMA},
            lambda i: {'preferences': {'deadlines': [f'2025-07-{i % 28:02d}']}},
        ),
    ):
        store = InMemoryStore()
        working = WorkingMemory(WorkingMemoryConfig.model_validate(config), store, clock)
        started = time.perf_counter()
        for i in range(args.updates):
            working.update('r1', None, update(i))
        per_update = (time.perf_counter() - started) / args.updates * 1e6
        store.create_thread('r1', 't1', now=clock.now())
        tokens = get_tokenizer().count(working.system_text('r1', 't1', read_only=False))
        print(f'{label:8} update (in-memory store): {per_update:7.1f} µs   Actor block: {tokens} o200k tokens')

    _dynamodb_calls()


def _dynamodb_calls() -> None:
    os.environ.update({'AWS_ACCESS_KEY_ID': 'x', 'AWS_SECRET_ACCESS_KEY': 'x', 'AWS_DEFAULT_REGION': 'eu-west-1'})
    import boto3
    from moto import mock_aws

    from om_lib.adapters.aws.dynamodb.schema import create_table
    from om_lib.adapters.aws.dynamodb.store import DynamoMemoryStore
    from om_lib.clock import SystemClock
    from om_lib.config import WorkingMemoryConfig
    from om_lib.history.working_memory import WorkingMemory

    with mock_aws():
        ddb, s3 = boto3.client('dynamodb'), boto3.client('s3')
        create_table(ddb, 'bench')
        s3.create_bucket(Bucket='bench', CreateBucketConfiguration={'LocationConstraint': 'eu-west-1'})
        calls: Counter[str] = Counter()
        ddb.meta.events.register('provide-client-params.dynamodb', lambda model, **_: calls.update([model.name]))
        store = DynamoMemoryStore('bench', 'bench', dynamodb_client=ddb, s3_client=s3)
        store.create_thread('r1', 't1', now=datetime.now(UTC))
        for scope in ('resource', 'thread'):
            config = WorkingMemoryConfig.model_validate({'enabled': True, 'scope': scope, 'schema': SCHEMA})
            working = WorkingMemory(config, store, SystemClock())
            working.update('r1', 't1', {'name': 'Sam'})
            calls.clear()
            working.update('r1', 't1', {'location': 'Berlin'})
            update = dict(calls)
            calls.clear()
            working.get('r1', 't1')
            print(f'{scope:8} scope DynamoDB calls: update {update}, read {dict(calls)}')


if __name__ == '__main__':
    main()
