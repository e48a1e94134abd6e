"""The OpenAI Agents SDK session: item ↔ message mapping, and `Runner.run` conversations on the local stack with the
SDK's chat-completions model talking to the fake OpenAI server."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.memory import Session
from om_client import AsyncMemoryClient, MemoryClient, Message
from om_client.integrations.openai_agents import (
    ObservationalMemorySession,
    items_to_messages,
    message_to_items,
    step_to_items,
)
from om_client.models import FilePart, ImagePart, ReasoningPart, StepResult, TextPart, ToolCallPart, ToolResultPart
from openai import AsyncOpenAI

from om_cli.local_stack import LocalStack
from tests.fakes.fake_openai import ChatReply, FakeOpenAI
from tests.fakes.model_guard import loopback_only

set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI

PNG = 'iVBORw0KGgo='


def without_memory(items: list[Any]) -> list[Any]:
    """The items after the memory system message (the test stack has working memory on, so there always is one)."""
    assert items and items[0]['role'] == 'system' and '<working_memory>' in items[0]['content']
    return items[1:]


# -- mapping --------------------------------------------------------------------------------------------------------
def test_user_text_images_and_files_become_parts_and_come_back() -> None:
    items = [
        {'role': 'user', 'content': 'plain'},
        {
            'role': 'user',
            'content': [
                {'type': 'input_text', 'text': 'look'},
                {'type': 'input_image', 'image_url': f'data:image/png;base64,{PNG}', 'detail': 'auto'},
                {'type': 'input_image', 'image_url': 'https://example.com/a.jpg', 'detail': 'auto'},
                {'type': 'input_file', 'file_data': 'data:application/pdf;base64,JVBERg==', 'filename': 'a.pdf'},
            ],
        },
    ]

    plain, rich = items_to_messages(items)

    assert plain.role == 'user' and plain.parts == [TextPart(text='plain')]
    assert rich.parts == [
        TextPart(text='look'),
        ImagePart(media_type='image/png', data=PNG),
        ImagePart(url='https://example.com/a.jpg'),
        FilePart(media_type='application/pdf', data='JVBERg==', filename='a.pdf'),
    ]
    assert message_to_items(plain) == [{'role': 'user', 'content': 'plain'}]
    assert message_to_items(rich) == [
        {
            'role': 'user',
            'content': [
                {'type': 'input_text', 'text': 'look'},
                {'type': 'input_image', 'image_url': f'data:image/png;base64,{PNG}', 'detail': 'auto'},
                {'type': 'input_image', 'image_url': 'https://example.com/a.jpg', 'detail': 'auto'},
                {'type': 'input_file', 'filename': 'a.pdf', 'file_data': 'data:application/pdf;base64,JVBERg=='},
            ],
        }
    ]


def test_an_uploaded_s3_image_is_named_to_the_model_not_sent() -> None:
    message = Message(role='user', parts=[ImagePart(url='s3://bucket/k/pass.png', filename='pass.png')])

    assert message_to_items(message) == [{'role': 'user', 'content': '[image pass.png at s3://bucket/k/pass.png]'}]


def test_function_calls_and_outputs_become_tool_parts_and_come_back() -> None:
    items = [
        {
            'type': 'function_call',
            'call_id': 'c1',
            'name': 'trains',
            'arguments': '{"to": "Porto"}',
            'id': '__fake_id__',
        },
        {'type': 'function_call_output', 'call_id': 'c1', 'output': '{"train": "IC 521"}'},
        {
            'type': 'message',
            'role': 'assistant',
            'id': '__fake_id__',
            'status': 'completed',
            'content': [{'type': 'output_text', 'text': 'Take the IC 521.', 'annotations': []}],
        },
    ]

    call, result, answer = items_to_messages(items)

    assert call.role == 'assistant' and call.parts == [
        ToolCallPart(tool_call_id='c1', tool_name='trains', args={'to': 'Porto'})
    ]
    assert result.role == 'tool'
    assert result.parts == [ToolResultPart(tool_call_id='c1', tool_name='trains', result='{"train": "IC 521"}')]
    assert answer.role == 'assistant' and answer.text() == 'Take the IC 521.'
    assert [item for m in (call, result, answer) for item in message_to_items(m)] == [
        {'type': 'function_call', 'call_id': 'c1', 'name': 'trains', 'arguments': '{"to": "Porto"}'},
        {'type': 'function_call_output', 'call_id': 'c1', 'output': '{"train": "IC 521"}'},
        {'role': 'assistant', 'content': 'Take the IC 521.'},
    ]


def test_reasoning_developer_and_hosted_tool_items() -> None:
    hosted = {'type': 'web_search_call', 'id': 'ws_1', 'status': 'completed', 'action': {'query': 'trains'}}
    items = [
        {'type': 'reasoning', 'id': 'rs_1', 'summary': [{'type': 'summary_text', 'text': 'think about trains'}]},
        {'role': 'developer', 'content': 'be brief'},
        hosted,
    ]

    reasoning, developer, search = items_to_messages(items)

    assert reasoning.parts == [ReasoningPart(text='think about trains')] and message_to_items(reasoning) == []
    assert developer.role == 'system' and message_to_items(developer) == [{'role': 'system', 'content': 'be brief'}]
    assert message_to_items(search) == [hosted]  # kept whole, sent back as it came


def test_a_step_is_the_memory_system_message_then_the_unobserved_messages() -> None:
    step = StepResult(
        thread_id='t',
        resource_id='r',
        system='<observations>likes trains</observations>',
        messages=[Message.user('hi'), Message.assistant('hello')],
    )

    assert step_to_items(step) == [
        {'role': 'system', 'content': '<observations>likes trains</observations>'},
        {'role': 'user', 'content': 'hi'},
        {'role': 'assistant', 'content': 'hello'},
    ]
    assert step_to_items(step.model_copy(update={'system': ''}))[0] == {'role': 'user', 'content': 'hi'}


def test_the_session_satisfies_the_sdk_protocol() -> None:
    session = ObservationalMemorySession(AsyncMemoryClient('http://127.0.0.1:1', resource_id='me'), thread_id='t')

    assert isinstance(session, Session) and session.session_id == 't'


# -- Runner.run on the local stack ----------------------------------------------------------------------------------
@function_tool
def find_train(destination: str) -> str:
    """The next train to a destination."""
    return json.dumps({'destination': destination, 'train': 'IC 521', 'leaves': '09:00'})


def fact(n: int) -> str:
    return f'Fact {n}: my friend number {n} is called Person{n}, lives in City{n} and collects stamps of colour{n}.'


def test_twenty_runs_keep_observations_in_the_model_input_and_observed_turns_out(
    stack: LocalStack, fake_model: FakeOpenAI, resource_id: str, thread_id: str
) -> None:
    seen: list[str] = []

    async def conversation() -> ObservationalMemorySession:
        om = AsyncMemoryClient(stack.url, resource_id=resource_id)
        session = ObservationalMemorySession(
            om, thread_id=thread_id, on_parts=lambda ps: seen.extend(p.type for p in ps)
        )
        model = OpenAIChatCompletionsModel(
            model='fake-model', openai_client=AsyncOpenAI(base_url=fake_model.base_url, api_key='test')
        )
        tools = [find_train, session.recall_tool(), session.working_memory_tool()]
        agent = Agent(name='assistant', instructions='Be brief.', model=model, tools=tools)
        for n in range(19):
            if n == 3:
                fake_model.script(
                    ChatReply.tool_calls(('find_train', {'destination': 'Porto'})), ChatReply.text('9:00.')
                )
            if n == 8:
                fake_model.script(ChatReply.tool_calls(('recall', {'mode': 'threads'})), ChatReply.text('One thread.'))
            if n == 12:
                update = {'memory': '# User\n- has many friends who collect stamps'}
                fake_model.script(ChatReply.tool_calls(('updateWorkingMemory', update)), ChatReply.text('Saved.'))
            await Runner.run(agent, fact(n), session=session)
        # Observation runs in the background after a turn passes messageTokens; wait for it to cover the first turns.
        deadline = time.monotonic() + 30
        while 'Fact 0' not in (await session.memory()).observations and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await Runner.run(agent, fact(19), session=session)
        await om.aclose()
        return session

    with loopback_only():
        session = asyncio.run(conversation())

    requests = fake_model.chat_requests
    last = requests[-1]
    # The memory system message, after the agent's instructions, carries what the first turns said...
    assert last.system_texts[0] == 'Be brief.' and 'Person0' in last.system_texts[1] and 'City0' in last.system_texts[1]
    # ...and the observed turns left the input: the model no longer gets them as messages.
    assert not any('Fact 0:' in text for text in last.user_texts + last.texts('assistant'))
    assert last.last_user_text == fact(19)
    assert len(last.messages) < 20  # without memory: instructions + 20 turns of 2 messages + 2 tool rounds = 45
    # The tool rounds went through the SDK and into memory as tool parts.
    assert '"train": "IC 521"' in requests[4].tool_results[0]
    recall_result = json.loads(requests[10].tool_results[-1])
    assert recall_result['count'] == 1 and '← current' in recall_result['threads']
    with MemoryClient(stack.url, resource_id=resource_id) as om:
        stored = list(om.iter_messages(thread_id))
    kinds = [type(p).__name__ for m in stored for p in m.parts]
    assert kinds.count('ToolCallPart') == 3 and kinds.count('ToolResultPart') == 3
    # updateWorkingMemory ran against the service, and the next runs' memory system message shows it.
    assert json.loads(requests[16].tool_results[-1]) == {'success': True}
    assert 'has many friends who collect stamps' in last.system_texts[1]
    assert len([m for m in stored if m.role == 'user']) == 20
    # The data-om-* parts reach the caller.
    assert 'data-om-status' in seen and 'data-om-scheduled' in seen
    assert session.parts and session.parts[0].type == 'data-om-status'


def test_pop_item_and_clear_session(stack: LocalStack, resource_id: str, thread_id: str) -> None:
    async def run() -> tuple[Any, Any, list[Any], list[Any]]:
        async with AsyncMemoryClient(stack.url, resource_id=resource_id) as om:
            session = ObservationalMemorySession(om, thread_id=thread_id)
            await session.add_items([{'role': 'user', 'content': 'one'}, {'role': 'assistant', 'content': 'two'}])
            popped = await session.pop_item()
            after_pop = without_memory(await session.get_items())
            await session.clear_session()
            after_clear = without_memory(await session.get_items())
            empty_pop = await session.pop_item()
            return popped, empty_pop, after_pop, after_clear

    popped, empty_pop, after_pop, after_clear = asyncio.run(run())

    assert popped == {'role': 'assistant', 'content': 'two'}
    assert after_pop == [{'role': 'user', 'content': 'one'}]
    assert after_clear == [] and empty_pop is None


def test_get_items_with_a_limit_returns_the_newest(stack: LocalStack, resource_id: str, thread_id: str) -> None:
    async def run() -> list[Any]:
        async with AsyncMemoryClient(stack.url, resource_id=resource_id) as om:
            session = ObservationalMemorySession(om, thread_id=thread_id)
            await session.add_items([{'role': 'user', 'content': str(n)} for n in range(5)])
            return [await session.get_items(limit=2), await session.get_items(limit=0)]

    newest, none = asyncio.run(run())

    assert newest == [{'role': 'user', 'content': '3'}, {'role': 'user', 'content': '4'}] and none == []


@pytest.mark.parametrize('blocking', [True, False])
def test_the_session_takes_either_client(stack: LocalStack, resource_id: str, thread_id: str, blocking: bool) -> None:
    client: Any = MemoryClient(stack.url, resource_id=resource_id) if blocking else AsyncMemoryClient(stack.url)
    session = ObservationalMemorySession(client, thread_id=thread_id, resource_id=resource_id)

    async def run() -> list[Any]:
        await session.add_items([{'role': 'user', 'content': 'hello'}])
        return without_memory(await session.get_items())

    assert asyncio.run(run()) == [{'role': 'user', 'content': 'hello'}]


def test_a_session_names_the_agents_model_and_a_new_model_activates_buffered_observations(thread_id: str) -> None:
    config = {
        'model': 'offline',
        'observation': {'messageTokens': 2000, 'bufferTokens': 1000},
        'activateOnProviderChange': True,
    }
    env = {'POWERTOOLS_LOG_LEVEL': 'WARNING', 'POWERTOOLS_METRICS_DISABLED': 'true'}
    with LocalStack(port=0, config=config, env=env, sweep_interval_s=None, visibility_timeout_s=2) as stack:

        async def run() -> tuple[list[Any], list[Any]]:
            async with AsyncMemoryClient(stack.url, resource_id='agents-models') as om:
                small = ObservationalMemorySession(om, thread_id=thread_id, actor_model='openai/gpt-5.4-mini')
                await small.get_items()
                await small.add_items(
                    [
                        {'role': 'user', 'content': 'I live in Lisbon and work as a nurse.'},
                        {'role': 'assistant', 'content': 'Noted.'},
                    ]
                )
                assert (await om.buffer(thread_id)).status == 'done'
                await small.get_items()  # the same model: nothing activates
                same = list(small.parts)
                large = ObservationalMemorySession(om, thread_id=thread_id, actor_model='openai/gpt-5.4')
                items = await large.get_items()
                return same, [*large.parts, items]

        same, (*parts, items) = asyncio.run(run())

    assert not any(p.type == 'data-om-activation' for p in same)
    activations = [p.data for p in parts if p.type == 'data-om-activation']
    assert len(activations) == 1 and activations[0]['triggeredBy'] == 'provider_change', activations
    assert (activations[0]['previousModel'], activations[0]['currentModel']) == (
        'openai/gpt-5.4-mini',
        'openai/gpt-5.4',
    )
    assert 'Lisbon' in json.dumps(items)  # the activated observations are in the memory system message
