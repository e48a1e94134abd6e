"""`om-mcp`: a user's Observational Memory as an MCP server (`pip install 'om-client[mcp]'`).

    om-mcp --api-url https://abc123.execute-api.eu-west-1.amazonaws.com/prod --resource-id me --auth iam
    om-mcp --api-url http://127.0.0.1:8787 --resource-id me --http 8765      # streamable HTTP on /mcp

Tools (all for the one `--resource-id`):
- `recall` — the recall tool (`threadId`, `mode`, `cursor`, `page`, `limit`, `detail`, `partIndex`, `query`, `before`,
  `after`): raw messages behind the observations, the list of threads, or (with vectors) a search by meaning.
- `memory` — `{threadId}` → the observation log, the current task and the token status, as text.
- `search` — messages closest in meaning to a query, across the resource's threads; listed only when the service
  has vectors on (`retrieval: {vector: true}`), which `--search auto` (the default) asks the service at start-up.
- `list_threads` — the resource's threads, newest activity first.
- With `--operations`: `observe` (`{threadId, messages?}`: the thread's unobserved messages now, or imported history
  with its dates, observed without being added to the thread), `reflect` and `buffer` (`{threadId}`): memory work run
  now. They change the memory (nothing is deleted), so they are offered only when asked for.

It serves stdio by default (what desktop assistants and IDE agents start); nothing but the protocol goes to stdout.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from om_client._version import __version__
from om_client.auth import BearerAuth
from om_client.client import AsyncMemoryClient, MemoryClient
from om_client.errors import APIError, ConnectionFailed, InvalidRequest, NotFound, RetrievalDisabled
from om_client.models import MemoryOperation, MemoryStatus, ThreadsPage
from om_client.tools import RECALL_DESCRIPTION, recall_answer

__all__ = ['build_server', 'format_memory', 'format_operation', 'format_threads', 'main', 'vectors_enabled']

logger = logging.getLogger('om_client.mcp')

INSTRUCTIONS = (
    "Read-only access to the user's Observational Memory: dated, prioritised observations of past conversations "
    '(`memory`), the raw messages behind them (`recall`), their conversations (`list_threads`) and, when available, '
    'a search by meaning (`search`). Start with `list_threads`, then `memory` for a thread.'
)
OPERATIONS_INSTRUCTIONS = (
    ' `observe`, `reflect` and `buffer` run memory work now: observe a thread (or history imported from elsewhere, '
    'each message with its createdAt), condense its observations, or buffer them for later.'
)


def format_memory(thread_id: str, status: MemoryStatus) -> str:
    """The memory of a thread as text for a model: status lines, then the observation log."""
    lines = [f'Memory of thread {thread_id} (scope: {status.scope}, generation {status.generation_count})']
    if status.thresholds is not None:
        lines.append(
            f'Observations: {status.observation_tokens} tokens (reflection at {status.thresholds.observation_tokens}); '
            f'unobserved messages: {status.pending_message_tokens} tokens '
            f'(observation at {status.thresholds.message_tokens})'
        )
    if status.last_observed_at:
        lines.append(f'Last observed: {status.last_observed_at}')
    if status.current_task:
        lines.append(f'Current task: {status.current_task}')
    if status.suggested_response:
        lines.append(f'Suggested response: {status.suggested_response}')
    buffered = status.buffered
    if buffered is not None and buffered.observations.status != 'idle':
        lines.append(f'Background observation: {buffered.observations.chunks} chunk(s), {buffered.observations.status}')
    if buffered is not None and buffered.reflection.status != 'idle':
        lines.append(f'Background reflection: {buffered.reflection.status}')
    for failure in status.recent_failures or []:
        lines.append(f'Recent failure: {failure.operation_type} {failure.reason} at {failure.at}: {failure.message}')
    lines.append('')
    lines.append(status.observations.strip() or 'No observations yet.')
    return '\n'.join(lines)


def format_threads(page: ThreadsPage, page_number: int) -> str:
    """A page of threads as text: id, title and last activity per line."""
    if not page.threads:
        return 'No threads.' if page_number == 0 else f'No threads on page {page_number}.'
    lines = [
        f'- {t.id}: {t.title or "(untitled)"} (updated {t.updated_at.isoformat()}, created {t.created_at.isoformat()})'
        for t in page.threads
    ]
    if page.has_more:
        lines.append(f'More threads: page {page_number + 1}.')
    return '\n'.join(lines)


def format_operation(operation: str, thread_id: str, result: MemoryOperation) -> str:
    """What an operation did, as text: its status, the memory's size after it, and the outcomes it reported."""
    lines = [
        f'{operation} on thread {thread_id}: {result.status.replace("_", " ")} '
        f'(generation {result.generation_count}, {result.observation_tokens} observation tokens)'
    ]
    for part in result.parts:
        data = part.data
        kind = part.type.removeprefix('data-om-')
        if kind.endswith('-failed'):
            lines.append(f'- {kind}: {data.get("reason", "error")}: {data.get("error", "")}')
        elif kind in ('observation-end', 'buffering-end', 'activation'):
            lines.append(f'- {kind} ({data.get("operationType", "observation")})')
    return '\n'.join(lines)


def _tool_error(exc: APIError | ConnectionFailed) -> ToolError:
    return ToolError(exc.message if isinstance(exc, APIError) else str(exc))


def build_server(
    client: AsyncMemoryClient, resource_id: str, *, search: bool, operations: bool = False
) -> MCPServer[Any]:
    """The MCP server with its tools bound to one resource (`search` only when the service has vectors; `observe`,
    `reflect` and `buffer` only with `operations`)."""
    server: MCPServer[Any] = MCPServer(
        name='observational-memory',
        version=__version__,
        instructions=INSTRUCTIONS + (OPERATIONS_INSTRUCTIONS if operations else ''),
        log_level='WARNING',
    )

    async def recall(
        threadId: str,  # noqa: N803 - the recall tool's parameter names are the API's
        mode: Literal['messages', 'threads', 'search', 'observations'] = 'messages',
        cursor: str | None = None,
        page: int | None = None,
        limit: int | None = None,
        detail: Literal['low', 'high'] = 'low',
        partIndex: int | None = None,  # noqa: N803
        query: str | None = None,
        before: str | None = None,
        after: str | None = None,
    ) -> str:
        try:
            result = await client.recall(
                threadId,
                resource_id=resource_id,
                mode=mode,
                cursor=cursor,
                page=page,
                limit=limit,
                detail=detail,
                part_index=partIndex,
                query=query,
                before=before,
                after=after,
            )
        except (APIError, ConnectionFailed) as exc:
            raise _tool_error(exc) from exc
        return recall_answer(result)

    async def memory(threadId: str) -> str:  # noqa: N803
        try:
            status = await client.memory(threadId, resource_id=resource_id)
        except (APIError, ConnectionFailed) as exc:
            raise _tool_error(exc) from exc
        return format_memory(threadId, status)

    async def list_threads(
        page: int = 0,
        perPage: int = 20,  # noqa: N803
        orderBy: Literal['createdAt', 'updatedAt'] = 'updatedAt',  # noqa: N803
        direction: Literal['ASC', 'DESC'] = 'DESC',
    ) -> str:
        try:
            threads = await client.list_threads(
                resource_id=resource_id, page=page, per_page=perPage, order_by=orderBy, direction=direction
            )
        except (APIError, ConnectionFailed) as exc:
            raise _tool_error(exc) from exc
        return format_threads(threads, page)

    async def search_messages(query: str, threadId: str | None = None, limit: int = 10) -> str:  # noqa: N803
        try:
            thread_id = threadId
            if thread_id is None:  # recall answers for a thread of the resource; any one searches them all
                newest = await client.list_threads(resource_id=resource_id, per_page=1, order_by='updatedAt')
                if not newest.threads:
                    return 'No conversations yet: nothing to search.'
                thread_id = newest.threads[0].id
            result = await client.recall(thread_id, resource_id=resource_id, mode='search', query=query, limit=limit)
        except (APIError, ConnectionFailed) as exc:
            raise _tool_error(exc) from exc
        return recall_answer(result)

    async def observe(threadId: str, messages: list[dict[str, Any]] | None = None) -> str:  # noqa: N803
        try:
            result = await client.observe(threadId, messages, resource_id=resource_id)
        except (APIError, ConnectionFailed) as exc:
            raise _tool_error(exc) from exc
        except ValueError as exc:  # a message the client refuses before sending (e.g. no createdAt)
            raise ToolError(str(exc)) from exc
        return format_operation('observe', threadId, result)

    async def reflect(threadId: str) -> str:  # noqa: N803
        try:
            result = await client.reflect(threadId, resource_id=resource_id)
        except (APIError, ConnectionFailed) as exc:
            raise _tool_error(exc) from exc
        return format_operation('reflect', threadId, result)

    async def buffer(threadId: str) -> str:  # noqa: N803
        try:
            result = await client.buffer(threadId, resource_id=resource_id)
        except (APIError, ConnectionFailed) as exc:
            raise _tool_error(exc) from exc
        return format_operation('buffer', threadId, result)

    server.add_tool(recall, name='recall', description=RECALL_DESCRIPTION + ' threadId is required here.')
    server.add_tool(
        memory,
        name='memory',
        description='The observational memory of a thread: the observation log, the current task and token status.',
    )
    server.add_tool(
        list_threads,
        name='list_threads',
        description="The user's threads (conversations), newest activity first: ids to pass to memory and recall.",
    )
    if operations:
        server.add_tool(
            observe,
            name='observe',
            description='Observe a thread now: its unobserved messages, or (`messages`: [{role, content, createdAt}]) '
            "history imported from elsewhere, observed into the thread's memory with its own dates and never added "
            'to its messages. The same import twice is observed once.',
        )
        server.add_tool(
            reflect, name='reflect', description="Condense a thread's observations now (below the threshold too)."
        )
        server.add_tool(
            buffer,
            name='buffer',
            description="Buffer a thread's unbuffered messages now, as observations that activate later.",
        )
    if search:
        server.add_tool(
            search_messages,
            name='search',
            description="Messages closest in meaning to `query`, across all of the user's threads, grouped by thread "
            'with a cursor to read around each (recall mode "messages").',
        )
    return server


def vectors_enabled(client: MemoryClient, resource_id: str) -> bool:
    """Whether the service can search by meaning (`retrieval` on, with vectors), asked without writing anything.

    Both probes name a thread that does not exist: the service refuses a disabled feature before it looks the thread
    up, so a 404 means the feature is on.
    """
    probe = f'om-mcp-probe-{uuid.uuid4().hex}'
    try:
        client.recall(probe, resource_id=resource_id, mode='search', query='probe', limit=1)
    except RetrievalDisabled:
        return False
    except NotFound:
        pass
    try:
        client.query_messages(probe, resource_id=resource_id, vector_search_string='probe', per_page=0)
    except InvalidRequest:
        return False
    except NotFound:
        return True
    return True


def _auth(args: argparse.Namespace) -> Any:
    if args.auth == 'iam':
        try:
            import botocore  # noqa: F401 - only to give the install hint before anything starts
        except ImportError:
            raise SystemExit("--auth iam signs with botocore: pip install 'om-client[mcp,aws]'") from None
    if args.auth == 'bearer':
        variable = args.token_env
        if not os.environ.get(variable):
            raise SystemExit(
                f'--auth bearer reads the token from ${variable}; set it (or name another with --token-env)'
            )
        return BearerAuth(lambda: os.environ.get(variable, ''))
    return args.auth


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog='om-mcp', description='Observational Memory as an MCP server.')
    parser.add_argument('--api-url', required=True, help='the API URL (API Gateway stage, or http://127.0.0.1:8787)')
    parser.add_argument('--resource-id', required=True, help='whose memory (the user or tenant id)')
    parser.add_argument('--auth', choices=['none', 'iam', 'bearer'], default='none', help='how to authenticate')
    parser.add_argument('--region', help='AWS region for --auth iam when the URL does not name one')
    parser.add_argument('--token-env', default='OM_API_TOKEN', help='environment variable with the bearer token')
    parser.add_argument('--http', type=int, metavar='PORT', help='serve streamable HTTP on PORT (path /mcp)')
    parser.add_argument('--host', default='127.0.0.1', help='interface for --http (default: loopback)')
    parser.add_argument(
        '--search',
        choices=['auto', 'on', 'off'],
        default='auto',
        help='offer the search tool: auto asks the service whether it has vectors',
    )
    parser.add_argument(
        '--operations',
        action='store_true',
        help='also offer observe, reflect and buffer (they change the memory; read-only without this flag)',
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until the client goes away (stdio) or it is stopped (HTTP)."""
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format='om-mcp: %(message)s')
    auth = _auth(args)
    search = args.search == 'on'
    if args.search == 'auto':
        try:
            with MemoryClient(args.api_url, auth=auth, region=args.region, retries=1) as probe:
                search = vectors_enabled(probe, args.resource_id)
        except (APIError, ConnectionFailed) as exc:
            logger.warning('could not ask the service whether it has vectors (%s); the search tool is off', exc)
    client = AsyncMemoryClient(args.api_url, auth=auth, region=args.region, resource_id=args.resource_id)
    server = build_server(client, args.resource_id, search=search, operations=args.operations)
    if args.http is not None:
        server.run('streamable-http', host=args.host, port=args.http)
    else:
        server.run('stdio')
    return 0


if __name__ == '__main__':
    sys.exit(main())
