"""om-client: the Python client of the Observational Memory API, and adapters for agent frameworks.

`MemoryClient` / `AsyncMemoryClient` cover every route (docs/api.md). Integrations, each behind its extra:
`om_client.integrations.openai_agents` (OpenAI Agents SDK `Session`), `om_client.integrations.strands` (Strands
Agents hooks and the recall tool) and `om_client.integrations.mcp_server` (the `om-mcp` MCP server).
"""

from __future__ import annotations

from om_client._calls import RetryPolicy
from om_client._version import __version__
from om_client.auth import BearerAuth, IAMAuth, NoAuth
from om_client.client import AsyncMemoryClient, MemoryClient
from om_client.errors import (
    APIError,
    ConnectionFailed,
    InProgress,
    MessageConflict,
    NotFound,
    OMClientError,
    RateLimited,
    ThreadNotFound,
)
from om_client.models import (
    DataPart,
    FilePart,
    ImagePart,
    MemoryOperation,
    MemoryStatus,
    Message,
    ReasoningPart,
    StepResult,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    TurnResult,
    new_message_id,
)

__all__ = [
    'APIError',
    'AsyncMemoryClient',
    'BearerAuth',
    'ConnectionFailed',
    'InProgress',
    'DataPart',
    'FilePart',
    'IAMAuth',
    'ImagePart',
    'MemoryClient',
    'MemoryOperation',
    'MemoryStatus',
    'Message',
    'MessageConflict',
    'NoAuth',
    'NotFound',
    'OMClientError',
    'RateLimited',
    'ReasoningPart',
    'RetryPolicy',
    'StepResult',
    'TextPart',
    'ThreadNotFound',
    'ToolCallPart',
    'ToolResultPart',
    'TurnResult',
    '__version__',
    'new_message_id',
]
