"""Token counting (spec §4.2, §4.3; CONTRACT §1 "Tokens") and the offline o200k tokenizer."""

from __future__ import annotations

import base64
import gzip
import json
import os
import socket
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
import tiktoken

from om_lib.adapters import tiktoken_counter
from om_lib.adapters.tiktoken_counter import (
    CACHE_FILE_NAME,
    EXPECTED_SHA256,
    TiktokenTokenizer,
    TokenizerLoadError,
    get_tokenizer,
    load_encoding,
    prepare_cache_dir,
)
from om_lib.context.tokens import (
    TOKENS_PER_CONVERSATION,
    ModelContext,
    TokenCounter,
    estimate_file_tokens_from_bytes,
    estimate_image_tokens,
    format_tool_result,
    image_dimensions,
)
from om_lib.messages import Message, TokenCounts
from om_lib.ports import StringTokenizer

T0 = '2025-01-01T00:00:00Z'


class CharTokenizer:
    """One token per character, recording every call: exact arithmetic and a way to prove the cache is used."""

    def __init__(self, version: str = 'chars') -> None:
        self.version = version
        self.calls: list[str] = []

    def count(self, text: str) -> int:
        self.calls.append(text)
        return len(text)


def msg(role: str = 'user', *, id: str = 'm1', content: str | None = None, parts: list[dict[str, Any]] | None = None):
    data: dict[str, Any] = {'id': id, 'role': role, 'createdAt': T0}
    if content is not None:
        data['content'] = content
    if parts is not None:
        data['parts'] = parts
    return Message.model_validate(data)


@pytest.fixture
def chars() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture
def counter(chars: CharTokenizer) -> TokenCounter:
    return TokenCounter(chars)


@pytest.fixture(scope='module')
def o200k() -> TokenCounter:
    return TokenCounter(get_tokenizer())


def png_b64(width: int, height: int) -> str:
    ihdr = struct.pack('>IIBBBBB', width, height, 8, 6, 0, 0, 0)
    raw = b'\x89PNG\r\n\x1a\n' + struct.pack('>I', len(ihdr)) + b'IHDR' + ihdr + b'\0\0\0\0' + b'\0' * 64
    return base64.b64encode(raw).decode()


def jpeg_b64(width: int, height: int) -> str:
    app0 = b'\xff\xe0' + struct.pack('>H', 16) + b'JFIF\0' + b'\x01\x01\0\0\x01\0\x01\0\0'
    sof0 = b'\xff\xc0' + struct.pack('>HBHHB', 11, 8, height, width, 1) + b'\x01\x11\0'
    return base64.b64encode(b'\xff\xd8' + app0 + sof0 + b'\xff\xd9').decode()


# -- basic properties (spec §4.2) ----------------------------------------------------------------------------------


def test_counts_are_integers_and_overheads_apply(o200k: TokenCounter) -> None:
    m = msg(content='Hello world, how are you today?')
    assert isinstance(o200k.count_message(m), int)
    assert o200k.count_message(m) > o200k.count_string(m.text())
    two = [m, msg('assistant', id='m2', content='Fine, thanks.')]
    assert o200k.count_messages(two) > sum(o200k.count_message(x) for x in two)
    assert o200k.count_messages([]) == 0


def test_hello_world_is_small(o200k: TokenCounter) -> None:
    assert 1 <= o200k.count_string('Hello world') <= 9
    assert o200k.count_string('') == 0
    assert o200k.count_observations('Hello world') == o200k.count_string('Hello world')


def test_message_arithmetic(counter: TokenCounter) -> None:
    # role 'user' (4) + 'abcde' (5) + 3.8 = 12.8 -> 13
    assert counter.count_message(msg(content='abcde')) == 13
    # 24 + 13 + 13
    assert counter.count_messages([msg(content='abcde'), msg(id='m2', content='abcde')]) == 24 + 26
    assert TOKENS_PER_CONVERSATION == 24


def test_version_combines_logic_and_tokenizer(counter: TokenCounter) -> None:
    assert counter.version.endswith(':chars')
    assert counter.version != TokenCounter(CharTokenizer('other')).version
    assert TokenCounter(get_tokenizer()).version.endswith(':o200k_base')


# -- cache ---------------------------------------------------------------------------------------------------------


def test_cached_counts_are_used_without_tokenizer_calls(counter: TokenCounter, chars: CharTokenizer) -> None:
    m = msg(
        'assistant',
        parts=[
            {'type': 'text', 'text': 'some text here'},
            {'type': 'tool-call', 'toolCallId': 'c1', 'toolName': 'search', 'args': {'q': 'x'}},
            {'type': 'reasoning', 'text': 'thinking...'},
        ],
    )
    fresh = counter.count_message(m)
    filled = counter.with_token_counts(m)
    assert filled.token_counts == TokenCounts(version=counter.version, parts=(14, 6 + 9, None))
    assert counter.with_token_counts(filled) is filled
    chars.calls.clear()
    assert counter.count_message(filled) == fresh
    assert counter.count_messages([filled, filled]) == 24 + 2 * fresh
    assert chars.calls == []


def test_cache_of_another_version_is_ignored(chars: CharTokenizer) -> None:
    old = TokenCounter(CharTokenizer('old'))
    new = TokenCounter(chars)
    m = old.with_token_counts(msg(content='abcde'))
    assert m.token_counts is not None and m.token_counts.version == old.version
    chars.calls.clear()
    assert new.count_message(m) == 13
    assert 'abcde' in chars.calls  # recomputed
    refilled = new.with_token_counts(m)
    assert refilled.token_counts == TokenCounts(version=new.version, parts=(5,))


RIGHT_VERSION = object()


@pytest.mark.parametrize(
    ('version', 'parts'),
    [
        ('client', [0]),  # another version: a client-supplied estimate
        ('om-tc-1:o200k_base', [0]),  # the production version string, but not this counter's
        (RIGHT_VERSION, [-1000]),  # this counter's version with an impossible value
        (RIGHT_VERSION, [0, 0]),  # this counter's version with the wrong number of parts
    ],
)
def test_forged_client_estimates_are_ignored(counter: TokenCounter, version: object, parts: list[int]) -> None:
    data = {
        'id': 'm1',
        'role': 'user',
        'createdAt': T0,
        'content': 'abcde',
        'tokenCounts': {'version': counter.version if version is RIGHT_VERSION else version, 'parts': parts},
    }
    m = Message.model_validate(data)
    assert counter.count_message(m) == 13
    assert counter.with_token_counts(m).token_counts == TokenCounts(version=counter.version, parts=(5,))


def test_cache_with_count_on_reasoning_is_ignored(counter: TokenCounter) -> None:
    m = msg(parts=[{'type': 'reasoning', 'text': 'abc'}]).model_copy(
        update={'token_counts': TokenCounts(version=counter.version, parts=(500,))}
    )
    assert counter.count_message(m) == round(4 + 3.8)


def test_json_round_trip_keeps_counts(o200k: TokenCounter) -> None:
    m = o200k.with_token_counts(
        msg(
            'assistant',
            parts=[
                {'type': 'text', 'text': 'Here are the results ✅'},
                {'type': 'tool-call', 'toolCallId': 'c', 'toolName': 'lookup', 'args': {'city': 'Zürich'}},
                {'type': 'image', 'url': 's3://b/k.png', 'width': 1024, 'height': 768},
                {'type': 'reasoning', 'text': 'hmm'},
            ],
        )
    )
    again = Message.model_validate_json(m.model_dump_json(by_alias=True))
    assert again.token_counts == m.token_counts
    assert 'tokenCounts' in json.loads(m.model_dump_json(by_alias=True))
    assert o200k.count_message(again) == o200k.count_message(m)
    assert o200k.with_token_counts(again) is again


# -- parts ---------------------------------------------------------------------------------------------------------


def test_reasoning_counts_zero_and_has_no_entry(counter: TokenCounter) -> None:
    with_reasoning = msg(parts=[{'type': 'text', 'text': 'abc'}, {'type': 'reasoning', 'text': 'x' * 10_000}])
    without = msg(parts=[{'type': 'text', 'text': 'abc'}])
    assert counter.count_message(with_reasoning) == counter.count_message(without)
    assert counter.part_tokens(with_reasoning.parts[1]) is None
    assert counter.with_token_counts(with_reasoning).token_counts.parts == (3, None)  # type: ignore[union-attr]


def test_tool_call_counts_name_and_args(counter: TokenCounter) -> None:
    as_json = msg(
        'assistant', parts=[{'type': 'tool-call', 'toolCallId': 'c', 'toolName': 'search', 'args': {'q': 'x'}}]
    )
    # 'assistant' 9 + 'search' 6 + '{"q":"x"}' 9 + 3.8 - 12 = 15.8
    assert counter.count_message(as_json) == 16
    as_str = msg('assistant', parts=[{'type': 'tool-call', 'toolCallId': 'c', 'toolName': 'search', 'args': 'q=x'}])
    # 9 + 6 + 3 + 3.8 (no JSON adjustment for string args)
    assert counter.count_message(as_str) == 22
    empty = msg('assistant', parts=[{'type': 'tool-call', 'toolCallId': 'c', 'toolName': 'ping', 'args': ''}])
    assert counter.count_message(empty) == round(9 + 4 + 3.8)


def test_tool_result_counts_an_extra_message(counter: TokenCounter) -> None:
    as_str = msg('tool', parts=[{'type': 'tool-result', 'toolCallId': 'c', 'toolName': 't', 'result': 'ok'}])
    # 'tool' 4 + 'ok' 2 + 3.8 + 1 extra × 3.8 = 13.6
    assert counter.count_message(as_str) == 14
    as_json = msg('tool', parts=[{'type': 'tool-result', 'toolCallId': 'c', 'toolName': 't', 'result': {'a': 1}}])
    # '{\n  "a": 1\n}' is 12 chars: 4 + 12 + 3.8 - 12 + 3.8 = 11.6
    assert counter.count_message(as_json) == 12
    error = msg(
        'tool',
        parts=[{'type': 'tool-result', 'toolCallId': 'c', 'toolName': 't', 'result': 'boom', 'isError': True}],
    )
    assert counter.count_message(error) == round(4 + 4 + 3.8 * 2)


def test_tiny_json_tool_message_never_counts_negative(counter: TokenCounter) -> None:
    m = msg('tool', parts=[{'type': 'tool-call', 'toolCallId': 'c', 'toolName': 'a', 'args': {}}])
    assert counter.count_message(m) == 0


def test_encrypted_content_is_stripped() -> None:
    value = {'encryptedContent': 'x' * 6000, 'snippet': 'useful', 'nested': [{'encryptedContent': 'short'}]}
    text = format_tool_result(value)
    assert '[stripped encryptedContent: 6000 characters]' in text
    assert 'x' * 257 not in text
    assert '"encryptedContent": "short"' in text
    assert text.startswith('{\n  "encryptedContent"')
    assert format_tool_result('plain') == 'plain'


def test_encrypted_content_does_not_inflate_counts(counter: TokenCounter) -> None:
    big = {'type': 'tool-result', 'toolCallId': 'c', 'toolName': 'web', 'result': {'encryptedContent': 'y' * 50_000}}
    count = counter.count_message(msg('tool', parts=[big]))
    expected_text = json.dumps({'encryptedContent': '[stripped encryptedContent: 50000 characters]'}, indent=2)
    assert count == round(4 + len(expected_text) + 3.8 - 12 + 3.8)


# -- attachments (spec §4.3) ---------------------------------------------------------------------------------------


def test_gemini_images_by_tiles(counter: TokenCounter) -> None:
    assert counter.model == ModelContext('google', 'gemini-2.5-flash')
    with_dims = msg(parts=[{'type': 'image', 'url': 'https://x/a.png', 'width': 1024, 'height': 1024}]).parts[0]
    assert counter.part_tokens(with_dims) == 258 * 2 * 2
    small = msg(parts=[{'type': 'image', 'url': 'https://x/a.png', 'width': 500, 'height': 300}]).parts[0]
    assert counter.part_tokens(small) == 258
    unknown = msg(parts=[{'type': 'image', 'url': 'https://x/a.png'}]).parts[0]
    assert counter.part_tokens(unknown) == 258


def test_gemini_3_uses_media_resolution(chars: CharTokenizer) -> None:
    part = msg(parts=[{'type': 'image', 'url': 'https://x/a.png', 'width': 4000, 'height': 4000}]).parts[0]
    assert TokenCounter(chars, 'google/gemini-3-pro-preview').part_tokens(part) == 1120
    low = TokenCounter(chars, ModelContext('google', 'gemini-3-flash', media_resolution='low'))
    assert low.part_tokens(part) == 280


def test_png_header_gives_dimensions(counter: TokenCounter) -> None:
    data = png_b64(1536, 800)
    assert image_dimensions(data) == (1536, 800)
    assert image_dimensions(f'data:image/png;base64,{data}') == (1536, 800)
    part = msg(parts=[{'type': 'image', 'mediaType': 'image/png', 'data': data}]).parts[0]
    assert counter.part_tokens(part) == 258 * 2 * 2


def test_other_image_headers() -> None:
    assert image_dimensions(jpeg_b64(640, 480)) == (640, 480)
    gif = base64.b64encode(b'GIF89a' + struct.pack('<HH', 33, 44) + b'\0' * 20).decode()
    assert image_dimensions(gif) == (33, 44)
    vp8x = b'RIFF' + b'\0' * 4 + b'WEBP' + b'VP8X' + b'\0' * 8 + (99).to_bytes(3, 'little') + (49).to_bytes(3, 'little')
    assert image_dimensions(base64.b64encode(vp8x).decode()) == (100, 50)
    assert image_dimensions(base64.b64encode(b'not an image at all').decode()) is None
    assert image_dimensions('%%% not base64') is None


def test_openai_image_samples() -> None:
    gpt4o = ModelContext('openai', 'gpt-4o')
    # OpenAI's documented examples: 1024² high -> 765; 2048×4096 -> 1105; small images are low detail.
    assert estimate_image_tokens(gpt4o, width=1024, height=1024, size_bytes=None) == 765
    assert estimate_image_tokens(gpt4o, width=2048, height=4096, size_bytes=None) == 1105
    assert estimate_image_tokens(gpt4o, width=512, height=512, size_bytes=None) == 85
    assert estimate_image_tokens(gpt4o, width=None, height=None, size_bytes=None) == 85
    assert estimate_image_tokens(gpt4o, width=None, height=None, size_bytes=3 * 1024 * 1024) == 85 + 6 * 170
    assert estimate_image_tokens(ModelContext('openai', 'gpt-5'), width=1024, height=1024, size_bytes=None) == 630
    assert estimate_image_tokens(ModelContext('openai', 'gpt-4o-mini'), width=1024, height=1024, size_bytes=None) == (
        2833 + 4 * 5667
    )
    # Unknown providers use the OpenAI default estimator.
    assert estimate_image_tokens(ModelContext('offline', ''), width=1024, height=1024, size_bytes=None) == 765


def test_anthropic_image_samples() -> None:
    claude = ModelContext('anthropic', 'claude-sonnet-4-5')
    assert estimate_image_tokens(claude, width=1000, height=1000, size_bytes=None) == 1334
    assert estimate_image_tokens(claude, width=3136, height=1568, size_bytes=None) == 1640  # fitted to 1568×784
    assert estimate_image_tokens(claude, width=None, height=None, size_bytes=100 * 1024) == 341
    assert estimate_image_tokens(claude, width=None, height=None, size_bytes=None) == 1600


def test_counter_is_model_aware(chars: CharTokenizer) -> None:
    m = msg(parts=[{'type': 'image', 'url': 's3://b/k.png', 'width': 1000, 'height': 1000}])
    google = TokenCounter(chars)
    claude = google.with_model(('anthropic', 'claude-sonnet-4-5'))
    assert claude.version == google.version
    filled = google.with_token_counts(m)
    # The cached Gemini estimate is not reused for another model context: attachments are always re-derived.
    assert claude.count_message(filled) == round(4 + 1334 + 3.8)
    assert google.count_message(filled) == round(4 + 258 * 4 + 3.8)


def test_image_like_files_use_the_image_heuristic(counter: TokenCounter) -> None:
    for part in (
        {'type': 'file', 'mediaType': 'image/jpeg', 'url': 's3://b/k'},
        {'type': 'file', 'url': 'https://x/photo.JPG?sig=1'},
        {'type': 'file', 'url': 's3://b/k', 'filename': 'shot.webp'},
        {'type': 'file', 'data': f'data:image/png;base64,{png_b64(10, 10)}'},
    ):
        assert counter.part_tokens(msg(parts=[part]).parts[0]) == 258, part


def test_files_by_bytes(counter: TokenCounter) -> None:
    pdf = msg(parts=[{'type': 'file', 'mediaType': 'application/pdf', 'url': 's3://b/doc.pdf', 'size': 100_000}])
    assert counter.part_tokens(pdf.parts[0]) == 5000  # Google PDFs: bytes / 20
    inline = base64.b64encode(b'a' * 40).decode()
    text = msg(parts=[{'type': 'file', 'mediaType': 'text/plain; charset=utf-8', 'data': inline}])
    assert counter.part_tokens(text.parts[0]) == 10  # 40 bytes / 4
    assert estimate_file_tokens_from_bytes('anthropic', 'application/pdf', 3000) == 1500
    assert estimate_file_tokens_from_bytes('openai', 'APPLICATION/PDF', 100_000) == 25_000
    assert estimate_file_tokens_from_bytes('google', 'application/zip', 1) == 1


def test_file_without_size_counts_its_descriptor(counter: TokenCounter) -> None:
    part = msg(parts=[{'type': 'file', 'mediaType': 'application/pdf', 'url': 's3://bucket/a/report.pdf'}]).parts[0]
    descriptor = '{"type":"file","mimeType":"application/pdf","filename":"report.pdf"}'
    assert counter.part_tokens(part) == len(descriptor)


# -- the o200k adapter, offline ------------------------------------------------------------------------------------


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError('network access is blocked in this test')

    monkeypatch.setattr(socket.socket, 'connect', refuse)
    monkeypatch.setattr(socket.socket, 'connect_ex', refuse)
    monkeypatch.setattr(socket, 'create_connection', refuse)


@pytest.fixture
def fresh_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An empty TIKTOKEN_CACHE_DIR and an empty temp dir, and tiktoken's in-process registry without o200k."""
    env_dir = tmp_path / 'env-cache'
    env_dir.mkdir()
    tmp_dir = tmp_path / 'tmp'
    tmp_dir.mkdir()
    monkeypatch.setenv('TIKTOKEN_CACHE_DIR', str(env_dir))
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_dir))
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, 'o200k_base', raising=False)
    return env_dir, tmp_dir


def test_loads_offline_from_the_shipped_file(no_network: None, fresh_dirs: tuple[Path, Path]) -> None:
    env_dir, tmp_dir = fresh_dirs
    with pytest.raises(OSError):
        socket.create_connection(('example.com', 443))  # the fixture really blocks the network
    tokenizer = TiktokenTokenizer(load_encoding())
    assert (tmp_dir / 'om-tiktoken' / CACHE_FILE_NAME).is_file()
    assert os.environ['TIKTOKEN_CACHE_DIR'] == str(env_dir)  # restored after loading
    assert tokenizer.version == 'o200k_base'
    assert tokenizer.count('Hello world') == 2
    assert tokenizer.count('<|endoftext|>') > 1  # plain text, never a special token, never raises
    assert tokenizer.count('') == 0


def test_uses_a_preseeded_cache_dir(no_network: None, fresh_dirs: tuple[Path, Path]) -> None:
    env_dir, tmp_dir = fresh_dirs
    (env_dir / CACHE_FILE_NAME).write_bytes(gzip.decompress(tiktoken_counter.SHIPPED_FILE.read_bytes()))
    assert prepare_cache_dir() == env_dir
    assert not (tmp_dir / 'om-tiktoken').exists()
    assert TiktokenTokenizer(load_encoding()).count('Hello world') == 2


def test_corrupt_or_missing_shipped_file_is_a_clear_error(
    fresh_dirs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / 'bad.gz'
    bad.write_bytes(gzip.compress(b'not the encoding'))
    monkeypatch.setattr(tiktoken_counter, 'SHIPPED_FILE', bad)
    with pytest.raises(TokenizerLoadError, match='sha256'):
        prepare_cache_dir()
    monkeypatch.setattr(tiktoken_counter, 'SHIPPED_FILE', tmp_path / 'missing.gz')
    with pytest.raises(TokenizerLoadError, match='missing'):
        prepare_cache_dir()


def test_expected_hash_is_tiktokens() -> None:
    import tiktoken_ext.openai_public as openai_public

    assert EXPECTED_SHA256 in Path(openai_public.__file__).read_text()
    assert CACHE_FILE_NAME == 'fb374d419588a4632f3f557e76b4b70aebbca790'


def test_tokenizer_is_loaded_once() -> None:
    assert isinstance(get_tokenizer(), StringTokenizer)
    assert get_tokenizer() is get_tokenizer()
    assert tiktoken_counter.preload() is get_tokenizer()
