"""What the integrations share: calling either client from async code, the thread a session or hook provider is
bound to (steps, turns, parts, tool names), and running the memory tools."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from om_client.client import AsyncMemoryClient, MemoryClient
from om_client.errors import APIError, ConnectionFailed, InvalidRequest
from om_client.models import DataPart, Message, StepResult, ToolCallPart, TurnResult
from om_client.tools import (
    json_object_text,
    recall_answer,
    recall_call,
    recall_error,
    working_memory_answer,
    working_memory_value,
)

AnyClient = MemoryClient | AsyncMemoryClient


async def call(client: AnyClient, method: str, *args: Any, **kwargs: Any) -> Any:
    """`client.<method>(...)`: awaited on the async client, in a worker thread on the blocking one."""
    if isinstance(client, AsyncMemoryClient):
        return await getattr(client, method)(*args, **kwargs)
    return await asyncio.to_thread(getattr(client, method), *args, **kwargs)


async def run_recall(client: AnyClient, thread_id: str, resource_id: str, args: Mapping[str, Any] | str | None) -> str:
    """One `recall` call from a model: the tool's returns as JSON text, or `{error}` with the service's message."""
    try:
        target, kwargs = recall_call(args, thread_id)
        result = await call(client, 'recall', target, resource_id=resource_id, **kwargs)
    except (APIError, ValueError) as exc:
        return recall_error(exc)
    except ConnectionFailed as exc:
        return recall_error(ValueError(f'the memory service is unreachable: {exc}'))
    return recall_answer(result)


async def run_update_working_memory(
    client: AnyClient, thread_id: str, resource_id: str, args: Mapping[str, Any] | str | None
) -> tuple[str, bool]:
    """One `updateWorkingMemory` call from a model: (`{success}` JSON text, whether it failed)."""
    try:
        value = working_memory_value(args)
        try:
            await call(client, 'update_working_memory', value, thread_id=thread_id, resource_id=resource_id)
        except InvalidRequest:
            as_object = json_object_text(value)  # JSON-format memory sent as text by the model
            if as_object is None:
                raise
            await call(client, 'update_working_memory', as_object, thread_id=thread_id, resource_id=resource_id)
    except APIError as exc:
        return working_memory_answer(False, exc.message), True
    except (ValueError, ConnectionFailed) as exc:
        return working_memory_answer(False, str(exc)), True
    return working_memory_answer(True), False


# What the step route takes as `actorModel`: `provider/model`, no whitespace, 3 to 200 characters.
_ACTOR_MODEL = re.compile(r'^[A-Za-z0-9][\w.:@-]*/[^\s/][^\s]*$')


def actor_model_name(provider: str, model_id: str) -> str | None:
    """`provider/model` as the step route takes it, from what a framework reports (a model id's leading slashes and
    whitespace dropped: a vLLM model served from `/models/llama 3`); None when the route would still refuse it, so a
    step never fails over a name (memory then treats the model as unknown)."""
    model = re.sub(r'\s+', '-', model_id.strip().lstrip('/'))
    name = f'{provider.strip()}/{model}'
    return name if 3 <= len(name) <= 200 and _ACTOR_MODEL.match(name) else None


def check_actor_model(actor_model: str | None) -> str | None:
    """An `actor_model` given by the caller, refused at once (not at every step) when the step route would refuse it."""
    if actor_model is not None and not (3 <= len(actor_model) <= 200 and _ACTOR_MODEL.match(actor_model)):
        raise ValueError(
            f'actor_model must be `provider/model` without spaces, 3 to 200 characters (e.g. "openai/gpt-4o-mini"), '
            f'not {actor_model[:80]!r}'
        )
    return actor_model


class ThreadBinding:
    """One thread's memory as an integration uses it: the client, the thread, whose memory it is (default: the
    client's `resource_id`), the model the Actor runs when the caller names it, and who hears of the `data-om-*`
    parts of each step and turn."""

    def __init__(
        self,
        client: AnyClient,
        *,
        thread_id: str,
        resource_id: str | None,
        read_only: bool | None,
        on_parts: Callable[[list[DataPart]], Any] | None,
        actor_model: str | None = None,
    ) -> None:
        self.client = client
        self.thread_id = thread_id
        resource = resource_id or client.resource_id
        if not resource:
            raise ValueError('resource_id is required (or create the client with resource_id=...)')
        self.resource_id: str = resource
        self.read_only = read_only
        self.on_parts = on_parts
        self.actor_model = check_actor_model(actor_model)
        self.last_step: StepResult | None = None
        self._tool_names: dict[str, str] = {}  # tool call id -> tool name: filled by calls, read by their results

    def _publish(self, parts: Sequence[DataPart]) -> None:
        if self.on_parts is not None and parts:
            self.on_parts(list(parts))

    async def _step(self, new: Sequence[Message], *, actor_model: str | None = None) -> StepResult:
        """Save the new input as a step; the Actor's context. Outputs saved later may answer calls made in it, so
        their tool names are kept. `actor_model`: the model this step's Actor runs, when the framework says (the
        binding's own `actor_model` wins)."""
        step: StepResult = await call(
            self.client,
            'step',
            self.thread_id,
            new,
            resource_id=self.resource_id,
            read_only=self.read_only,
            actor_model=self.actor_model or actor_model,
        )
        self._learn_tool_names(step.messages)
        return step

    async def _turn(self, messages: Sequence[Message]) -> TurnResult:
        turn: TurnResult = await call(self.client, 'turn', self.thread_id, messages, resource_id=self.resource_id)
        return turn

    def _learn_tool_names(self, messages: Iterable[Message]) -> None:
        for message in messages:
            for part in message.parts:
                if isinstance(part, ToolCallPart):
                    self._tool_names[part.tool_call_id] = part.tool_name

    async def _recall(self, args: Mapping[str, Any] | str | None) -> str:
        return await run_recall(self.client, self.thread_id, self.resource_id, args)

    async def _update_working_memory(self, args: Mapping[str, Any] | str | None) -> tuple[str, bool]:
        return await run_update_working_memory(self.client, self.thread_id, self.resource_id, args)
