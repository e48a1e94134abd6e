"""`ScriptedModel`: an in-process LanguageModel for fast unit tests (the HTTP fake is tests/fakes/fake_gemini.py)."""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

from om_lib.errors import ModelError
from om_lib.llm import ModelRequest, ModelResponse, Usage

Answer = str | ModelError | Callable[[ModelRequest], str]


@dataclass
class ScriptedCall:
    """One logged call."""

    model_id: str
    purpose: str
    request: ModelRequest


class ScriptedModel:
    """Answers per purpose from a queue of scripted answers (text, an error to raise, or a function of the request).

    With nothing queued for a purpose, `fallback(request)` answers (default: a one-line observation block).
    """

    def __init__(self, fallback: Callable[[ModelRequest], str] | None = None) -> None:
        self._queues: dict[str, deque[Answer]] = defaultdict(deque)
        self._fallback = fallback or (lambda r: '<observations>\n* 🟡 (09:00) Something happened\n</observations>')
        self._lock = threading.Lock()
        self.calls: list[ScriptedCall] = []

    def script(self, purpose: str, *answers: Answer) -> None:
        """Queue answers for one purpose (`observer`, `reflector`, `actor`, `title`)."""
        with self._lock:
            self._queues[purpose].extend(answers)

    def calls_for(self, purpose: str) -> list[ScriptedCall]:
        """Calls made for one purpose."""
        return [c for c in self.calls if c.purpose == purpose]

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        """Pop the next scripted answer for the request's purpose."""
        with self._lock:
            self.calls.append(ScriptedCall(model_id, request.purpose, request))
            queue = self._queues[request.purpose]
            answer: Answer = queue.popleft() if queue else self._fallback
        if isinstance(answer, ModelError):
            raise answer
        text = answer(request) if callable(answer) else answer
        # A usage a provider would report: about four characters a token (lifecycle events carry it).
        prompt = sum(len(p) for c in request.contents for p in c.parts if isinstance(p, str)) + len(request.system)
        usage = Usage(input_tokens=prompt // 4 + 1, output_tokens=len(text) // 4 + 1)
        # It answers as the model asked for, as a provider's adapter does (`offline/…` would say a stand-in ran).
        return ModelResponse(text=text, model=model_id, usage=usage)
