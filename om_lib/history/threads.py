"""Listing a resource's threads with the seed's filters and ordering (metadata equality, createdAt/updatedAt)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from om_lib.ports import MemoryStore
from om_lib.records import Thread

PAGE_SIZE = 100


def list_resource_threads(
    store: MemoryStore,
    resource_id: str,
    *,
    page: int = 0,
    per_page: int | None = 100,
    order_by: Literal['createdAt', 'updatedAt'] = 'createdAt',
    direction: Literal['ASC', 'DESC'] = 'DESC',
    metadata: Mapping[str, str] | None = None,
) -> tuple[list[Thread], bool]:
    """One page of a resource's threads and whether more follow. `per_page=None` asks for all of them.

    Metadata filters compare the thread's metadata value as text (query strings are text). The store lists a
    resource's threads through an index in creation order, so a page in creation order reads only the threads up
    to that page; ordering by `updatedAt` and filtering happen here, and their cost grows with the resource's
    thread count (bounded by the index page size per call).
    """
    if page < 0:
        raise ValueError('page starts at 0')
    wanted = dict(metadata or {})
    if order_by == 'createdAt' and not wanted and per_page is not None:
        return _page_in_creation_order(store, resource_id, page, per_page, newest_first=direction == 'DESC')
    threads: list[Thread] = []
    cursor: str | None = None
    while True:
        chunk = store.list_threads(resource_id, limit=PAGE_SIZE, cursor=cursor)
        threads.extend(t for t in chunk.threads if _matches(t, wanted))
        cursor = chunk.next_cursor
        if cursor is None:
            break
    attr = 'created_at' if order_by == 'createdAt' else 'updated_at'
    threads.sort(key=lambda t: (getattr(t, attr), t.id), reverse=direction == 'DESC')
    if per_page is None:
        return threads, False
    start = page * per_page
    return threads[start : start + per_page], len(threads) > start + per_page


def _page_in_creation_order(
    store: MemoryStore, resource_id: str, page: int, per_page: int, *, newest_first: bool
) -> tuple[list[Thread], bool]:
    """The index is in creation order: read only as far as the page asked for (plus one, to know if more follow)."""
    wanted = (page + 1) * per_page + 1
    threads: list[Thread] = []
    cursor: str | None = None
    while len(threads) < wanted:
        chunk = store.list_threads(
            resource_id, limit=min(PAGE_SIZE, wanted - len(threads)), cursor=cursor, newest_first=newest_first
        )
        threads.extend(chunk.threads)
        cursor = chunk.next_cursor
        if cursor is None:
            break
    start = page * per_page
    return threads[start : start + per_page], len(threads) > start + per_page


def _matches(thread: Thread, wanted: Mapping[str, str]) -> bool:
    for key, value in wanted.items():
        actual = thread.metadata.get(key)
        text = (
            ('true' if actual else 'false') if isinstance(actual, bool) else (None if actual is None else str(actual))
        )
        if text != value:
            return False
    return True
