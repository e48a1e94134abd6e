/**
 * What the tests share: the servers the test suite started (OM_TEST_*), a scripted `fetch`, and the fake model's
 * control routes.
 */
import type { TestContext } from 'node:test';

/** The servers, from the environment; undefined when a test should skip (run without the Python test suite). */
export interface Servers {
  /** `om serve` (the local stack), no auth. */
  api: string;
  /** A second `om serve` whose observations are buffered (`bufferTokens`), activated when the Actor's model changes. */
  buffered: string;
  /** A stand-in for an IAM-authorized API Gateway stage in front of it, verifying SigV4 with botocore. */
  sigv4: string;
  /** The fake OpenAI server (its API is at `${openai}/v1`, its control routes at `${openai}/_fake/...`). */
  openai: string;
}

export function servers(t: TestContext): Servers | undefined {
  const api = process.env.OM_TEST_API_URL;
  const buffered = process.env.OM_TEST_BUFFERED_API_URL;
  const sigv4 = process.env.OM_TEST_SIGV4_URL;
  const openai = process.env.OM_TEST_OPENAI_URL;
  if (api && buffered && sigv4 && openai) return { api, buffered, sigv4, openai };
  if (process.env.OM_TEST_REQUIRE_SERVER)
    throw new Error('OM_TEST_API_URL, OM_TEST_BUFFERED_API_URL, OM_TEST_SIGV4_URL and OM_TEST_OPENAI_URL are required');
  t.skip('needs the local stack: run through the test suite (pytest tests/clients/test_typescript.py)');
  return undefined;
}

/** A unique id for this test run. */
export function uid(prefix: string): string {
  return `${prefix}-${globalThis.crypto.randomUUID().slice(0, 12)}`;
}

type Answer = Response | Error | ((request: Request) => Response | Promise<Response>);

/** A `fetch` answering from a list (the last answer repeats), recording every request and its body. */
export class ScriptedFetch {
  readonly requests: { request: Request; body: string }[] = [];
  private readonly answers: Answer[];

  constructor(...answers: Answer[]) {
    this.answers = answers;
  }

  readonly fetch = async (request: Request): Promise<Response> => {
    const body = request.body ? await request.clone().text() : '';
    this.requests.push({ request, body });
    const answer = this.answers.length > 1 ? this.answers.shift() : this.answers[0];
    if (answer === undefined) throw new Error('no scripted answer');
    if (answer instanceof Error) throw answer;
    if (typeof answer === 'function') return answer(request);
    return answer.clone();
  };

  /** The bodies, parsed when they are JSON. */
  bodies(): unknown[] {
    return this.requests.map((r) => {
      try {
        return r.body ? JSON.parse(r.body) : undefined;
      } catch {
        return r.body;
      }
    });
  }
}

export function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });
}

export function apiError(
  status: number,
  code: string,
  message = 'scripted',
  headers: Record<string, string> = {},
): Response {
  return json(status, { error: { code, message, details: [{ field: 'x', message: 'bad' }] } }, headers);
}

/** A fetch that never answers until its request is aborted (a timer keeps the test's event loop alive meanwhile). */
export function hang(request: Request): Promise<Response> {
  return new Promise<Response>((_, reject) => {
    const alive = setTimeout(() => reject(new Error('the request was never aborted')), 10_000);
    request.signal.addEventListener('abort', () => {
      clearTimeout(alive);
      reject(request.signal.reason);
    });
  });
}

/** A fetch failure as Node's fetch reports it (`TypeError: fetch failed`, the socket's code as the cause). */
export function networkError(code: string): TypeError {
  return new TypeError('fetch failed', { cause: Object.assign(new Error(code), { code }) });
}

// -- the fake model ---------------------------------------------------------------------------------------------------
export type FakeReply =
  | { text: string }
  | { toolCalls: { name: string; arguments: Record<string, unknown> }[]; text?: string }
  | { status: number; message?: string; headers?: Record<string, string> };

/** The chat completion requests the fake model received (the bodies the OpenAI-compatible provider sent). */
export interface ChatRequestBody {
  model: string;
  stream?: boolean;
  messages: { role: string; content?: string | { type: string; text?: string }[] | null; tool_calls?: unknown[] }[];
  tools?: { function: { name: string } }[];
}

export class FakeModel {
  constructor(readonly url: string) {}

  get baseURL(): string {
    return `${this.url}/v1`;
  }

  async script(...replies: FakeReply[]): Promise<void> {
    await this.control('POST', 'script', { replies });
  }

  async reset(): Promise<void> {
    await this.control('POST', 'reset', {});
  }

  async requests(): Promise<ChatRequestBody[]> {
    const answer = (await this.control('GET', 'requests')) as { requests: ChatRequestBody[] };
    return answer.requests;
  }

  private async control(method: string, route: string, body?: unknown): Promise<unknown> {
    const response = await fetch(`${this.url}/_fake/${route}`, {
      method,
      ...(body === undefined ? {} : { body: JSON.stringify(body), headers: { 'content-type': 'application/json' } }),
    });
    if (!response.ok) throw new Error(`fake model control ${route}: ${response.status} ${await response.text()}`);
    return response.json();
  }
}

/** The text of a chat request message's content. */
export function textOf(content: ChatRequestBody['messages'][number]['content']): string {
  if (typeof content === 'string') return content;
  return (content ?? []).map((part) => part.text ?? '').join('');
}

/** Every text of one role in a chat request. */
export function texts(request: ChatRequestBody, role: string): string[] {
  return request.messages.filter((m) => m.role === role).map((m) => textOf(m.content));
}

// -- the AI SDK under test --------------------------------------------------------------------------------------------
/** The major version of the AI SDK the tests run against (scripts/test.mjs runs them with 7, then 5 and 6). */
export const AI_MAJOR = Number(process.env.OM_TEST_AI_MAJOR ?? '7');

/** A finish reason as a model of that AI SDK reports it: a string (5), `{unified, raw}` (6 on). */
export function finishReason(unified: 'stop' | 'tool-calls' | 'error'): never {
  return (AI_MAJOR <= 5 ? unified : { unified, raw: undefined }) as never;
}

/** Token usage as a model of that AI SDK reports it. */
export function usage(input: number, output: number): never {
  if (AI_MAJOR <= 5) return { inputTokens: input, outputTokens: output, totalTokens: input + output } as never;
  return {
    inputTokens: { total: input, noCache: input, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: output, text: output, reasoning: undefined },
  } as never;
}

type MockModel = import('ai/test').MockLanguageModelV4;
type MockOptions = ConstructorParameters<typeof import('ai/test').MockLanguageModelV4>[0];

/** The mock language model of that AI SDK (`MockLanguageModelV2`, `V3` or `V4` from `ai/test`). */
export async function mockModel(options: MockOptions): Promise<MockModel> {
  const mocks = (await import('ai/test')) as Record<string, unknown>;
  const Mock = (mocks.MockLanguageModelV4 ?? mocks.MockLanguageModelV3 ?? mocks.MockLanguageModelV2) as new (
    options: MockOptions,
  ) => MockModel;
  return new Mock(options);
}
