// How an app uses om-client/ai, type-checked (not run) against each AI SDK major the package supports: `npm test`
// compiles it with `ai` 7, and tsconfig.ai5.json / tsconfig.ai6.json with the `ai` 5 and 6 types.
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import {
  AbstractChat,
  type ChatState,
  generateText,
  jsonSchema,
  stepCountIs,
  streamText,
  tool,
  wrapLanguageModel,
} from 'ai';
import { MemoryClient } from 'om-client';
import { type MemoryUIMessage, memoryChatTransport, memoryTools, observationalMemory, recallTool } from 'om-client/ai';

const client = new MemoryClient({ apiUrl: 'http://127.0.0.1:8787', resourceId: 'me' });
const memory = observationalMemory({ client, threadId: 't1' });
const model = wrapLanguageModel({
  model: createOpenAICompatible({ name: 'x', baseURL: 'http://127.0.0.1:9/v1' }).chatModel('m'),
  middleware: memory,
});

export async function agent(): Promise<string> {
  const tools = { ...memory.tools(), other: recallTool({ client, threadId: 't2' }) };
  const streamed = streamText({ model, prompt: 'Hi', tools, stopWhen: stepCountIs(3) });
  const generated = await generateText({ model, prompt: 'Hi', tools: memoryTools({ client, threadId: 't1' }) });
  const weather = tool({
    description: "The app's own tool, beside memory's",
    inputSchema: jsonSchema<{ city: string }>({ type: 'object', properties: { city: { type: 'string' } } }),
    execute: async ({ city }) => `sunny in ${city}`,
  });
  await generateText({ model, prompt: 'Hi', tools: { ...tools, weather } });
  return (await streamed.text) + generated.text;
}

export function chat(state: ChatState<MemoryUIMessage>): AbstractChat<MemoryUIMessage> {
  class Chat extends AbstractChat<MemoryUIMessage> {}
  return new Chat({ id: 't1', state, transport: memoryChatTransport({ client }) });
}
