"""A chat with an OpenAI Agents SDK agent whose conversation lives in Observational Memory.

    python3 dev.py om serve &                                  # the local stack on http://127.0.0.1:8787
    export OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=...  # or any OpenAI-compatible endpoint
    .venv/bin/python examples/openai_agents_chat.py [--model gpt-4o-mini] [--thread-id trip]

Each run of the agent loads memory through the session (the memory system message plus the unobserved messages) and
saves the turn afterwards; observed turns leave the model's input. Type a message per line; Ctrl-D ends.
`--message TEXT` sends one message and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from om_client import AsyncMemoryClient
from om_client.integrations.openai_agents import ObservationalMemorySession
from openai import AsyncOpenAI


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--api-url', default=os.environ.get('OM_API_URL', 'http://127.0.0.1:8787'))
    parser.add_argument('--resource-id', default='me')
    parser.add_argument('--thread-id', default='agents-chat')
    parser.add_argument('--model', default=os.environ.get('OM_EXAMPLE_MODEL', 'gpt-4o-mini'))
    parser.add_argument('--message', help='send this one message and exit')
    return parser.parse_args()


async def main() -> int:
    args = parse_args()
    # Chat Completions works with every OpenAI-compatible endpoint (the SDK's default, Responses, does not).
    model = OpenAIChatCompletionsModel(model=args.model, openai_client=AsyncOpenAI())
    if 'api.openai.com' not in os.environ.get('OPENAI_BASE_URL', 'https://api.openai.com/v1'):
        set_tracing_disabled(True)  # traces go to OpenAI's platform, which another endpoint's key cannot reach
    async with AsyncMemoryClient(args.api_url, resource_id=args.resource_id) as om:
        session = ObservationalMemorySession(om, thread_id=args.thread_id)
        agent = Agent(
            name='assistant',
            instructions='You are a helpful assistant. Use what you remember about the user.',
            model=model,
            tools=[session.recall_tool()],
        )
        lines = [args.message] if args.message else (line.strip() for line in sys.stdin)
        for text in lines:
            if not text:
                continue
            result = await Runner.run(agent, text, session=session)
            print(f'assistant: {result.final_output}')
            memory = await session.memory()
            print(
                f'  [memory: {memory.observation_tokens} observation tokens, '
                f'{memory.pending_message_tokens} unobserved message tokens]',
                file=sys.stderr,
            )
    return 0


if __name__ == '__main__':
    sys.exit(asyncio.run(main()))
