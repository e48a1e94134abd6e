"""MemoryClient and AsyncMemoryClient against the local stack over real HTTP: every route, errors, retries' safety,
attachments uploaded to the (moto) S3 bucket, and 50 concurrent steps on different threads."""

from __future__ import annotations

import asyncio
import time

import pytest
from om_client import AsyncMemoryClient, MemoryClient, Message
from om_client.errors import BufferingDisabled, InvalidRequest, MessageConflict, NotFound, ThreadExists, ThreadNotFound
from om_client.models import ImagePart, ToolCallPart, ToolResultPart

from om_cli.local_stack import LocalStack

LONG = 'I am planning a three week trip through Portugal with my sister; we love trains, old towns and seafood. '


def test_a_conversation_round_trip(stack: LocalStack, resource_id: str, thread_id: str) -> None:
    with MemoryClient(stack.url, resource_id=resource_id) as om:
        # Given a step, a turn with a tool round, and the same step sent again (a retry)
        question = Message.user('Which trains go from Lisbon to Porto?')
        step = om.step(thread_id, [question])
        again = om.step(thread_id, [question])
        call = Message(
            role='assistant', parts=[ToolCallPart(tool_call_id='c1', tool_name='trains', args={'to': 'Porto'})]
        )
        result = Message(role='tool', parts=[ToolResultPart(tool_call_id='c1', tool_name='trains', result=['IC 521'])])
        turn = om.turn(thread_id, [call, result, 'The IC 521 leaves at 9:00.'])

        # Then the answers are typed, the retry stored nothing twice, and history keeps order and parts
        assert step.thread_id == thread_id and step.status is not None
        assert [m.id for m in again.messages] == [question.id]
        assert turn.saved == [call.id, result.id, turn.saved[2]]
        history = om.messages(thread_id)
        assert [m.role for m in history.messages] == ['user', 'assistant', 'tool', 'assistant']
        assert history.messages[2].parts[0] == ToolResultPart(tool_call_id='c1', tool_name='trains', result=['IC 521'])
        assert history.messages[3].text() == 'The IC 521 leaves at 9:00.'

        # And other content under a stored id is a conflict that writes nothing
        with pytest.raises(MessageConflict):
            om.step(thread_id, [Message.user('something else', id=question.id)])
        assert len(om.messages(thread_id).messages) == 4


def test_memory_observations_and_queries(stack: LocalStack, resource_id: str, thread_id: str) -> None:
    with MemoryClient(stack.url, resource_id=resource_id) as om:
        for n in range(3):
            om.step(thread_id, [f'{LONG * 6} Note {n}.'])
            om.turn(thread_id, [f'Noted {n}.'])

        # The turns past messageTokens queue an observation; a later step or the worker finishes it.
        deadline = time.monotonic() + 20
        while not om.memory(thread_id).observations and time.monotonic() < deadline:
            om.step(thread_id)
            time.sleep(0.2)
        memory = om.memory(thread_id)

        assert 'Portugal' in memory.observations and memory.thresholds is not None
        assert memory.thresholds.message_tokens == 400
        # When memory acts next, typed: tokens left to each threshold; no sweeper runs on this stack
        assert memory.upcoming is not None
        assert memory.upcoming.observation.tokens_left == max(0, 400 - memory.pending_message_tokens)
        assert memory.upcoming.reflection.tokens_left == max(
            0, memory.thresholds.observation_tokens - memory.observation_tokens
        )
        assert memory.upcoming.quiet_sweep.quiet_after_seconds == 1800
        assert memory.upcoming.quiet_sweep.interval_seconds is None and memory.upcoming.quiet_sweep.swept_by is None
        step = om.step(thread_id)
        assert 'Portugal' in step.system and {t.name for t in step.tools} >= {'recall'}
        first = om.messages(thread_id, per_page=2)
        assert first.has_more and len(first.messages) == 2
        every = list(om.iter_messages(thread_id, per_page=2))
        assert len(every) == 6
        # Newest first: page 0 holds the two newest, newest at the top
        newest = om.messages(thread_id, per_page=2, direction='DESC')
        assert [m.id for m in newest.messages] == [every[5].id, every[4].id] and newest.has_more
        around = om.query_messages(thread_id, per_page=0, include=[{'id': first.messages[1].id, 'withNextMessages': 1}])
        assert [m.id for m in around.messages][:1] == [first.messages[1].id] and len(around.messages) == 2
        recalled = om.recall(thread_id, limit=2)
        assert recalled.count == 2 and 'Portugal' in recalled.as_text()


def test_threads_working_memory_and_erase(stack: LocalStack, resource_id: str) -> None:
    with MemoryClient(stack.url, resource_id=resource_id) as om:
        created = om.create_thread(title='Trip', metadata={'topic': 'travel'})
        om.step(created.id, ['We land in Lisbon on May 3rd.'])
        with pytest.raises(ThreadExists):
            om.create_thread(thread_id=created.id)
        renamed = om.update_thread(created.id, title='Portugal trip')
        clone = om.clone_thread(created.id, title='Copy')
        listed = om.list_threads(metadata={'topic': 'travel'})
        working = om.update_working_memory('# User\n- lands in Lisbon on May 3rd', thread_id=created.id)

        assert renamed.title == 'Portugal trip' and renamed.metadata == {'topic': 'travel'}
        assert clone.thread.metadata['clonedFrom'] and [m.text() for m in clone.cloned_messages] == [
            'We land in Lisbon on May 3rd.'
        ]
        assert {t.id for t in listed.threads} == {created.id, clone.thread.id}
        assert working.format == 'markdown' and 'May 3rd' in str(
            om.get_working_memory(thread_id=created.id).working_memory
        )

        om.delete_thread(created.id)
        with pytest.raises(ThreadNotFound):
            om.get_thread(created.id)
        with pytest.raises(ThreadNotFound):
            om.memory(created.id, resource_id='someone-else')
        om.delete_resource()
        assert om.list_threads().threads == []


def test_errors_carry_code_message_and_details(stack: LocalStack, resource_id: str, thread_id: str) -> None:
    with MemoryClient(stack.url, resource_id=resource_id) as om:
        with pytest.raises(InvalidRequest) as invalid:
            om.recall(thread_id, limit=0)
        with pytest.raises(NotFound) as missing:
            om.memory_generations(thread_id)  # in the contract; a plain 404 until the server serves it

    assert invalid.value.code == 'validation_error' and invalid.value.details[0]['field'] == 'limit'
    assert 'limit' in invalid.value.message
    assert missing.value.status == 404


def test_attachments_are_uploaded_and_readable_by_the_observer(
    stack: LocalStack, resource_id: str, thread_id: str
) -> None:
    png = bytes.fromhex('89504e470d0a1a0a0000000d4948445200000001000000010806000000') + b'\x00' * 16
    with MemoryClient(stack.url, resource_id=resource_id) as om:
        om.step(thread_id, ['Here is my boarding pass.'])
        part = om.upload_attachment(thread_id, png, filename='pass.png')
        step = om.step(thread_id, [Message(role='user', parts=[part])])

    assert isinstance(part, ImagePart) and part.url.startswith(f's3://{stack.names.bucket}/')
    assert part.size == len(png) and part.media_type == 'image/png'
    stored = step.messages[-1].parts[0]
    assert isinstance(stored, ImagePart) and stored.url == part.url
    body = stack.client('s3').get_object(Bucket=stack.names.bucket, Key=part.url.split('/', 3)[3])['Body'].read()
    assert body == png


def test_async_client_runs_50_concurrent_steps_on_different_threads(stack: LocalStack, resource_id: str) -> None:
    async def run() -> list[str]:
        async with AsyncMemoryClient(stack.url, resource_id=resource_id) as om:
            steps = await asyncio.gather(*(om.step(f'c-{n}', [f'message {n}']) for n in range(50)))
            pages = await asyncio.gather(*(om.messages(f'c-{n}') for n in range(50)))
        assert all(s.thread_id == f'c-{n}' for n, s in enumerate(steps))
        return [page.messages[0].text() for page in pages if len(page.messages) == 1]

    texts = asyncio.run(run())

    assert texts == [f'message {n}' for n in range(50)]


def test_chat_stream_yields_typed_chunks_sync_and_async(stack: LocalStack, resource_id: str, thread_id: str) -> None:
    from om_client.streaming import DataChunk, Finish, Start, TextDelta, text_of

    with MemoryClient(stack.url, resource_id=resource_id) as om:
        question = Message.user('I am Rui, I live in Braga and I cycle to work.')
        chunks = list(om.chat_stream(thread_id, question))
        # The turn as it happened: the reply's id first, the memory's status, the text, then the end
        assert isinstance(chunks[0], Start) and isinstance(chunks[-1], Finish)
        assert chunks[-1].finish_reason == 'stop'
        status = next(c for c in chunks if isinstance(c, DataChunk))
        assert status.type == 'data-om-status' and status.data['windows']['active']['messages']['threshold'] == 400
        assert sum(isinstance(c, TextDelta) for c in chunks) > 1  # word by word (the offline model streams too)
        history = om.messages(thread_id).messages
        assert [m.id for m in history] == [question.id, chunks[0].message_id]
        assert history[1].text() == text_of(chunks)
        # The same message again (a retry): the stored reply streams back, nothing is stored twice
        again = list(om.chat_stream(thread_id, question))
        assert text_of(again) == text_of(chunks) and len(om.messages(thread_id).messages) == 2
        # And the JSON route answers that message with the same stored reply
        assert om.chat(thread_id, question).reply.id == chunks[0].message_id

    async def read_async() -> list[object]:
        async with AsyncMemoryClient(stack.url, resource_id=resource_id) as client:
            return [chunk async for chunk in client.chat_stream(thread_id, 'And what do I do on weekends?')]

    streamed = asyncio.run(read_async())
    assert isinstance(streamed[0], Start) and isinstance(streamed[-1], Finish)
    assert text_of(streamed)  # type: ignore[arg-type]
    # An error before the stream began is the error's exception, as for every call
    with MemoryClient(stack.url, resource_id=resource_id) as om:
        om.chat(thread_id, Message.user('first', id='fixed-id'))
        with pytest.raises(MessageConflict):
            list(om.chat_stream(thread_id, Message.user('changed', id='fixed-id')))


def test_memory_work_on_demand_imported_history_and_a_pinned_title(
    stack: LocalStack, resource_id: str, thread_id: str
) -> None:
    from datetime import UTC, datetime, timedelta

    when = datetime(2019, 5, 4, 8, 0, tzinfo=UTC)
    history = [
        Message.user('My sister moved to Porto last spring.', created_at=when),
        Message.assistant('How does she like it?', created_at=when + timedelta(minutes=1)),
    ]
    with MemoryClient(stack.url, resource_id=resource_id) as om:
        om.create_thread(thread_id=thread_id)
        om.step(thread_id, ['Hello again.'], actor_model='openai/gpt-5.5')
        imported = om.observe(thread_id, history)
        assert imported.status == 'done' and imported.parts_of('observation-end')
        assert om.observe(thread_id, history).status == 'nothing_to_do'  # the same import, once
        assert [m.parts[0].text for m in om.messages(thread_id).messages] == ['Hello again.']
        with pytest.raises(ValueError, match='created_at'):
            om.observe(thread_id, ['no date'])
        with pytest.raises(BufferingDisabled) as refused:
            om.buffer(thread_id)  # this stack observes synchronously: nothing is buffered
        assert isinstance(refused.value, InvalidRequest) and refused.value.status == 422
        pinned = om.update_thread(thread_id, title='Porto')
        assert pinned.title_pinned and not om.update_thread(thread_id, title=None).title_pinned

    async def observe_own() -> str:
        async with AsyncMemoryClient(stack.url, resource_id=resource_id) as client:
            return (await client.observe(thread_id)).status

    assert asyncio.run(observe_own()) == 'done'  # the thread's own message, below the threshold
