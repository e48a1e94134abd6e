"""Thread titles from `generateTitle` (seed 003): after a thread's first turn, a model names the conversation.

It never delays the answer: `after_turn` only queues a `title` job (the buffer worker runs `generate_title`); with no
background work available (a library user without a queue) it runs inline after the turn is saved. A thread that
already has a title (set by the client, by an earlier job or by the Observer's `threadTitle`) is left alone, so
duplicate jobs are harmless. A failing title model changes nothing and is not retried: titles are cosmetic.

`observation.threadTitle` is separate: the Observer proposes a new title when the topic changes (observation.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from om_lib.errors import ModelError, ThreadNotFoundError
from om_lib.llm import Content, ModelRequest
from om_lib.messages import Message
from om_lib.runtime.runtime import Runtime
from om_lib.work import Job

logger = logging.getLogger(__name__)

DEFAULT_INSTRUCTIONS = (
    'You write the title of a conversation from its first user message. '
    'Answer with the title only: at most 8 words, no quotes, no trailing punctuation, in the language of the message.'
)
MAX_TITLE_CHARS = 80
MAX_PROMPT_CHARS = 4000
# How far back `after_turn` looks for an earlier assistant message (a later turn is not the first one).
FIRST_TURN_LOOKBACK = 50


def title_job(resource_id: str, thread_id: str) -> Job:
    """The background job that titles one thread (its own FIFO group: it never holds back observations)."""
    return Job('title', resource_id, thread_id, f'title:{resource_id}/{thread_id}', 'first-turn')


def after_turn(rt: Runtime, resource_id: str, thread_id: str, saved: Sequence[Message]) -> bool:
    """After a saved turn: queue title generation when `generateTitle` is on and this was the untitled thread's first
    turn (no assistant message before it). Never raises. Returns True when a job was queued or a title was set."""
    if rt.settings.title_generation is None or not saved:
        return False
    try:
        thread = rt.store.get_thread(resource_id, thread_id)
        if thread is None or (thread.title or '').strip():
            return False
        first_seq = min(m.seq or 0 for m in saved)
        earlier = rt.store.list_messages(
            resource_id, thread_id, before_seq=first_seq, limit=FIRST_TURN_LOOKBACK, newest_first=True
        )
        if any(m.role == 'assistant' for m in earlier.messages):
            return False
        if rt.work is not None:
            return rt.submit(title_job(resource_id, thread_id))
        return generate_title(rt, resource_id, thread_id) is not None
    except Exception:  # noqa: BLE001 - the turn is saved; a title must never fail it
        logger.exception('title generation could not start', extra={'thread_id': thread_id})
        return False


def generate_title(rt: Runtime, resource_id: str, thread_id: str, *, deadline: float | None = None) -> str | None:
    """Title the thread from its first user message; returns the title set, or None (titled already, nothing to
    title, or the model failed). Raises ThreadNotFoundError when the thread is gone."""
    settings = rt.settings.title_generation
    if settings is None:
        return None
    thread = rt.store.get_thread(resource_id, thread_id)
    if thread is None:
        raise ThreadNotFoundError(thread_id)
    if (thread.title or '').strip():
        return None
    page = rt.store.list_messages(resource_id, thread_id, limit=FIRST_TURN_LOOKBACK)
    first = next((m for m in page.messages if m.role == 'user' and m.text().strip()), None)
    if first is None:
        return None
    text = first.text().strip()[:MAX_PROMPT_CHARS]
    request = ModelRequest(
        purpose='title',
        system=settings.instructions or DEFAULT_INSTRUCTIONS,
        contents=(Content('user', (f'Title this conversation. Its first user message:\n\n{text}',)),),
        source_messages=(first,),
    )
    limit = deadline if deadline is not None else rt.deadline()
    try:
        response = rt.router.generate(
            settings.model, request, input_tokens=rt.counter.count_string(text), deadline=limit
        )
    except ModelError as exc:
        logger.warning('title model failed', extra={'thread_id': thread_id, 'error': exc.code})
        return None
    title = clean_title(response.text)
    if not title:
        return None
    current = rt.store.get_thread(resource_id, thread_id)
    if current is None:
        raise ThreadNotFoundError(thread_id)
    if (current.title or '').strip():
        return None  # titled meanwhile (the client or the Observer): theirs wins
    rt.store.update_thread(current.model_copy(update={'title': title, 'updated_at': rt.clock.now()}))
    logger.info('thread titled', extra={'thread_id': thread_id})
    return title


def clean_title(text: str) -> str:
    """The first non-empty line, without Markdown, quotes or a `Title:` label, at most `MAX_TITLE_CHARS`."""
    line = next((line.strip() for line in (text or '').splitlines() if line.strip()), '')
    line = line.replace('**', '')
    previous = None
    while previous != line:
        previous = line
        line = re.sub(r'^(#+|title\s*:)', '', line, flags=re.IGNORECASE).strip()
        line = line.strip('*_`"\'“”‘’ ').rstrip('.').strip()
    line = ' '.join(line.split())
    if len(line) > MAX_TITLE_CHARS:
        line = line[: MAX_TITLE_CHARS - 1].rstrip() + '…'
    return line
