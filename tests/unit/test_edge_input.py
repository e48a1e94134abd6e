"""The pure parts of hostile-input handling: the id grammar, strict JSON, the limits and their table in docs/api.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.api import limits
from functions.api.errors import ApiError
from functions.api.json_body import parse
from om_lib.errors import InvalidIdError
from om_lib.ids import MAX_ID_CHARS, check_id, id_problem

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    'value',
    ['t1', 'user:123', 'first.last+tag@example.com', '123e4567-e89b-12d3-a456-426614174000', 'Ünïcode', '...']
    + ['x' * 128],
)
def test_ids_in_the_grammar(value):
    assert id_problem(value) is None and check_id('threadId', value) == value


@pytest.mark.parametrize(
    ('value', 'problem'),
    [
        ('', 'is empty'),
        ('x' * (MAX_ID_CHARS + 1), 'is 129 characters long (at most 128)'),
        ('a/b', "contains a slash ('/')"),
        ('a?b', "contains a question mark ('?')"),
        ('a#b', "contains a hash ('#')"),
        ('100%', "contains a percent sign ('%')"),
        ('a b', "contains whitespace (' ')"),
        ('a\u00a0b', "contains whitespace ('\\xa0')"),
        ('nul\x00', "contains '\\x00' (U+0000)"),
        ('rtl\u202e', "contains '\\u202e' (U+202E)"),
        ('\ud800', "contains '\\ud800' (U+D800)"),
        ('..', "is '..', which URLs treat as a path step"),
        ('a"b', "contains '\"' (U+0022)"),
    ],
)
def test_ids_outside_the_grammar_say_why(value, problem):
    assert id_problem(value) == problem
    with pytest.raises(InvalidIdError, match='ids are 1-128') as raised:
        check_id('threadId', value)
    assert raised.value.code == 'invalid_id' and str(raised.value).startswith(f'threadId {problem}')


@pytest.mark.parametrize(
    ('text', 'kind'),
    [
        ('{"a": NaN}', 'json_constant'),
        ('{"a": Infinity}', 'json_constant'),
        ('[-Infinity]', 'json_constant'),
        ('{"a": 1e400}', 'json_overflow'),
        ('{"a": -1e309}', 'json_overflow'),
        ('{"a": 1' + '0' * 309 + '}', 'json_overflow'),
        ('{"a": "\\ud800"}', 'json_surrogate'),
        ('{"\\udc00": 1}', 'json_surrogate'),
        ('[' * 33 + ']' * 33, 'json_too_deep'),
        ('[' * 100_000, 'json_too_deep'),
        ('{"a": }', 'json_invalid'),
    ],
)
def test_strict_json_refuses_what_python_would_accept_or_crash_on(text, kind):
    with pytest.raises(ApiError) as raised:
        parse(text)
    assert (raised.value.status, raised.value.code) == (400, 'invalid_json')
    assert raised.value.details[0]['type'] == kind


def test_strict_json_keeps_what_is_json():
    deep = '[' * 32 + ']' * 32
    assert parse(deep) is not None
    assert parse('{"a": 1e308, "b": -0.5, "c": "\\ud83d\\ude42", "d": 1' + '0' * 300 + '}')['c'] == '🙂'


def test_a_body_is_admitted_as_utf8_text_or_refused_before_it_is_parsed():
    import base64
    import json

    from functions.api.edge import admit

    def sent(raw: bytes) -> dict:
        return {'path': '/health', 'body': base64.b64encode(raw).decode(), 'isBase64Encoded': True, 'headers': {}}

    refusal, admitted = admit(sent(b'{"a": "\xc3\xbc"}'))
    assert refusal is None and admitted['isBase64Encoded'] is False
    assert parse(admitted['body']) == {'a': 'ü'}
    refusal, _ = admit(sent(b'{"a": "\xff"}'))
    assert refusal is not None and refusal['statusCode'] == 400
    assert 'not UTF-8' in json.loads(refusal['body'])['error']['message']


def test_the_api_guide_documents_every_limit():
    guide = (ROOT / 'docs' / 'api.md').read_text(encoding='utf-8')
    for limit in limits.LIMITS:
        assert f'| {limit.what} | {limit.value:,} {limit.unit} |' in guide, limit


def test_a_record_key_sqs_cannot_take_as_a_group_id_is_hashed():
    from om_lib.adapters.aws_work import message_group_id

    assert message_group_id('thread:user:123/t-1') == 'thread:user:123/t-1'
    long_key = f'thread:{"r" * 128}/{"t" * 128}'
    for key in (long_key, 'thread:Ünïcode/t1'):
        group = message_group_id(key)
        assert len(group) == 64 and group.isalnum() and group == message_group_id(key)
    assert message_group_id(long_key) != message_group_id(long_key[:-1])
