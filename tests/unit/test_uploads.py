"""Whose an uploaded object is (its key names the thread's incarnation), and when it must go."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import quote_plus

from om_lib.adapters.aws.s3 import attachment_key, notified_key, parse_attachment_key
from om_lib.adapters.memory.store import InMemoryStore
from om_lib.uploads import Upload, incarnation, outlived_its_thread

T0 = datetime(2026, 11, 28, 10, 15, 0, 123456, tzinfo=UTC)


def test_an_attachment_key_names_its_resource_thread_and_incarnation_and_reads_back():
    upload = Upload('user:1/ü', 'trip ?#', '20261128T101500123456Z')
    key = attachment_key(upload, 'my notes.pdf', '0123456789abcdef0123456789abcdef')
    assert key.startswith('user%3A1%2F%C3%BC/threads/trip%20%3F%23/attachments/20261128T101500123456Z-')
    assert parse_attachment_key(key) == upload
    # As a notification may carry it (URL-encoded), and a key from before incarnations were recorded
    assert parse_attachment_key(notified_key(quote_plus(key))) == upload
    old = 'r1/threads/t1/attachments/0123456789abcdef0123456789abcdef/a.png'
    assert parse_attachment_key(old) == Upload('r1', 't1', None)
    for other in ('r1/threads/t1/att/abc', 'r1/resource/om/x.json', 'r1/threads/t1/attachments/nothex/a', 'x'):
        assert parse_attachment_key(other) is None


def test_an_upload_outlives_its_thread_when_the_thread_is_gone_or_is_another_incarnation():
    store = InMemoryStore()
    thread = store.create_thread('r1', 't1', now=T0)
    mine = Upload('r1', 't1', incarnation(thread))
    assert incarnation(thread) == '20261128T101500123456Z'
    assert not outlived_its_thread(store, mine) and not outlived_its_thread(store, Upload('r1', 't1', None))
    store.delete_thread('r1', 't1')
    assert outlived_its_thread(store, mine) and outlived_its_thread(store, Upload('r1', 't1', None))
    store.create_thread('r1', 't1', now=T0 + timedelta(seconds=1))  # the same id, a new thread
    assert outlived_its_thread(store, mine)
    assert outlived_its_thread(store, Upload('r2', 't1', incarnation(thread)))  # another resource's thread id
