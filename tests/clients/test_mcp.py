"""`om-mcp` against the local stack: an MCP client session (the `mcp` SDK's stdio client, and streamable HTTP) lists
and calls the tools; the search probe and the text the tools answer."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from om_client import MemoryClient
from om_client.integrations.mcp_server import format_memory, format_operation, format_threads, vectors_enabled
from om_client.models import MemoryOperation, MemoryStatus, Thread, ThreadsPage

from om_cli.local_stack import LocalStack

NOTE = 'We are planning a cycling holiday in the Alentejo next spring, staying in Évora and Monsaraz. ' * 6


def om_mcp() -> str:
    """The console script installed next to this interpreter."""
    script = Path(sys.executable).parent / 'om-mcp'
    assert script.exists(), 'om-mcp is not installed: dev.py installs clients/python with its extras'
    return str(script)


@pytest.fixture(scope='module')
def remembered(stack: LocalStack) -> Iterator[tuple[str, str]]:
    """A resource with one thread whose first messages are observed and indexed for search."""
    resource, thread = 'mcp-user', 'holiday'
    with MemoryClient(stack.url, resource_id=resource) as om:
        for n in range(3):
            om.step(thread, [f'{NOTE} Day {n}.'])
            om.turn(thread, [f'Noted day {n}.'])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            observed = 'Alentejo' in om.memory(thread).observations
            found = om.recall(thread, mode='search', query='cycling holiday Alentejo').count
            if observed and found:
                break
            om.step(thread)
            time.sleep(0.2)
        yield resource, thread
        om.delete_resource()


async def _exercise(session: ClientSession, thread: str) -> dict[str, Any]:
    await session.initialize()
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    answers: dict[str, Any] = {'tools': tools}
    calls = {
        'list_threads': ('list_threads', {}),
        'memory': ('memory', {'threadId': thread}),
        'recall': ('recall', {'threadId': thread, 'limit': 2}),
        'search': ('search', {'query': 'cycling holiday Alentejo'}),
        'missing': ('memory', {'threadId': 'no-such-thread'}),
    }
    for key, (name, arguments) in calls.items():
        answers[key] = await session.call_tool(name, arguments)
    return answers


def test_a_stdio_session_lists_and_calls_the_tools(stack: LocalStack, remembered: tuple[str, str]) -> None:
    resource, thread = remembered
    params = StdioServerParameters(command=om_mcp(), args=['--api-url', stack.url, '--resource-id', resource])

    async def run() -> dict[str, Any]:
        async with stdio_client(params) as streams, ClientSession(*streams) as session:
            return await _exercise(session, thread)

    answers = asyncio.run(run())

    assert set(answers['tools']) == {'recall', 'memory', 'search', 'list_threads'}  # the stack has vectors on
    assert {'threadId', 'mode', 'cursor', 'page', 'limit', 'detail', 'partIndex', 'query', 'before', 'after'} <= set(
        answers['tools']['recall'].input_schema['properties']
    )
    text = {key: answers[key].content[0].text for key in ('list_threads', 'memory', 'recall', 'search', 'missing')}
    assert f'- {thread}:' in text['list_threads']
    assert text['memory'].startswith(f'Memory of thread {thread}') and 'Alentejo' in text['memory']
    assert 'unobserved messages:' in text['memory'] and '(observation at 400)' in text['memory']
    recalled = json.loads(text['recall'])
    assert recalled['count'] == 2 and 'Alentejo' in recalled['messages']
    assert 'Alentejo' in json.loads(text['search'])['results']
    assert answers['missing'].is_error and 'was not found' in text['missing']
    assert not any(answers[key].is_error for key in ('list_threads', 'memory', 'recall', 'search'))


def test_with_operations_the_tools_run_memory_work(stack: LocalStack, remembered: tuple[str, str]) -> None:
    resource, thread = remembered
    args = ['--api-url', stack.url, '--resource-id', resource, '--search', 'off', '--operations']
    params = StdioServerParameters(command=om_mcp(), args=args)
    when = '2019-05-04T08:00:00Z'

    async def run() -> tuple[list[str], Any]:
        async with stdio_client(params) as streams, ClientSession(*streams) as session:
            await session.initialize()
            names = sorted(tool.name for tool in (await session.list_tools()).tools)
            messages = [{'role': 'user', 'content': 'We also cycled in Porto once.', 'createdAt': when}]
            answer = await session.call_tool('observe', {'threadId': thread, 'messages': messages})
            return names, answer

    names, answer = asyncio.run(run())

    assert names == ['buffer', 'list_threads', 'memory', 'observe', 'recall', 'reflect']
    assert not answer.is_error and answer.content[0].text.startswith(f'observe on thread {thread}: done')


def test_an_operation_reads_as_text() -> None:
    result = MemoryOperation.model_validate(
        {
            'status': 'nothing_to_do',
            'generationCount': 2,
            'observationTokens': 120,
            'parts': [{'type': 'data-om-observation-failed', 'data': {'reason': 'busy', 'error': 'held'}}],
        }
    )
    text = format_operation('reflect', 't1', result)
    assert text.splitlines() == [
        'reflect on thread t1: nothing to do (generation 2, 120 observation tokens)',
        '- observation-failed: busy: held',
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


def test_streamable_http_serves_the_same_tools(stack: LocalStack, remembered: tuple[str, str]) -> None:
    resource, _ = remembered
    port = _free_port()
    args = ['--api-url', stack.url, '--resource-id', resource, '--http', str(port), '--search', 'off']
    server = subprocess.Popen([om_mcp(), *args], stderr=subprocess.PIPE, env={**os.environ})
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(f'http://127.0.0.1:{port}/mcp', timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)

        async def run() -> list[str]:
            async with streamable_http_client(f'http://127.0.0.1:{port}/mcp') as streams:
                async with ClientSession(*streams) as session:
                    await session.initialize()
                    return sorted(tool.name for tool in (await session.list_tools()).tools)

        names = asyncio.run(run())
    finally:
        server.terminate()
        server.wait(timeout=10)

    assert names == ['list_threads', 'memory', 'recall']  # --search off


def test_the_search_probe_reads_the_services_refusals() -> None:
    def answers(recall: int, recall_code: str, query: int, query_code: str) -> MemoryClient:
        def reply(request: httpx.Request) -> httpx.Response:
            status, code = (recall, recall_code) if request.url.path == '/recall' else (query, query_code)
            return httpx.Response(status, json={'error': {'code': code, 'message': 'x', 'details': []}})

        return MemoryClient('http://om.test', transport=httpx.MockTransport(reply), retries=0)

    assert vectors_enabled(answers(422, 'retrieval_disabled', 404, 'thread_not_found'), 'me') is False
    assert vectors_enabled(answers(404, 'thread_not_found', 422, 'invalid_input'), 'me') is False
    assert vectors_enabled(answers(404, 'thread_not_found', 404, 'thread_not_found'), 'me') is True


def test_memory_and_threads_read_as_text() -> None:
    at = datetime(2026, 3, 1, tzinfo=UTC)
    status = MemoryStatus.model_validate(
        {
            'observations': '* 🔴 likes trains',
            'observationTokens': 12,
            'pendingMessageTokens': 30,
            'thresholds': {'messageTokens': 400, 'observationTokens': 6000},
            'currentTask': 'plan the trip',
            'recentFailures': [{'operationType': 'observation', 'reason': 'timeout', 'at': 'now', 'message': 'slow'}],
        }
    )
    page = ThreadsPage(
        threads=[Thread(id='t1', resource_id='me', title='Trip', created_at=at, updated_at=at)], has_more=True
    )

    memory = format_memory('t1', status)
    threads = format_threads(page, 0)

    assert 'Observations: 12 tokens (reflection at 6000); unobserved messages: 30 tokens (observation at 400)' in memory
    assert 'Current task: plan the trip' in memory and 'Recent failure: observation timeout' in memory
    assert memory.endswith('* 🔴 likes trains')
    assert threads.startswith('- t1: Trip (updated 2026-03-01') and threads.endswith('More threads: page 1.')
    assert format_threads(ThreadsPage(), 0) == 'No threads.'
