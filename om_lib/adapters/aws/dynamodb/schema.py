"""The memory table's key schema, in one place: the store, the local stack and the CDK app all read it from here.

See docs/storage.md for the items, the access patterns and why the table looks like this. Only the attributes that
take part in a key or an index are declared; everything else is schemaless.

`create_table` / `ensure_table` take a low-level client (moto, dynalite, the local stack or AWS) and create the table
with exactly this schema. Nothing here creates a client or talks to AWS at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from om_lib.adapters.aws.errors import aws_errors, error_code

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# Base table: one partition per thread (`THREAD#<resource_id>#<thread_id>`: thread ids are scoped to their resource)
# and one per resource (`RESOURCE#<resource_id>`).
PK = 'PK'
SK = 'SK'

# LSI: a thread's messages (and sequence placeholders) ordered by the server-assigned `seq`. Local, so reads can be
# strongly consistent (a cursor read must see every message written before it) and share the thread's partition.
SEQ_INDEX = 'LSI1'
SEQ = 'seq'

# GSI: a resource's threads, oldest first (`RES#<resource_id>`, `<created_at ISO>#<thread_id>`). Keys only: the
# thread item is rewritten on every append, and a projection of more attributes would copy every one of those writes.
THREADS_INDEX = 'GSI1'
GSI1_PK = 'GSI1PK'
GSI1_SK = 'GSI1SK'

# GSI: threads that need the sweeper's attention (sparse: only thread items with new messages since the sweeper last
# found nothing to do). Sharded partitions (`ATTN#<0..3>`), sorted by the last activity, so the schedule Queries for
# threads that went quiet instead of Scanning the table. Projects `resource_id`, which the sweeper needs.
ATTENTION_INDEX = 'GSI2'
ATTN_PK = 'ATTNPK'
ATTN_SK = 'ATTNSK'
ATTENTION_SHARDS = 4

# GSI: a resource's pending threads in resource scope (sparse: only thread items with messages the resource's record
# has not observed; `PEND#<resource_id>`, `<pending since ISO>#<thread_id>`), so a step reads the threads that have
# something to observe, never every thread of the resource. Keys only: the thread id and the time are in the keys.
PENDING_INDEX = 'GSI3'
PEND_PK = 'PENDPK'
PEND_SK = 'PENDSK'

# TTL attribute (epoch seconds). Only tombstones carry it; the CDK app enables TTL on it.
TTL_ATTRIBUTE = 'expires_at'

ATTRIBUTE_DEFINITIONS: list[dict[str, str]] = [
    {'AttributeName': PK, 'AttributeType': 'S'},
    {'AttributeName': SK, 'AttributeType': 'S'},
    {'AttributeName': SEQ, 'AttributeType': 'N'},
    {'AttributeName': GSI1_PK, 'AttributeType': 'S'},
    {'AttributeName': GSI1_SK, 'AttributeType': 'S'},
    {'AttributeName': ATTN_PK, 'AttributeType': 'S'},
    {'AttributeName': ATTN_SK, 'AttributeType': 'S'},
    {'AttributeName': PEND_PK, 'AttributeType': 'S'},
    {'AttributeName': PEND_SK, 'AttributeType': 'S'},
]
KEY_SCHEMA: list[dict[str, str]] = [
    {'AttributeName': PK, 'KeyType': 'HASH'},
    {'AttributeName': SK, 'KeyType': 'RANGE'},
]
LOCAL_SECONDARY_INDEXES: list[dict[str, Any]] = [
    {
        'IndexName': SEQ_INDEX,
        'KeySchema': [{'AttributeName': PK, 'KeyType': 'HASH'}, {'AttributeName': SEQ, 'KeyType': 'RANGE'}],
        'Projection': {'ProjectionType': 'ALL'},
    }
]
GLOBAL_SECONDARY_INDEXES: list[dict[str, Any]] = [
    {
        'IndexName': THREADS_INDEX,
        'KeySchema': [{'AttributeName': GSI1_PK, 'KeyType': 'HASH'}, {'AttributeName': GSI1_SK, 'KeyType': 'RANGE'}],
        'Projection': {'ProjectionType': 'KEYS_ONLY'},
    },
    {
        'IndexName': ATTENTION_INDEX,
        'KeySchema': [{'AttributeName': ATTN_PK, 'KeyType': 'HASH'}, {'AttributeName': ATTN_SK, 'KeyType': 'RANGE'}],
        'Projection': {'ProjectionType': 'INCLUDE', 'NonKeyAttributes': ['resource_id']},
    },
    {
        'IndexName': PENDING_INDEX,
        'KeySchema': [{'AttributeName': PEND_PK, 'KeyType': 'HASH'}, {'AttributeName': PEND_SK, 'KeyType': 'RANGE'}],
        'Projection': {'ProjectionType': 'KEYS_ONLY'},
    },
]


def table_definition(table_name: str) -> dict[str, Any]:
    """The `CreateTable` arguments of the memory table (on-demand billing)."""
    return {
        'TableName': table_name,
        'AttributeDefinitions': ATTRIBUTE_DEFINITIONS,
        'KeySchema': KEY_SCHEMA,
        'LocalSecondaryIndexes': LOCAL_SECONDARY_INDEXES,
        'GlobalSecondaryIndexes': GLOBAL_SECONDARY_INDEXES,
        'BillingMode': 'PAY_PER_REQUEST',
    }


def create_table(client: DynamoDBClient, table_name: str, *, wait: bool = True) -> None:
    """Create the memory table and (best effort) enable TTL on `expires_at`.

    Args:
        client: A low-level DynamoDB client.
        table_name: The table to create.
        wait: Block until the table is ACTIVE (dynalite creates tables asynchronously).
    """
    with aws_errors():
        client.create_table(**table_definition(table_name))
        if wait:
            client.get_waiter('table_exists').wait(
                TableName=table_name,
                # A fractional delay works (botocore sleeps it): dynalite creates a table in milliseconds.
                WaiterConfig={'Delay': 0.2, 'MaxAttempts': 100},  # type: ignore[typeddict-item]
            )
    try:
        client.update_time_to_live(
            TableName=table_name, TimeToLiveSpecification={'Enabled': True, 'AttributeName': TTL_ATTRIBUTE}
        )
    except client.exceptions.ClientError as exc:
        # dynalite has no TTL API; tombstones then simply stay (they hold no user data).
        if error_code(exc) not in {'UnknownOperationException', 'ValidationException'}:
            raise


def ensure_table(client: DynamoDBClient, table_name: str) -> bool:
    """Create the memory table if it does not exist. Returns True when it was created."""
    try:
        client.describe_table(TableName=table_name)
        return False
    except client.exceptions.ResourceNotFoundException:
        create_table(client, table_name)
        return True
