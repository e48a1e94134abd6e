/**
 * A Node agent on the AI SDK whose conversation lives in Observational Memory: any model, wrapped with the memory
 * middleware, with the recall tool.
 *
 *   python3 dev.py om serve &                                           # the local stack on http://127.0.0.1:8787
 *   export OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=...  # or any OpenAI-compatible endpoint
 *   (cd clients/typescript && npm ci && npm pack)                         # om-client, built from this repository
 *   cd examples/typescript && npm install && npx tsx agent.ts [--model gpt-4o-mini] [--thread-id trip] [--generate]
 *
 * Before each model call the middleware saves your message and loads memory (the memory system message plus the
 * unobserved messages); after it, it saves the reply. The reply streams to stdout (`--generate`: generateText, all at
 * once); memory's `data-om-*` parts are shown on stderr as they come. Type a message per line; Ctrl-D ends.
 * `--message TEXT` sends one message and exits.
 */
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, stepCountIs, streamText, wrapLanguageModel } from 'ai';
import { MemoryClient, type OmPart } from 'om-client';
import { observationalMemory } from 'om-client/ai';
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';

const { values: args } = parseArgs({
  options: {
    'api-url': {
      type: 'string',
      default: process.env.OM_API_URL ?? 'http://127.0.0.1:8787',
    },
    'resource-id': { type: 'string', default: 'me' },
    'thread-id': { type: 'string', default: 'ai-sdk-chat' },
    model: {
      type: 'string',
      default: process.env.OM_EXAMPLE_MODEL ?? 'gpt-4o-mini',
    },
    message: { type: 'string' },
    generate: { type: 'boolean', default: false },
  },
});

/** One line per part worth seeing: observation started/ended/failed, activation, scheduled work. */
function show(parts: OmPart[]): void {
  for (const part of parts) {
    if (part.type === 'data-om-observation-start') console.error(`  [memory: ${part.data.operationType} started]`);
    else if (part.type === 'data-om-observation-end') {
      console.error(`  [memory: ${part.data.operationType} done, ${part.data.observationTokens} observation tokens]`);
    } else if (part.type === 'data-om-observation-failed')
      console.error(`  [memory: ${part.data.operationType} failed: ${part.data.reason}]`);
    else if (part.type === 'data-om-scheduled')
      console.error(`  [memory: scheduled ${part.data.operations.join(', ')}]`);
  }
}

async function main(): Promise<void> {
  const client = new MemoryClient({
    apiUrl: args['api-url'],
    resourceId: args['resource-id'],
  });
  const memory = observationalMemory({
    client,
    threadId: args['thread-id'],
    onParts: show,
  });
  const provider = createOpenAICompatible({
    name: 'openai',
    baseURL: process.env.OPENAI_BASE_URL ?? 'https://api.openai.com/v1',
    apiKey: process.env.OPENAI_API_KEY,
    includeUsage: true,
  });
  const model = wrapLanguageModel({
    model: provider.chatModel(args.model),
    middleware: memory,
  });
  const call = {
    model,
    system: 'You are a helpful assistant. Use what you remember about the user.',
    tools: { recall: memory.tools().recall },
    stopWhen: stepCountIs(4),
  };

  const lines = args.message ? [args.message] : createInterface({ input: process.stdin, terminal: false });
  for await (const line of lines) {
    const text = line.trim();
    if (!text) continue;
    if (args.generate) {
      const result = await generateText({ ...call, prompt: text });
      console.log(`assistant: ${result.text}`);
    } else {
      const result = streamText({ ...call, prompt: text });
      process.stdout.write('assistant: ');
      for await (const delta of result.textStream) process.stdout.write(delta);
      process.stdout.write('\n');
    }
    const status = await client.memory(args['thread-id']);
    console.error(
      `  [memory: ${status.observationTokens} observation tokens, ${status.pendingMessageTokens} unobserved message tokens]`,
    );
  }
}

await main();
