"""The memory table's item layout, pure: keys, attribute values, and items to records and back.

Items (docs/storage.md has the whole design and the reasons):

    PK = THREAD#<resource_id>#<thread_id>   (thread ids are scoped to their resource)
      SK = META                 thread (owner, times, title/metadata/hints), `next_seq`, incarnation `inc`, and the
                                thread-scope OM head (`om_*`, optimistic lock `om_version`); GSI1 keys
      SK = MSG#<message_id>     one immutable message; `seq` (LSI1 sort key), content hash, write time
      SK = GAP#<inc>#<seq>      placeholder for a sequence number that was allocated but will never hold a message
      SK = OMGEN#<generation>   a retired generation of the thread-scope record (history)
    PK = RESOURCE#<resource_id>
      SK = META                 the resource-scope OM head (`om_*`), or the resource's tombstone
      SK = OMGEN#<generation>   retired generations of the resource-scope record

Nothing here reads or writes: the store's parts (`table`, `threads`, `records`, `messages`, `store`) build and
read their items with these.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, unquote

from botocore.exceptions import ClientError

from om_lib.adapters.aws.dynamodb import schema
from om_lib.adapters.aws.errors import error_code
from om_lib.adapters.aws.s3 import resource_prefix, thread_prefix
from om_lib.errors import MessageConflictError
from om_lib.messages import FilePart, ImagePart, Message
from om_lib.records import OMRecord, Thread, WorkingMemoryRecord

Item = dict[str, Any]

THREAD = 'THREAD#'
META = 'META'
MSG = 'MSG#'
GAP = 'GAP#'
OMGEN = 'OMGEN#'
FAIL = 'FAIL#'  # a kept failure (recentFailures), in the thread's or the resource's partition
FAILURE_TTL = timedelta(days=30)
WM = 'WM'  # working memory: in the thread partition (thread scope) or the resource partition (resource scope)
TURN = 'TURN#'  # a claim on answering a user message (chat), in the thread's partition, with a TTL
TURN_CLAIM_TTL = timedelta(days=1)  # past its lease a claim is dead; TTL removes what a crash left behind

# OM record fields that can grow without bound. They travel together as one JSON document (`om_big`), inline while
# small and in S3 above `inline_head_max_bytes`; everything else (`om_small`) is a few hundred bytes. Lease changes
# touch only `om_small`, so taking or releasing a lease never rewrites the S3 document. The parts background work
# keeps for the next step (a worker's observation text among them) grow too; a record written before they moved here
# has them in `om_small`, which still reads back (the big document wins only for the fields it holds).
BIG_FIELDS = (
    'active_observations',
    'groups',
    'archived',
    'buffered_chunks',
    'buffered_reflection',
    'cursors',
    'background_parts',
)
OM_OPTIONAL_FIELDS = frozenset(
    name for name, field in OMRecord.model_fields.items() if not field.is_required() and field.default in (None, ())
)
OM_ATTRS = ('om_key', 'om_id', 'om_version', 'om_generation', 'om_small', 'om_big', 'om_big_ref')
THREAD_ATTRS = ('thread_doc', 'thread_doc_ref')
MAX_READ_ATTEMPTS = 3
LIVE_THREAD_OF_R = 'resource_id = :r AND attribute_exists(created_at) AND attribute_not_exists(erased_at)'
BATCH_WRITE = 25
BATCH_GET = 100
# Printable ASCII but `#` and `%` stays as it is in keys (readable in the console); the rest is percent-encoded.
_KEY_SAFE = ''.join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '#%')


# ---------------------------------------------------------------------------------------------------------------------
# Attribute values (low-level client: numbers travel as strings, so no Decimal anywhere)
# ---------------------------------------------------------------------------------------------------------------------
def attention_pk(pk: str) -> str:
    shard = zlib.crc32(pk.encode()) % schema.ATTENTION_SHARDS
    return f'ATTN#{shard}'


def str_value(value: str) -> dict[str, str]:
    return {'S': value}


def num_value(value: int) -> dict[str, str]:
    return {'N': str(value)}


def item_str(item: Item, name: str) -> str | None:
    value = item.get(name)
    return value['S'] if value is not None and 'S' in value else None


def item_int(item: Item, name: str, default: int = 0) -> int:
    value = item.get(name)
    return int(value['N']) if value is not None and 'N' in value else default


def utc_iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat()


def dump_json(value: Any) -> str:
    return json.dumps(value, separators=(',', ':'), ensure_ascii=False, sort_keys=True)


def is_conditional_failure(exc: ClientError) -> bool:
    return error_code(exc) == 'ConditionalCheckFailedException'


@dataclass(frozen=True)
class BigFields:
    """The OM head's large fields as stored: inline JSON, or the S3 key of that JSON."""

    inline: str | None
    key: str | None
    uploaded: str | None  # the key this write uploaded (deleted again when the write loses)
    digest: str


@dataclass(frozen=True)
class HeadTarget:
    """Where a record key's head lives."""

    pk: str
    resource_id: str
    thread_id: str | None
    prefix: str  # S3 prefix of the key's offloaded documents


# ---------------------------------------------------------------------------------------------------------------------
# Keys, and items to domain values and back
# ---------------------------------------------------------------------------------------------------------------------
def item_key(pk: str, sk: str) -> Item:
    return {schema.PK: str_value(pk), schema.SK: str_value(sk)}


def key_part(value: str) -> str:
    # `#` separates the parts of a key and `%` escapes: quoting both keeps every (resource, thread) pair its own key,
    # whatever the ids hold (the id grammar already refuses them; the store does not rely on it).
    return quote(value, safe=_KEY_SAFE)


def thread_pk(resource_id: str, thread_id: str) -> str:
    """A thread's partition: thread ids are scoped to their resource (two resources may each own a `t1`)."""
    return f'{THREAD}{key_part(resource_id)}#{key_part(thread_id)}'


def ids_of_thread_pk(pk: str) -> tuple[str, str] | None:
    """(resource id, thread id) of a thread partition key, or None for any other key."""
    if not pk.startswith(THREAD):
        return None
    resource, sep, thread = pk[len(THREAD) :].partition('#')
    return (unquote(resource), unquote(thread)) if sep and resource and thread else None


def resource_pk(resource_id: str) -> str:
    return f'RESOURCE#{resource_id}'


def gsi_pk(resource_id: str) -> str:
    return f'RES#{resource_id}'


def pending_pk(resource_id: str) -> str:
    return f'PEND#{resource_id}'


def epoch_ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def update_expression(set_parts: list[str], remove: list[str]) -> str:
    expr = 'SET ' + ', '.join(set_parts)
    return expr + (' REMOVE ' + ', '.join(remove) if remove else '')


def target_of(record: OMRecord) -> HeadTarget:
    if record.scope == 'resource' or record.key.startswith('resource:'):
        return HeadTarget(
            resource_pk(record.resource_id),
            record.resource_id,
            None,
            resource_prefix(record.resource_id) + 'resource/',
        )
    thread_id = record.thread_id or ''
    return HeadTarget(
        thread_pk(record.resource_id, thread_id),
        record.resource_id,
        thread_id,
        thread_prefix(record.resource_id, thread_id),
    )


def targets_of(key: str) -> list[HeadTarget]:
    """Where the head of a record key can live (`thread:<resource>/<thread>` is ambiguous when ids contain `/`)."""
    if key.startswith('resource:'):
        resource_id = key[len('resource:') :]
        return [HeadTarget(resource_pk(resource_id), resource_id, None, resource_prefix(resource_id) + 'resource/')]
    if not key.startswith('thread:'):
        return []
    rest = key[len('thread:') :]
    out = []
    for index, char in enumerate(rest):
        if char == '/':
            resource_id, thread_id = rest[:index], rest[index + 1 :]
            pk = thread_pk(resource_id, thread_id)
            out.append(HeadTarget(pk, resource_id, thread_id, thread_prefix(resource_id, thread_id)))
    return out


def thread_doc(thread: Thread) -> dict[str, Any]:
    return {
        'title': thread.title,
        'title_pinned': thread.title_pinned,
        'metadata': thread.metadata,
        'current_task': thread.current_task,
        'suggested_response': thread.suggested_response,
    }


def working_memory_from_item(item: Item, resource_id: str, thread_id: str | None) -> WorkingMemoryRecord:
    return WorkingMemoryRecord(
        scope='thread' if thread_id is not None else 'resource',
        resource_id=resource_id,
        thread_id=thread_id,
        format='json' if item_str(item, 'wm_format') == 'json' else 'markdown',
        content=json.loads(item_str(item, 'wm_doc') or '""'),
        updated_at=datetime.fromisoformat(item_str(item, 'updated_at') or '1970-01-01T00:00:00+00:00'),
        version=item_int(item, 'wm_version'),
    )


def gap_item(pk: str, inc: int, seq: int, resource_id: str, written_ms: int) -> Item:
    """A `GAP#` placeholder: `seq` will never hold a message (a refused append, a retry, a deleted message)."""
    return {
        **item_key(pk, f'{GAP}{inc:06d}#{seq:012d}'),
        schema.SEQ: num_value(seq),
        'inc': num_value(inc),
        'gap': {'BOOL': True},
        'written_at': num_value(written_ms),
        'resource_id': str_value(resource_id),
    }


def is_live_thread(item: Item | None, resource_id: str) -> bool:
    return (
        item is not None
        and item_str(item, 'resource_id') == resource_id
        and 'created_at' in item
        and 'erased_at' not in item
    )


def is_message_of(item: Item, resource_id: str) -> bool:
    return (item_str(item, schema.SK) or '').startswith(MSG) and item_str(item, 'resource_id') == resource_id


def current_incarnation(items: list[Item]) -> list[Item]:
    """Drop items of an erased incarnation that a late write put back (seq numbers restart with each incarnation)."""
    if not items:
        return items
    newest = max(item_int(i, 'inc', 1) for i in items)
    return [i for i in items if item_int(i, 'inc', 1) == newest]


def has_inline_data(message: Message) -> bool:
    return any(isinstance(p, ImagePart | FilePart) and p.data for p in message.parts)


def dedupe(messages: Sequence[Message]) -> list[Message]:
    """Messages in order, each id once; the same id twice with other content is a conflict (nothing written)."""
    seen: dict[str, str] = {}
    out: list[Message] = []
    for message in messages:
        digest = message.content_hash()
        if message.id in seen:
            if seen[message.id] != digest:
                raise MessageConflictError(message.id)
            continue
        seen[message.id] = digest
        out.append(message)
    return out
