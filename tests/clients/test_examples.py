"""The examples run as documented: against the local stack, their model pointed at an OpenAI-compatible URL (here
the fake OpenAI server), one message each; the conversation is in memory afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from om_client import MemoryClient

from om_cli.local_stack import LocalStack
from tests.fakes.fake_openai import ChatReply, FakeOpenAI, fake_openai_env

EXAMPLES = Path(__file__).resolve().parents[2] / 'examples'


@pytest.mark.parametrize('example', ['openai_agents_chat.py', 'strands_agent.py'])
def test_the_example_answers_and_remembers(
    stack: LocalStack, fake_model: FakeOpenAI, resource_id: str, thread_id: str, example: str
) -> None:
    fake_model.script(ChatReply.text('Hello Ana, noted.'))
    args = ['--api-url', stack.url, '--resource-id', resource_id, '--thread-id', thread_id, '--model', 'fake-model']
    env = {**os.environ, **fake_openai_env(fake_model)}

    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example), *args, '--message', 'I am Ana.'],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    assert 'assistant: Hello Ana, noted.' in done.stdout and '[memory:' in done.stderr
    assert fake_model.chat_requests[-1].last_user_text.endswith('I am Ana.')
    with MemoryClient(stack.url, resource_id=resource_id) as om:
        assert [m.text() for m in om.iter_messages(thread_id)] == ['I am Ana.', 'Hello Ana, noted.']
