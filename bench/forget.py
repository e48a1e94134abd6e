"""What deleting messages costs in a long thread: the store calls of `DELETE /threads/{id}/messages`, which also removes
what was derived from them (om_lib/history/forgetting.py) from the live memory, every earlier generation and the
vectors.

    .venv/bin/python bench/forget.py [--messages 1000 10000] [--generations 40] [--repeat 3]

Each thread has N messages, every one indexed (256-dimension vectors in the memory table), and a memory of G
generations (a reflection every N/G messages, each log ~24 KB so it lives in S3). Cases, each on a fresh copy:
- the newest message, not yet observed: no generation holds it (the live memory only disowns work in flight);
- a message only the current generation observed: the head is reset, one earlier generation dropped;
- the first message, which every generation observed: every generation dropped.

The point is the shape: the cost follows the number of generations and of the vector batches that hold the deleted
messages, not the number of messages in the thread. Calls are counted with boto3 event hooks and read units computed
from the bytes each read returned (bench/store_calls.py); `ms` is moto's, in-process, a relative figure only.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from history import T0, _aws_env, _metered, _store  # noqa: E402
from moto import mock_aws  # noqa: E402

from om_lib.adapters.aws.dynamodb.store import DynamoMemoryStore  # noqa: E402
from om_lib.adapters.aws.dynamodb.vectors import DynamoVectorIndex  # noqa: E402
from om_lib.clock import ManualClock  # noqa: E402
from om_lib.history import history  # noqa: E402
from om_lib.history.semantic import SemanticMemory  # noqa: E402
from om_lib.messages import Message  # noqa: E402
from om_lib.models.embedders import HashingEmbedder  # noqa: E402
from om_lib.records import ObservationGroup, OMRecord  # noqa: E402

LOG_LINE = '* 🔴 (09:00) User said something worth keeping about the Lisbon trip and the people in it\n'


def build(name: str, messages: int, generations: int) -> tuple[Any, Any, Any, SemanticMemory]:
    store, ddb, s3 = _store(name)
    batch: list[Message] = []
    for seq in range(1, messages + 1):
        at = (T0 + timedelta(seconds=seq)).isoformat()
        batch.append(
            Message.model_validate({'id': f'm{seq:06d}', 'role': 'user', 'createdAt': at, 'content': f'n{seq}'})
        )
        if len(batch) == 100 or seq == messages:
            store.append_messages('r1', 't1', batch, now=T0)
            batch = []
    semantic = SemanticMemory(store, DynamoVectorIndex(name, dynamodb_client=ddb), HashingEmbedder())
    semantic.index_thread('r1', 't1', deadline=10**12)
    per = max(1, (messages - 1) // generations)  # the newest message stays unobserved
    record: OMRecord | None = None
    for g in range(generations):
        through = per * (g + 1)
        group = ObservationGroup(
            id=f'g{g}', thread_id='t1', start_id='m000001', end_id=f'm{through:06d}', start_seq=1, end_seq=through,
            created_at=T0,
        )  # fmt: skip
        fields = {
            'id': f'rec-{g}', 'generation': g, 'origin': 'reflection' if g else 'initial', 'cursors': {'t1': through},
            'groups': (group,), 'active_observations': f'Date: Mar 1, 2025\n{LOG_LINE * 280}',
        }  # fmt: skip
        if record is None:
            base = OMRecord(id='x', key='thread:r1/t1', scope='thread', resource_id='r1', thread_id='t1',
                            created_at=T0, updated_at=T0)  # fmt: skip
            record = store.put_record(base.model_copy(update=fields), expected_version=None)
        else:
            record = store.put_generation(record.model_copy(update=fields), expected_version=record.version)
    return store, ddb, s3, semantic


def bench(messages: int, generations: int, repeat: int) -> dict[str, dict[str, float]]:
    per = max(1, (messages - 1) // generations)
    cases = {
        'newest (unobserved)': f'm{messages:06d}',
        'observed by the head only': f'm{per * generations:06d}',
        'first (in every generation)': 'm000001',
    }
    rows = {}
    for n, (name, message_id) in enumerate(cases.items()):
        results = []
        for r in range(repeat):
            table = f'forget-{messages}-{n}-{r}'
            _, ddb, s3, semantic = build(table, messages, generations)
            # A cold process: nothing of the bucket cached (a warm Lambda may have the logs in memory already).
            store = DynamoMemoryStore(table, table, dynamodb_client=ddb, s3_client=s3, clock=ManualClock(T0))
            semantic = SemanticMemory(store, semantic.index, semantic.embedder)

            def delete(store: Any = store, semantic: SemanticMemory = semantic, message_id: str = message_id) -> None:
                history.forget_messages(store, 'r1', 't1', [message_id], now=T0, semantic=semantic)

            results.append(_metered(ddb, s3, delete, 1))
            left = len(store.list_generations('thread:r1/t1', limit=1000))
            results[-1]['generations_left'] = left
        rows[name] = {k: sum(r[k] for r in results) / repeat for k in results[0]}
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--messages', type=int, nargs='+', default=[1000, 10_000])
    parser.add_argument('--generations', type=int, default=40)
    parser.add_argument('--repeat', type=int, default=1)
    args = parser.parse_args()
    _aws_env()
    with mock_aws(config={'core': {'reset_boto3_session': False}}):
        for count in args.messages:
            rows = bench(count, args.generations, args.repeat)
            print(f'delete one message: a thread of {count} messages (all indexed), {args.generations} generations')
            print(
                f'  {"which message":<30} {"calls":>6} {"RCU":>7} {"KB read":>8} {"S3":>4} {"gens left":>9} {"ms":>7}'
            )
            for name, r in rows.items():
                print(
                    f'  {name:<30} {r["calls"]:>6.0f} {r["read_units"]:>7.0f} {r["read_kb"]:>8.0f} '
                    f'{r["s3_calls"]:>4.0f} {r["generations_left"]:>9.0f} {r["ms_moto"]:>7.0f}'
                )
    return 0


if __name__ == '__main__':
    sys.exit(main())
