"""What the integrations share: calling either client from async code."""

from __future__ import annotations

import asyncio
from typing import Any

from om_client.client import AsyncMemoryClient, MemoryClient

AnyClient = MemoryClient | AsyncMemoryClient


async def call(client: AnyClient, method: str, *args: Any, **kwargs: Any) -> Any:
    """`client.<method>(...)`: awaited on the async client, in a worker thread on the blocking one."""
    if isinstance(client, AsyncMemoryClient):
        return await getattr(client, method)(*args, **kwargs)
    return await asyncio.to_thread(getattr(client, method), *args, **kwargs)
