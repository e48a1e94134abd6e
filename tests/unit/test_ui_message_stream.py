"""The UI message stream encoder (functions/api/streaming.py): chat events → the protocol's chunks, in order."""

from __future__ import annotations

import json

from functions.api.streaming import DONE, ChatStream, UiMessageStream, frame
from om_lib.conversation.chat import ChatResult
from om_lib.messages import Message, TextPart, ToolCallPart, ToolResultPart
from om_lib.parts import ActorFailed, CycleParts, Scheduled
from om_lib.service import (
    ActorFinished,
    ActorStarted,
    MemoryPart,
    TextDelta,
    ToolAnswered,
    ToolCalled,
    TurnStarted,
)

REPLY = Message.model_validate(
    {'id': 'msg_r', 'role': 'assistant', 'createdAt': '2025-03-03T09:00:00Z', 'parts': [TextPart(text='Found it.')]}
)


def types(chunks: list[dict[str, object]]) -> list[object]:
    return [c['type'] for c in chunks]


def test_a_turn_with_a_tool_round_becomes_two_steps_with_tool_chunks() -> None:
    encoder = UiMessageStream()
    call = ToolCallPart(tool_call_id='c1', tool_name='recall', args={'query': 'Lisbon'})
    events = [
        TurnStarted('msg_r'),
        MemoryPart(Scheduled(operations=('buffer',))),
        ActorStarted(),
        TextDelta('Let me look.'),
        ToolCalled(call, server=True),
        ToolAnswered(ToolResultPart(tool_call_id='c1', tool_name='recall', result={'messages': []})),
        ActorFinished(),
        ActorStarted(),
        TextDelta('Found'),
        TextDelta(' it.'),
        ActorFinished(),
    ]
    chunks = [chunk for event in events for chunk in encoder.chunks(event)]
    chunks += encoder.finish(ChatResult(REPLY, CycleParts()))
    assert types(chunks) == [
        'start',
        'data-om-scheduled',
        'start-step',
        'text-start',
        'text-delta',
        'text-end',
        'tool-input-available',
        'tool-output-available',
        'finish-step',
        'start-step',
        'text-start',
        'text-delta',
        'text-delta',
        'text-end',
        'finish-step',
        'finish',
    ]
    tool = chunks[6]
    assert tool == {
        'type': 'tool-input-available',
        'toolCallId': 'c1',
        'toolName': 'recall',
        'input': {'query': 'Lisbon'},
        'dynamic': True,
        'providerExecuted': True,
    }
    assert chunks[3]['id'] != chunks[10]['id']  # each block of text has its own id
    assert chunks[-1] == {'type': 'finish', 'finishReason': 'stop'}


def test_a_failed_actor_ends_with_an_error_chunk_and_finish_error() -> None:
    encoder = UiMessageStream()
    failed = ActorFailed(error='model_unavailable', retryable=True, model='google/gemini-2.5-flash')
    parts = CycleParts()
    parts.add(failed)
    for event in (TurnStarted('msg_r'), ActorStarted(), MemoryPart(failed), ActorFinished()):
        encoder.chunks(event)
    closing = encoder.finish(ChatResult(None, parts))
    assert closing == [
        {'type': 'error', 'errorText': failed.message, 'code': 'model_unavailable'},
        {'type': 'finish', 'finishReason': 'error'},
    ]


def test_a_chat_stream_frames_its_turn_and_ends_with_done_even_when_it_fails_late() -> None:
    def run(listen):  # a turn that began, then failed unexpectedly
        listen(TurnStarted('msg_r'))
        listen(ActorStarted())
        listen(TextDelta('Hal'))
        raise RuntimeError('boom')

    frames = list(ChatStream(run).start().frames())
    assert frames[-1] == DONE
    chunks = [json.loads(f[6:]) for f in frames[:-1]]
    assert types(chunks) == [
        'start',
        'start-step',
        'text-start',
        'text-delta',
        'text-end',
        'finish-step',
        'error',
        'finish',
    ]
    assert chunks[-2]['code'] == 'internal_error' and chunks[-1]['finishReason'] == 'error'
    assert frame({'type': 'start-step'}) == b'data: {"type":"start-step"}\n\n'
