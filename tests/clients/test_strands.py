"""Strands Agents hooks: message mapping, and 20 invocations of an agent on the local stack with Strands' OpenAI model
streaming from the fake OpenAI server."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from om_client import MemoryClient, Message
from om_client.integrations._shared import actor_model_name
from om_client.integrations.strands import ObservationalMemoryHooks, from_strands, strands_model_name, to_strands
from om_client.models import FilePart, ImagePart, ReasoningPart, TextPart, ToolCallPart, ToolResultPart
from strands import Agent, tool
from strands.models.openai import OpenAIModel

from om_cli.local_stack import LocalStack
from tests.fakes.fake_openai import ChatReply, FakeOpenAI
from tests.fakes.model_guard import loopback_only

PNG_BYTES = b'\x89PNG\r\n\x1a\n'


# -- mapping --------------------------------------------------------------------------------------------------------
def test_user_text_image_and_document_blocks() -> None:
    message = {
        'role': 'user',
        'content': [
            {'text': 'look'},
            {'image': {'format': 'png', 'source': {'bytes': PNG_BYTES}}},
            {'document': {'format': 'pdf', 'name': 'ticket', 'source': {'bytes': b'%PDF'}}},
        ],
    }

    ours = from_strands(message, {})

    assert ours is not None and ours.role == 'user'
    assert ours.parts == [
        TextPart(text='look'),
        ImagePart(media_type='image/png', data='iVBORw0KGgo='),
        FilePart(media_type='application/pdf', data='JVBERg==', filename='ticket.pdf'),
    ]
    back, _ = to_strands([ours])
    assert back[0]['content'][:2] == [{'text': 'look'}, {'image': {'format': 'png', 'source': {'bytes': PNG_BYTES}}}]
    assert back[0]['content'][2] == {'text': '[file ticket.pdf at inline]'}


def test_tool_use_and_results_become_tool_parts_and_come_back() -> None:
    names: dict[str, str] = {}
    tool_use = {'toolUseId': 'u1', 'name': 'trains', 'input': {'to': 'Porto'}}
    tool_result = {'toolUseId': 'u1', 'status': 'success', 'content': [{'json': {'train': 'IC 521'}}]}
    use = {'role': 'assistant', 'content': [{'text': 'checking'}, {'toolUse': tool_use}]}
    result = {'role': 'user', 'content': [{'toolResult': tool_result}]}

    call, answer = from_strands(use, names), from_strands(result, names)

    assert call is not None and answer is not None
    assert call.parts == [
        TextPart(text='checking'),
        ToolCallPart(tool_call_id='u1', tool_name='trains', args={'to': 'Porto'}),
    ]
    assert answer.role == 'tool'
    assert answer.parts == [ToolResultPart(tool_call_id='u1', tool_name='trains', result={'train': 'IC 521'})]
    back, system = to_strands([call, answer])
    assert back == [use, result] and system == []


def test_adjacent_roles_merge_system_text_is_set_apart_and_reasoning_stays_behind() -> None:
    messages = [
        Message.system('a rule'),
        Message.user('<system-reminder>continue</system-reminder>'),
        Message.user('hello'),
        Message(role='assistant', parts=[ReasoningPart(text='hmm'), TextPart(text='hi')]),
    ]

    back, system = to_strands(messages)

    assert system == ['a rule']
    assert back == [
        {'role': 'user', 'content': [{'text': '<system-reminder>continue</system-reminder>'}, {'text': 'hello'}]},
        {'role': 'assistant', 'content': [{'text': 'hi'}]},
    ]
    reasoning = from_strands(
        {'role': 'assistant', 'content': [{'reasoningContent': {'reasoningText': {'text': 'hmm'}}}]}, {}
    )
    assert reasoning is not None and reasoning.parts == [ReasoningPart(text='hmm')]


# -- an agent on the local stack ------------------------------------------------------------------------------------
@tool
def find_train(destination: str) -> str:
    """The next train to a destination.

    Args:
        destination: Where to go.
    """
    return json.dumps({'destination': destination, 'train': 'IC 521'})


def fact(n: int) -> str:
    return f'Fact {n}: my friend number {n} is called Person{n}, lives in City{n} and collects stamps of colour{n}.'


def test_twenty_invocations_keep_observations_in_the_prompt_and_observed_turns_out(
    stack: LocalStack, fake_model: FakeOpenAI, resource_id: str, thread_id: str
) -> None:
    seen: list[str] = []
    with MemoryClient(stack.url, resource_id=resource_id) as om, loopback_only():
        memory = ObservationalMemoryHooks(om, thread_id=thread_id, on_parts=lambda ps: seen.extend(p.type for p in ps))
        model = OpenAIModel(client_args={'base_url': fake_model.base_url, 'api_key': 'test'}, model_id='fake-model')
        agent = Agent(
            model=model,
            system_prompt='Be brief.',
            hooks=[memory],
            tools=[find_train, memory.recall_tool(), memory.working_memory_tool()],
            callback_handler=None,
        )
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
            agent(fact(n))
        deadline = time.monotonic() + 30
        while 'Fact 0' not in om.memory(thread_id).observations and time.monotonic() < deadline:
            time.sleep(0.2)
        agent(fact(19))
        stored = list(om.iter_messages(thread_id))

    requests = fake_model.chat_requests
    last = requests[-1]
    assert all(r.stream for r in requests)  # Strands streams by default: the fake speaks SSE
    # Your prompt, then the memory system message with what the first turns said...
    assert last.system_text.startswith('Be brief.') and 'Person0' in last.system_text and 'City0' in last.system_text
    # ...while the observed turns left the messages, and the agent's own history stays short.
    assert not any('Fact 0:' in text for text in last.user_texts + last.texts('assistant'))
    assert last.user_texts[-1].endswith(fact(19))
    assert len(last.messages) < 20 and len(agent.messages) < 20
    # Tool rounds ran through Strands and were saved as tool parts; the recall tool answered from the service.
    assert '"train": "IC 521"' in requests[4].tool_results[0]
    recall_result = json.loads(requests[10].tool_results[-1])
    assert recall_result['count'] == 1 and '← current' in recall_result['threads']
    kinds = [type(p).__name__ for m in stored for p in m.parts]
    assert kinds.count('ToolCallPart') == 3 and kinds.count('ToolResultPart') == 3
    assert json.loads(requests[16].tool_results[-1]) == {'success': True}
    assert 'has many friends who collect stamps' in last.system_text
    assert [m.text() for m in stored if m.role == 'user'] == [fact(n) for n in range(20)]
    assert 'data-om-status' in seen and memory.parts


# -- the Actor's model ----------------------------------------------------------------------------------------------
def test_the_agents_model_is_named_as_the_step_route_takes_it() -> None:
    openai_model = OpenAIModel(client_args={'api_key': 'test'}, model_id='gpt-4o-mini')
    served = OpenAIModel(client_args={'api_key': 'test'}, model_id='/models/llama 3')

    assert strands_model_name(openai_model) == 'openai/gpt-4o-mini'
    # A model served from a path loses its leading slash and spaces; a name the route refuses is left out.
    assert strands_model_name(served) == 'openai/models/llama-3'
    assert actor_model_name('openai', '') is None and actor_model_name('open ai', 'x') is None
    with pytest.raises(ValueError, match='actor_model must be `provider/model`'):
        ObservationalMemoryHooks(
            MemoryClient('http://127.0.0.1:9', resource_id='me'), thread_id='t', actor_model='gpt 4o'
        )


# Observations buffered: a short conversation stays below bufferTokens (nothing is buffered until asked), and a step
# whose agent runs another model activates what is buffered.
BUFFERED_STACK_CONFIG: dict[str, Any] = {
    'model': 'offline',
    'observation': {'messageTokens': 2000, 'bufferTokens': 1000},
    'activateOnProviderChange': True,
}


def test_swapping_the_agents_model_activates_buffered_observations(fake_model: FakeOpenAI, thread_id: str) -> None:
    env = {'POWERTOOLS_LOG_LEVEL': 'WARNING', 'POWERTOOLS_METRICS_DISABLED': 'true'}
    seen: list[Any] = []
    with (
        LocalStack(port=0, config=BUFFERED_STACK_CONFIG, env=env, sweep_interval_s=None, visibility_timeout_s=2) as st,
        MemoryClient(st.url, resource_id='strands-models') as om,
        loopback_only(),
    ):
        memory = ObservationalMemoryHooks(om, thread_id=thread_id, on_parts=seen.extend)
        small = OpenAIModel(client_args={'base_url': fake_model.base_url, 'api_key': 'test'}, model_id='fake-model')
        agent = Agent(model=small, hooks=[memory], callback_handler=None)
        agent('I live in Lisbon.')
        agent('I work as a nurse.')
        assert om.buffer(thread_id).status == 'done'
        agent('Hello again.')  # the same model: nothing activates
        assert not any(p.type == 'data-om-activation' for p in seen)

        agent.model = OpenAIModel(
            client_args={'base_url': fake_model.base_url, 'api_key': 'test'}, model_id='fake-model-large'
        )
        agent('Where do I live?')

    activations = [p.data for p in seen if p.type == 'data-om-activation']
    assert len(activations) == 1, activations
    assert activations[0]['triggeredBy'] == 'provider_change'
    assert (activations[0]['previousModel'], activations[0]['currentModel']) == (
        'openai/fake-model',
        'openai/fake-model-large',
    )
    # The newly active observations are in the prompt the other model got.
    assert 'Lisbon' in fake_model.chat_requests[-1].system_text
