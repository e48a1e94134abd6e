"""Semantic search over one resource's messages without a vector database: latency and index size.

    .venv/bin/python bench/vector_search.py [--messages 10000] [--threads 20] [--dims 256] [--queries 30]

Seeds `--messages` message vectors of one resource (spread over `--threads` threads, indexed in batches of 100 as the
embed jobs do) into the memory table through `DynamoVectorIndex` (moto, in-process), then times `search` of the
whole resource and of one thread. Vectors are random unit vectors (the embedding model's time is not what is
measured; a query embedding is one Gemini call, ~100-300 ms, or ~10 ms with the local model). Read units are computed
from the bytes each Query returned (eventually consistent: 4 KB per 0.5 RCU, summed per Query page).

Latency is split into the DynamoDB Query (moto in-process: no network, so it measures our decoding plus moto, not
AWS; in AWS expect ~10-20 ms per 1 MB page) and the exact int8 scan in pure Python (what a Lambda vCPU pays).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402

from om_lib import vectors as vec  # noqa: E402
from om_lib.adapters.aws.dynamodb.schema import create_table  # noqa: E402
from om_lib.adapters.aws.dynamodb.vectors import DynamoVectorIndex  # noqa: E402
from om_lib.ports import VectorEntry  # noqa: E402

TABLE = 'om-bench'
RESOURCE = 'user-bench'
SPACE = 'google/gemini-embedding-001@{dims}'


def item_bytes(item: dict) -> int:
    """Bytes DynamoDB counts for an item (names + values; binary and strings by length, numbers ~ digits/2 + 1)."""
    total = 0
    for name, value in item.items():
        kind, raw = next(iter(value.items()))
        size = len(raw) if kind == 'B' else len(raw.encode()) if kind == 'S' else math.ceil(len(raw) / 2) + 1
        total += len(name.encode()) + size
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--messages', type=int, default=10_000)
    parser.add_argument('--threads', type=int, default=20)
    parser.add_argument('--dims', type=int, default=256)
    parser.add_argument('--queries', type=int, default=30)
    args = parser.parse_args()
    for name, value in {
        'AWS_ACCESS_KEY_ID': 'bench',
        'AWS_SECRET_ACCESS_KEY': 'bench',
        'AWS_DEFAULT_REGION': 'eu-west-1',
    }.items():
        os.environ.setdefault(name, value)
    os.environ.pop('AWS_ENDPOINT_URL', None)
    rng = random.Random(42)
    space = SPACE.format(dims=args.dims)

    with mock_aws():
        ddb = boto3.client('dynamodb', region_name='eu-west-1')
        create_table(ddb, TABLE)
        index = DynamoVectorIndex(TABLE, dynamodb_client=ddb)
        per_thread = args.messages // args.threads
        started = time.perf_counter()
        kept: list[list[float]] = []
        for t in range(args.threads):
            for first in range(0, per_thread, 100):
                entries = []
                for seq in range(first + 1, min(first + 100, per_thread) + 1):
                    vector = [rng.gauss(0, 1) for _ in range(args.dims)]
                    if len(kept) < args.queries:
                        kept.append(vector)
                    entries.append(VectorEntry(f'msg_{t:03d}{seq:029x}', seq, vector))
                index.add(RESOURCE, f'thread-{t:03d}', entries, through_seq=entries[-1].seq, space=space)
        seeded_s = time.perf_counter() - started

        # Size: the packed vectors alone, and the whole items (keys, attribute names) as DynamoDB bills storage.
        stats = index.stats(RESOURCE)
        items = []
        kwargs: dict = {'TableName': TABLE}
        while True:
            page = ddb.scan(**kwargs)
            items += page['Items']
            if 'LastEvaluatedKey' not in page:
                break
            kwargs['ExclusiveStartKey'] = page['LastEvaluatedKey']
        stored = sum(item_bytes(i) for i in items)

        # Read cost of one resource-wide search: every Query page's bytes, 0.5 RCU per 4 KB (eventually consistent).
        pages: list[int] = []

        def count_page(parsed: dict, **_: object) -> None:
            if 'Items' in parsed:
                pages.append(sum(item_bytes(i) for i in parsed['Items']))

        ddb.meta.events.register('after-call.dynamodb.Query', count_page)

        def timed(thread_id: str | None) -> tuple[list[float], list[float], list[float]]:
            total, query_only, score_only = [], [], []
            for q in range(args.queries):
                query = [x + rng.gauss(0, 0.3) for x in kept[q % len(kept)]]  # a near-duplicate of a stored one
                t0 = time.perf_counter()
                entries = list(index._entries(RESOURCE, space, thread_id))
                t1 = time.perf_counter()
                vec.top_k(query, entries, 10)
                t2 = time.perf_counter()
                index.search(RESOURCE, query, space=space, top_k=10, thread_id=thread_id)
                t3 = time.perf_counter()
                query_only.append((t1 - t0) * 1e3)
                score_only.append((t2 - t1) * 1e3)
                total.append((t3 - t2) * 1e3)
            return total, query_only, score_only

        pages.clear()
        resource_total, resource_query, resource_score = timed(None)
        resource_pages = len(pages) / (2 * args.queries)
        resource_rcu = sum(math.ceil(b / 4096) * 0.5 for b in pages) / (2 * args.queries)
        pages.clear()
        thread_total, thread_query, thread_score = timed('thread-000')
        thread_rcu = sum(math.ceil(b / 4096) * 0.5 for b in pages) / (2 * args.queries)

        hit = index.search(RESOURCE, kept[0], space=space, top_k=1)[0]
        assert hit.message_id.startswith('msg_000') and hit.score > 0.99, hit

    def p(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    print(f'vector search: {args.messages} messages of one resource in {args.threads} threads, {args.dims} dims, int8')
    print(f'seeded in {seeded_s:.1f} s ({stats["items"]} items, batches of 100 as embed jobs write them)')
    print()
    print('index size')
    print(
        f'  packed vectors      {stats["bytes"] / stats["vectors"]:7.1f} bytes/message ({stats["bytes"] / 1e6:.2f} MB)'
    )
    print(
        f'  DynamoDB items      {stored / stats["vectors"]:7.1f} bytes/message ({stored / 1e6:.2f} MB, keys included)'
    )
    print(f'  as float32 JSON     ~{args.dims * 10:5d}   bytes/message (for comparison)')
    print()
    header = f'  {"search":<22} {"p50 ms":>8} {"p95 ms":>8} {"query ms":>9} {"scan ms":>8} {"pages":>6} {"RCU":>7}'
    print(f'latency over {args.queries} queries (top 10)')
    print(header)
    print(
        f'  {"whole resource":<22} {statistics.median(resource_total):8.1f} {p(resource_total, 0.95):8.1f} '
        f'{statistics.median(resource_query):9.1f} {statistics.median(resource_score):8.1f} '
        f'{resource_pages:6.1f} {resource_rcu:7.1f}'
    )
    print(
        f'  {"one thread":<22} {statistics.median(thread_total):8.1f} {p(thread_total, 0.95):8.1f} '
        f'{statistics.median(thread_query):9.1f} {statistics.median(thread_score):8.1f} '
        f'{"":>6} {thread_rcu:7.1f}'
    )
    return 0


if __name__ == '__main__':
    sys.exit(main())
