"""What the integrations share: calling either client from async code, and running the memory tools."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from om_client.client import AsyncMemoryClient, MemoryClient
from om_client.errors import APIError, ConnectionFailed, InvalidRequest
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
