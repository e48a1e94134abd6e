"""The streamed chat answer: the AI SDK's UI message stream (protocol v1) over server-sent events.

A chat turn reports what happens as `ChatEvent`s (om_lib.conversation.chat); `UiMessageStream` turns them into the
protocol's chunks, each framed as `data: <json>\\n\\n`:

    start {messageId}                  the reply's id, once the message is claimed (not answered before)
    data-om-status {id, data}          the memory's windows as the step found them (replaced by the final one: same id)
    data-om-observation-start {data}   before the Observer (or Reflector) call; -end / -failed after it
    data-om-status {id, data}          the windows the Actor gets
    start-step                         an Actor call
    text-start {id} / text-delta {id, delta} / text-end {id}
    tool-input-available / tool-output-available | tool-output-error    tools the server ran (recall, ...)
    finish-step
    data-om-scheduled, data-om-buffering-start, ...   what the turn queued
    error {errorText, code}            the Actor failed (the message is saved: retry it with the same id)
    finish {finishReason}
    data: [DONE]

`ChatStream` runs the turn on a worker thread and hands its frames to whoever sends them (the Lambda streaming
runtime, `om serve`); the consumer may stop reading (its client went away) and the turn still finishes and is saved.
The route hands its stream to the transport through `pending` (same thread): a transport that streams takes it
(`accepting_streams`), any other caller gets the whole stream as the body (`lambda_handler` on a buffered
integration, `om invoke`).

Framing is written here rather than taken from a library: it is one line per chunk, and the maintained Python
implementation (pydantic-ai's Vercel AI types) would add its agent framework to the API function's cold start. The
chunks are checked by the real `ai` package's reader in the tests (tests/e2e/test_chat_stream*.py).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from functions.api.errors import map_om_error
from om_lib.errors import OMError
from om_lib.parts import ActorFailed, Status
from om_lib.service import (
    ActorFinished,
    ActorStarted,
    ChatEvent,
    ChatResult,
    MemoryPart,
    TextDelta,
    ToolAnswered,
    ToolCalled,
    TurnStarted,
)

logger = logging.getLogger(__name__)

EVENT_STREAM = 'text/event-stream'
# The protocol's response headers (the `ai` package's UI_MESSAGE_STREAM_HEADERS, less `connection`, which is the
# transport's business: HTTP/1.1 keep-alive or HTTP/2).
STREAM_HEADERS = {
    'Content-Type': EVENT_STREAM,
    'Cache-Control': 'no-cache',
    'X-Vercel-AI-UI-Message-Stream': 'v1',
    'X-Accel-Buffering': 'no',
}
DONE = b'data: [DONE]\n\n'
# The id every `data-om-status` chunk of one answer carries: a chat UI keeps one status part and updates it.
STATUS_PART_ID = 'om-status'

Chunk = dict[str, Any]


def frame(chunk: Chunk) -> bytes:
    """One server-sent event: `data: <compact JSON>` and a blank line."""
    return b'data: ' + json.dumps(chunk, separators=(',', ':'), ensure_ascii=False).encode() + b'\n\n'


class UiMessageStream:
    """Turns a chat turn's events into UI message stream chunks (text blocks opened and closed, steps matched)."""

    def __init__(self) -> None:
        self._text_id: str | None = None
        self._texts = 0
        self._in_step = False
        self.started = False

    def chunks(self, event: ChatEvent) -> list[Chunk]:
        """The chunks for one event, in order."""
        if isinstance(event, TurnStarted):
            self.started = True
            return [{'type': 'start', 'messageId': event.reply_id}]
        if isinstance(event, MemoryPart):
            chunk: Chunk = {'type': event.part.kind(), 'data': event.part.data()}
            if isinstance(event.part, Status):
                chunk['id'] = STATUS_PART_ID
            return [chunk]
        if isinstance(event, ActorStarted):
            self._in_step = True
            return [{'type': 'start-step'}]
        if isinstance(event, TextDelta):
            out: list[Chunk] = []
            if self._text_id is None:
                self._texts += 1
                self._text_id = f'text-{self._texts}'
                out.append({'type': 'text-start', 'id': self._text_id})
            out.append({'type': 'text-delta', 'id': self._text_id, 'delta': event.text})
            return out
        if isinstance(event, ToolCalled):
            call = event.call
            chunk = {
                'type': 'tool-input-available',
                'toolCallId': call.tool_call_id,
                'toolName': call.tool_name,
                'input': call.args,
                'dynamic': True,
            }
            if event.server:
                chunk['providerExecuted'] = True
            return [*self._close_text(), chunk]
        if isinstance(event, ToolAnswered):
            result = event.result
            if result.is_error:
                error = result.result.get('error') if isinstance(result.result, dict) else None
                text = str(error or json.dumps(result.result, default=str))
                return [{'type': 'tool-output-error', 'toolCallId': result.tool_call_id, 'errorText': text}]
            return [
                {
                    'type': 'tool-output-available',
                    'toolCallId': result.tool_call_id,
                    'output': result.result,
                    'providerExecuted': True,
                    'dynamic': True,
                }
            ]
        if isinstance(event, ActorFinished):
            return self._end_step()
        raise TypeError(f'unknown chat event {type(event).__name__}')

    def finish(self, result: ChatResult | None, error: OMError | Exception | None = None) -> list[Chunk]:
        """The closing chunks: an `error` when the turn failed after it began, then `finish` (`[DONE]` follows)."""
        out = self._end_step()
        failed = next((p for p in result.parts if isinstance(p, ActorFailed)), None) if result is not None else None
        if error is not None:
            code, message = _error_of(error)
            out.append({'type': 'error', 'errorText': message, 'code': code})
        elif result is not None and result.reply is None and failed is not None:
            out.append({'type': 'error', 'errorText': failed.message, 'code': failed.error})
        reason = 'stop'
        if error is not None or (result is not None and result.reply is None):
            reason = 'error'
        elif result is not None and result.reply is not None and any(p.type == 'tool-call' for p in result.reply.parts):
            reason = 'tool-calls'
        out.append({'type': 'finish', 'finishReason': reason})
        return out

    def _close_text(self) -> list[Chunk]:
        if self._text_id is None:
            return []
        closed, self._text_id = self._text_id, None
        return [{'type': 'text-end', 'id': closed}]

    def _end_step(self) -> list[Chunk]:
        out = self._close_text()
        if self._in_step:
            self._in_step = False
            out.append({'type': 'finish-step'})
        return out


def _error_of(error: Exception) -> tuple[str, str]:
    if isinstance(error, OMError):
        _, code, message = map_om_error(error)
        return code, message
    return 'internal_error', 'the server failed while answering; the message is saved, retry it with the same id'


_END = object()


class ChatStream:
    """A chat turn running on its own thread, its events turned into frames for a transport to send.

    `start()` runs the turn and waits until it has either begun (its first event) or failed before that, which it
    re-raises, so the route can still answer with an error status (nothing was written). `frames()` then yields every
    frame through `[DONE]`. A consumer that stops reading early (`close()` on the generator, or just abandoning it)
    does not stop the turn: it finishes and is saved; `wait()` blocks until it has (a Lambda invocation must not end
    before its work does).
    """

    def __init__(
        self,
        run: Callable[[Callable[[ChatEvent], None]], ChatResult],
        *,
        on_done: Callable[[ChatResult], None] | None = None,
    ) -> None:
        self._run = run
        self._on_done = on_done
        self._queue: queue.Queue[Any] = queue.Queue()
        self._began = threading.Event()
        self._done = threading.Event()
        self._early_error: BaseException | None = None
        self._encoder = UiMessageStream()
        self._thread = threading.Thread(target=self._work, name='om-chat-stream', daemon=True)
        self.result: ChatResult | None = None

    def start(self) -> ChatStream:
        """Run the turn; return once it began. Raises what the turn raised before its first event."""
        self._thread.start()
        self._began.wait()
        if self._early_error is not None:
            raise self._early_error
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the turn has finished (True) or `timeout` passed (False)."""
        return self._done.wait(timeout)

    def frames(self) -> Iterator[bytes]:
        """The frames, each as soon as it is made, ending with `data: [DONE]`."""
        while True:
            item = self._queue.get()
            if item is _END:
                return
            yield item

    def _listen(self, event: ChatEvent) -> None:
        for chunk in self._encoder.chunks(event):
            self._queue.put(frame(chunk))
        self._began.set()

    def _work(self) -> None:
        result: ChatResult | None = None
        error: BaseException | None = None
        try:
            result = self._run(self._listen)
        except BaseException as exc:  # noqa: BLE001 - reported to the route (before the start) or in the stream
            error = exc
        try:
            if not self._encoder.started:
                if error is None and result is not None:
                    # Nothing was heard (a listener that never got an event): the result still makes a whole answer.
                    self._replay_result(result)
                else:
                    self._early_error = error
                    return
            if error is not None and not isinstance(error, Exception):
                raise error
            if error is not None:
                logger.warning('chat failed after its stream began', extra={'error': type(error).__name__})
            for chunk in self._encoder.finish(result, error if isinstance(error, Exception) else None):
                self._queue.put(frame(chunk))
            self.result = result
            if result is not None and self._on_done is not None:
                try:  # before [DONE]: a reader that stops there has the turn's metrics and logs recorded
                    self._on_done(result)
                except Exception:  # noqa: BLE001 - metrics and logs must not fail a finished turn
                    logger.exception('recording a streamed chat failed')
            self._queue.put(DONE)
        finally:
            self._queue.put(_END)
            self._done.set()
            self._began.set()

    def _replay_result(self, result: ChatResult) -> None:
        reply = result.reply
        self._listen(TurnStarted(reply.id if reply is not None else ''))
        for part in result.parts:
            self._listen(MemoryPart(part))


# -- handing a stream from the route to the transport (one request runs on one thread) --------------------------------
_local = threading.local()


def hand_over(stream: ChatStream) -> None:
    """The route's streamed answer, for the transport that sends it (see the module docstring)."""
    _local.pending = stream


def take_pending() -> ChatStream | None:
    """The streamed answer the route on this thread left, if any (taken: a second call gets None)."""
    stream: ChatStream | None = getattr(_local, 'pending', None)
    _local.pending = None
    return stream


def transport_streams() -> bool:
    """Whether the caller on this thread sends streamed answers itself (else the handler buffers them)."""
    return bool(getattr(_local, 'accepting', False))


@contextmanager
def accepting_streams() -> Iterator[None]:
    """For a transport that streams: while the block runs, a streamed answer is left for `take_pending`."""
    _local.accepting = True
    try:
        yield
    finally:
        _local.accepting = False
        _local.pending = None  # a stream the transport did not take (it failed first) goes on without a reader


def buffered(result: dict[str, Any]) -> dict[str, Any]:
    """`result` with a pending streamed answer read whole into its body (for callers that cannot stream)."""
    stream = take_pending()
    if stream is None:
        return result
    body = b''.join(stream.frames())
    return {**result, 'body': body.decode('utf-8'), 'isBase64Encoded': False}
