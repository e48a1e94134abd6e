"""The fake OpenAI server speaks the wire protocol the real `openai` client expects (it is reused by provider tests)."""

from __future__ import annotations

import openai
import pytest

from tests.fakes.fake_openai import ChatReply, FakeOpenAI, fake_openai_env
from tests.fakes.loopback import deterministic_embedding
from tests.fakes.model_guard import loopback_only


def test_chat_tool_calls_streaming_and_errors_through_the_real_client() -> None:
    with loopback_only(), FakeOpenAI() as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key='test')
        fake.script(ChatReply.tool_calls(('a', {'x': 1}), ('b', {'y': 'z'}), text='checking'), ChatReply.text('Done.'))
        fake.script(ChatReply.error(429, 'slow down'))

        called = client.chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'hi'}])
        with client.chat.completions.stream(model='m', messages=[{'role': 'user', 'content': 'go'}]) as stream:
            streamed = stream.get_final_completion()
        with pytest.raises(openai.RateLimitError, match='slow down'):
            client.with_options(max_retries=0).chat.completions.create(model='m', messages=[])

    message = called.choices[0].message
    assert message.content == 'checking' and called.choices[0].finish_reason == 'tool_calls'
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        ('a', '{"x": 1}'),
        ('b', '{"y": "z"}'),
    ]
    assert streamed.choices[0].message.content == 'Done.'
    assert [r.last_user_text for r in fake.chat_requests] == ['hi', 'go', ''] and fake.chat_requests[1].stream


def test_embeddings_float_and_base64_are_the_same_vectors() -> None:
    with loopback_only(), FakeOpenAI() as fake:
        client = openai.OpenAI(base_url=fake_openai_env(fake)['OPENAI_BASE_URL'], api_key='test')
        packed = client.embeddings.create(model='e', input=['lisbon', 'porto'])  # the client asks for base64
        plain = client.embeddings.create(model='e', input='lisbon', dimensions=4, encoding_format='float')

    assert [len(item.embedding) for item in packed.data] == [8, 8]
    assert packed.data[0].embedding == pytest.approx(deterministic_embedding('lisbon', 8), abs=1e-6)
    assert plain.data[0].embedding == pytest.approx(deterministic_embedding('lisbon', 4))
    assert [r.inputs for r in fake.embedding_requests] == [['lisbon', 'porto'], ['lisbon']]
