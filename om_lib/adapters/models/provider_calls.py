"""What the model and embedding adapters (Gemini, OpenAI, Bedrock) share: the client kept per API key, the error for a
provider that says "later", and an embedding call's batches within one deadline.

Nothing here imports a provider SDK: each adapter still imports its own on first use (cold starts pay for none)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

from om_lib.adapters.models.retry_after import retry_after_s
from om_lib.errors import DeadlineExceededError, ModelThrottledError, ModelUnavailableError

Client = TypeVar('Client')


class KeyedClient(Generic[Client]):
    """A provider client built on first use and reused (warm Lambda invocations keep its connection pool), rebuilt
    when the API key changes: a rotated key, or the real key stored after a deploy that snapshotted a placeholder."""

    def __init__(
        self,
        build: Callable[[str | None], Client],
        *,
        api_key: str | None,
        api_key_provider: Callable[[], str | None] | None,
        client: Client | None,
    ) -> None:
        """`build(key)` makes a client (importing its SDK then); `api_key_provider`, when given, is asked for the key on
        every call instead of `api_key`; `client` is a ready one to start with."""
        self._build = build
        self._api_key = api_key
        self._api_key_provider = api_key_provider
        self._client = client
        self._lock = threading.Lock()  # keeps concurrent callers from building two clients

    def get(self) -> Client:
        """The client for the current key."""
        key = self._api_key_provider() if self._api_key_provider is not None else self._api_key
        with self._lock:
            if self._client is not None and key != self._api_key:
                self._client = None  # the key changed: new client
            self._api_key = key
            if self._client is None:
                self._client = self._build(key)
            return self._client


def unavailable_error(
    message: str, *, status_code: int | None, throttled: bool, headers: Mapping[str, str] | None
) -> ModelUnavailableError:
    """The error for a provider that says "try again later", with its `Retry-After` when it sent one.

    A rate limit (`throttled`) gets its own type: the workflow's retry waits longer for it than for an outage.
    """
    kind = ModelThrottledError if throttled else ModelUnavailableError
    return kind(message, status_code=status_code, retry_after_s=retry_after_s(headers))


def time_left(deadline: float, model_name: str) -> float:
    """Seconds left before `deadline` (time.monotonic); DeadlineExceededError when none."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceededError(f'no time left to embed with {model_name}')
    return left


def embedding_text(text: str, max_chars: int) -> str:
    """A text as an embedding model takes it: never empty (models refuse ''), cut to its start (what a search needs to
    find the message; recall then shows it whole)."""
    return (text or ' ')[:max_chars]


def embedding_batches(
    texts: Sequence[str], *, size: int, max_chars: int, deadline: float, model_name: str
) -> Iterator[tuple[list[str], float]]:
    """`texts` in batches of `size` (see `embedding_text`), each with the seconds left for its call."""
    for start in range(0, len(texts), size):
        left = time_left(deadline, model_name)
        yield [embedding_text(text, max_chars) for text in texts[start : start + size]], left
