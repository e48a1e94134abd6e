"""Uploads through presigned URLs (`POST /attachments`), and the rule that keeps an erase final for them.

A presigned upload URL stays valid for its whole lifetime whatever happens meanwhile: S3 checks only its signature.
So an erase cannot stop a late upload; instead the bucket reports every new upload, and an upload whose thread is gone,
or whose thread id now names another thread (erased and created again after the URL was issued), is deleted. Which
thread an upload was meant for is recorded in its object key: the thread's incarnation, that is its creation time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC

from om_lib.ports import MemoryStore
from om_lib.records import Thread


@dataclass(frozen=True)
class Upload:
    """Whose an uploaded object is: a thread of a resource, and which incarnation of that thread id.

    `incarnation` is None for keys written before it was recorded (then the thread's existence alone decides).
    """

    resource_id: str
    thread_id: str
    incarnation: str | None


def incarnation(thread: Thread) -> str:
    """The thread's incarnation: its creation time (UTC, to the microsecond), which a thread erased and created again
    under the same id never shares. Key-safe: digits, `T` and `Z`."""
    return thread.created_at.astimezone(UTC).strftime('%Y%m%dT%H%M%S%fZ')


def outlived_its_thread(store: MemoryStore, upload: Upload) -> bool:
    """Must the uploaded object go? True when its thread is gone or is another incarnation than the one it was for."""
    thread = store.get_thread(upload.resource_id, upload.thread_id)
    if thread is None:
        return True
    return upload.incarnation is not None and incarnation(thread) != upload.incarnation
