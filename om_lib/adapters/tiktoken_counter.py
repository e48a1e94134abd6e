"""o200k string tokenizer (tiktoken `o200k_base`) that works fully offline.

tiktoken normally downloads its BPE file on first use. Lambda functions and tests have no network for that, so the
file ships inside this package (`data/o200k_base.tiktoken.gz`, the same bytes tiktoken would download) and is
placed where tiktoken looks before the encoding is built:

1. If `TIKTOKEN_CACHE_DIR` is set and already holds a valid file (a read-only, pre-seeded Lambda asset dir), use it.
2. Otherwise decompress the shipped file into `<tempdir>/om-tiktoken` (once per machine; atomic rename).

Either way the file's sha256 is checked against tiktoken's expected hash first, so tiktoken never falls back to a
download. Building the encoding costs about half a second, so it happens once per process (`get_tokenizer()`,
`preload()` at init time for Lambda SnapStart), never per request.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import threading
import uuid
from pathlib import Path

import tiktoken

ENCODING_NAME = 'o200k_base'
ENCODING_URL = 'https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken'
# tiktoken names its cache file after the sha1 of the URL (tiktoken.load.read_file_cached).
CACHE_FILE_NAME = hashlib.sha1(ENCODING_URL.encode()).hexdigest()
# The expected hash tiktoken checks (tiktoken_ext/openai_public.py, `o200k_base`).
EXPECTED_SHA256 = '446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d'
SHIPPED_FILE = Path(__file__).parent / 'data' / 'o200k_base.tiktoken.gz'
_CACHE_ENV = 'TIKTOKEN_CACHE_DIR'


class TokenizerLoadError(RuntimeError):
    """The shipped o200k file is missing or corrupt, or the encoding could not be built from it."""


class TiktokenTokenizer:
    """`StringTokenizer` on tiktoken's `o200k_base`.

    Use `get_tokenizer()` to share the per-process instance rather than constructing one per request.
    """

    version: str = ENCODING_NAME

    def __init__(self, encoding: tiktoken.Encoding | None = None) -> None:
        """Wrap an already built encoding, or load o200k_base from the shipped file (costly: prefer get_tokenizer)."""
        self._encoding = encoding if encoding is not None else load_encoding()

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The underlying tiktoken encoding."""
        return self._encoding

    def count(self, text: str) -> int:
        """Number of o200k tokens of `text`; 0 for ''.

        Uses `encode_ordinary`: special-token strings such as `<|endoftext|>` in user text are plain text here and
        must never raise.
        """
        if not text:
            return 0
        return len(self._encoding.encode_ordinary(text))


def _is_valid(path: Path) -> bool:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == EXPECTED_SHA256
    except OSError:
        return False


def _read_shipped() -> bytes:
    try:
        with gzip.open(SHIPPED_FILE, 'rb') as f:
            data = f.read()
    except FileNotFoundError as exc:
        raise TokenizerLoadError(
            f'the o200k_base encoding file is missing from the package: {SHIPPED_FILE} (packaging error)'
        ) from exc
    except (OSError, EOFError) as exc:
        raise TokenizerLoadError(f'the shipped o200k_base file {SHIPPED_FILE} is unreadable: {exc}') from exc
    if hashlib.sha256(data).hexdigest() != EXPECTED_SHA256:
        raise TokenizerLoadError(
            f'the shipped o200k_base file {SHIPPED_FILE} does not match sha256 {EXPECTED_SHA256}; refusing to use it'
        )
    return data


def prepare_cache_dir() -> Path:
    """A directory holding a verified o200k_base file under tiktoken's cache name; writes one if needed.

    Raises:
        TokenizerLoadError: The shipped file is missing or corrupt, or no writable temp dir exists.
    """
    configured = os.environ.get(_CACHE_ENV)
    if configured and _is_valid(Path(configured) / CACHE_FILE_NAME):
        return Path(configured)
    target = Path(tempfile.gettempdir()) / 'om-tiktoken'
    final = target / CACHE_FILE_NAME
    if _is_valid(final):
        return target
    data = _read_shipped()
    try:
        target.mkdir(parents=True, exist_ok=True)
        # Unique temp name + atomic replace: concurrent processes never see a half-written file.
        tmp = target / f'{CACHE_FILE_NAME}.{os.getpid()}.{uuid.uuid4().hex}.tmp'
        tmp.write_bytes(data)
        os.replace(tmp, final)
    except OSError as exc:
        raise TokenizerLoadError(f'cannot write the o200k_base cache file under {target}: {exc}') from exc
    return target


def load_encoding() -> tiktoken.Encoding:
    """Build (or fetch from tiktoken's in-process registry) the o200k_base encoding without any network access."""
    cache_dir = prepare_cache_dir()
    previous = os.environ.get(_CACHE_ENV)
    # tiktoken reads the variable at load time; restore it afterwards so the process environment is unchanged.
    os.environ[_CACHE_ENV] = str(cache_dir)
    try:
        return tiktoken.get_encoding(ENCODING_NAME)
    except Exception as exc:  # any failure here means no tokenizer at all: say why, clearly
        raise TokenizerLoadError(f'cannot build the o200k_base encoding from {cache_dir}: {exc}') from exc
    finally:
        if previous is None:
            os.environ.pop(_CACHE_ENV, None)
        else:
            os.environ[_CACHE_ENV] = previous


_lock = threading.Lock()
_tokenizer: TiktokenTokenizer | None = None


def get_tokenizer() -> TiktokenTokenizer:
    """The process-wide o200k tokenizer, loaded on first use (thread-safe, loaded once)."""
    global _tokenizer
    tokenizer = _tokenizer
    if tokenizer is None:
        with _lock:
            tokenizer = _tokenizer
            if tokenizer is None:
                tokenizer = TiktokenTokenizer(load_encoding())
                _tokenizer = tokenizer
    return tokenizer


def preload() -> TiktokenTokenizer:
    """Load the tokenizer now (Lambda init / SnapStart) and run one encode so the first request pays nothing."""
    tokenizer = get_tokenizer()
    tokenizer.count('warm up')
    return tokenizer
