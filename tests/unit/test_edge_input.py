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
        ('rtl\u202e', 'contains an invisible character (U+202E)'),
        ('\u3164', 'contains a Hangul filler (U+3164)'),
        (
            'e\u0301',
            'is not in Unicode normalisation form C (NFC): normalise it first, e.g. '
            "unicodedata.normalize('NFC', id) in Python or id.normalize('NFC') in JavaScript",
        ),
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

    def sent(raw: bytes, content_type: str | None = 'application/json') -> dict:
        headers = {'Content-Type': content_type} if content_type else {}
        return {'path': '/health', 'body': base64.b64encode(raw).decode(), 'isBase64Encoded': True, 'headers': headers}

    refusal, _ = admit(sent(b'{}', content_type=None))
    assert refusal is not None and refusal['statusCode'] == 415
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
    from om_lib.adapters.aws.work import message_group_id

    assert message_group_id('thread:user:123/t-1') == 'thread:user:123/t-1'
    long_key = f'thread:{"r" * 128}/{"t" * 128}'
    for key in (long_key, 'thread:Ünïcode/t1'):
        group = message_group_id(key)
        assert len(group) == 64 and group.isalnum() and group == message_group_id(key)
    assert message_group_id(long_key) != message_group_id(long_key[:-1])


@pytest.mark.parametrize(
    ('value', 'canonical'),
    [
        ('https://App.Example.com', 'https://app.example.com:443'),
        ('https://app.example.com:443/', 'https://app.example.com:443'),
        ('http://localhost:5173', 'http://localhost:5173'),
        ('http://[::1]:8787', 'http://[::1]:8787'),
        ('null', None),
        ('file://', None),
        ('https://app.example.com/path', None),
        ('https://user@app.example.com', None),
        ('http://localhost:99999', None),
        ('chrome-extension://abc', None),
    ],
)
def test_origins_compare_in_one_canonical_form(value, canonical):
    from functions.origins import canonical_origin

    assert canonical_origin(value) == canonical


def test_an_allow_list_names_origins_only():
    from functions.origins import own_origin, parse_origins

    assert parse_origins(' https://a.example , http://localhost:3000,') == {
        'https://a.example:443',
        'http://localhost:3000',
    }
    for bad in ('*', 'a.example', 'https://a.example/app'):
        with pytest.raises(ValueError, match='is not a web origin'):
            parse_origins(bad)
    assert own_origin('abc.execute-api.eu-west-1.amazonaws.com', 'https') == (
        'https://abc.execute-api.eu-west-1.amazonaws.com:443'
    )
    assert own_origin('127.0.0.1:8787', None) == 'http://127.0.0.1:8787'
