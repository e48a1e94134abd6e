"""Provider-neutral language-model request and response types (the model port's vocabulary)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from om_lib.messages import Message

Purpose = Literal['observer', 'reflector', 'actor', 'title']


@dataclass(frozen=True)
class InlineBlob:
    """Binary content sent inline with a request (an image the Observer should see)."""

    mime_type: str
    data: bytes


@dataclass(frozen=True)
class FunctionCall:
    """A tool call the model asked for."""

    name: str
    args: dict[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class FunctionResponse:
    """A tool result handed back to the model."""

    name: str
    response: dict[str, Any]
    id: str | None = None


ContentPart = str | InlineBlob | FunctionCall | FunctionResponse


@dataclass(frozen=True)
class Content:
    """One turn of the conversation sent to the model. `role` is 'user' or 'model' (Gemini's vocabulary)."""

    role: Literal['user', 'model']
    parts: tuple[ContentPart, ...]


@dataclass(frozen=True)
class FunctionDeclaration:
    """A tool the model may call; `parameters` is a JSON Schema object."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    """Everything one generate call needs.

    `source_messages` / `source_observations` carry the structured input the prompt was built from. Real providers
    ignore them; the offline model reads them instead of re-parsing prompt text.
    """

    purpose: Purpose
    system: str
    contents: tuple[Content, ...]
    temperature: float | None = None
    max_output_tokens: int | None = None
    thinking_budget: int | None = None
    tools: tuple[FunctionDeclaration, ...] = ()
    source_messages: tuple[Message, ...] = ()
    source_observations: str = ''


@dataclass(frozen=True)
class Usage:
    """Token usage the provider reported (0 when unknown).

    `input_tokens` counts every input token, cached or not; `cache_read_tokens` / `cache_write_tokens` say how many of
    them the provider's prompt cache served or stored (Bedrock cache points, OpenAI's automatic caching).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


@dataclass(frozen=True)
class CallUsage:
    """What the model calls behind one outcome cost: the model that answered (the last one, when a fallback took over),
    how many calls, and the tokens the provider reported for them (lifecycle events carry it)."""

    model: str
    usage: Usage = field(default_factory=Usage)
    calls: int = 1

    @classmethod
    def of(cls, response: ModelResponse) -> CallUsage:
        """The usage of one answer."""
        return cls(model=response.model, usage=response.usage, calls=1)

    def __add__(self, other: CallUsage) -> CallUsage:
        return CallUsage(
            model=other.model or self.model, usage=self.usage + other.usage, calls=self.calls + other.calls
        )

    def share(self, part: int, whole: int) -> CallUsage:
        """This usage split in proportion `part / whole` (one call observed several conversations)."""
        if whole <= 0 or part >= whole:
            return self
        ratio = part / whole
        u = self.usage
        return CallUsage(
            model=self.model,
            usage=Usage(
                round(u.input_tokens * ratio),
                round(u.output_tokens * ratio),
                round(u.cache_read_tokens * ratio),
                round(u.cache_write_tokens * ratio),
            ),
            calls=self.calls,
        )

    def as_json(self) -> dict[str, Any]:
        """`{model, calls, inputTokens, outputTokens, totalTokens}` (cache figures when the provider reported some)."""
        u = self.usage
        out: dict[str, Any] = {
            'model': self.model,
            'calls': self.calls,
            'inputTokens': u.input_tokens,
            'outputTokens': u.output_tokens,
            'totalTokens': u.input_tokens + u.output_tokens,
        }
        if u.cache_read_tokens:
            out['cacheReadTokens'] = u.cache_read_tokens
        if u.cache_write_tokens:
            out['cacheWriteTokens'] = u.cache_write_tokens
        return out


def total_usage(usages: list[CallUsage]) -> CallUsage | None:
    """The sum of several calls' usage (None when there was no call)."""
    if not usages:
        return None
    out = usages[0]
    for more in usages[1:]:
        out = out + more
    return out


@dataclass(frozen=True)
class ModelResponse:
    """A usable model answer: text and/or function calls."""

    text: str
    model: str
    function_calls: tuple[FunctionCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
