/**
 * Observational memory for any AI SDK model: a `LanguageModelMiddleware` for `wrapLanguageModel`.
 *
 * ```ts
 * import { streamText, wrapLanguageModel, stepCountIs } from 'ai';
 * import { MemoryClient } from 'om-client';
 * import { observationalMemory } from 'om-client/ai';
 *
 * const memory = observationalMemory({ client: new MemoryClient({ apiUrl }), threadId: 't1', resourceId: 'me' });
 * const model = wrapLanguageModel({ model: openai('gpt-4o-mini'), middleware: memory });
 * const result = streamText({ model, prompt: 'What did I say about Lisbon?', tools: memory.tools(), stopWhen: stepCountIs(3) });
 * ```
 *
 * Before each model call (each step of a multi-step call) the new input — the prompt's messages after its last
 * assistant message: the user's message, or the tool results of the step before — is saved with the step route
 * (`POST /threads/{id}/steps`). The model then sees the app's system messages, the memory system message
 * (observations, working memory, how to use the tools) and the unobserved messages memory holds — system messages
 * first, as every provider takes them: the history the app passed is replaced, so pass only the new message. After
 * the call its output (text, tool calls, reasoning) is saved with the turn route (`POST /threads/{id}/turns`). The
 * `data-om-*` parts of both go to `onParts` (write them to a UI message stream) and ride on the result's
 * `providerMetadata.om`. Each step names the wrapped model (`provider/modelId`) as the Actor's, so a server with
 * `activateOnProviderChange` activates buffered observations when the app switches models, and
 * `activateAfterIdle: "auto"` waits as long as that provider keeps its prompt cache.
 *
 * It works with the AI SDK 5, 6 and 7 (language-model specifications v2, v3 and v4): see `convert.ts` for where they
 * differ.
 *
 * Every saved message has an id made once per prompt message, so a call the AI SDK retries saves nothing twice. To
 * keep ids across your own retries, give the message one: `providerOptions: { om: { messageId: 'msg_…' } }`.
 */
import type { LanguageModelMiddleware } from 'ai';
import type { MemoryClient } from '../client.js';
import { checkId, newMessageId } from '../messages.js';
import type { OmPart } from '../parts.js';
import type { MessageInput, StepResult } from '../types.js';
import {
  type ModelContent,
  type ModelMessage,
  type ModelPrompt,
  fromModelMessage,
  fromModelOutput,
  specOf,
  toModelPrompt,
} from './convert.js';
import { type MemoryTools, memoryTools } from './tools.js';

type ModelCallOptions = Parameters<NonNullable<LanguageModelMiddleware['transformParams']>>[0]['params'];
type GenerateResult = Awaited<ReturnType<NonNullable<LanguageModelMiddleware['wrapGenerate']>>>;
type StreamResult = Awaited<ReturnType<NonNullable<LanguageModelMiddleware['wrapStream']>>>;
type StreamPart = StreamResult['stream'] extends ReadableStream<infer P> ? P : never;

/** Which memory a call uses: the thread, whose memory, and whether working memory may be changed. */
export interface MemoryBinding {
  threadId: string;
  resourceId: string;
  readOnly?: boolean;
}

/** When parts arrive: `step` before the model call, `turn` after it. */
export interface PartsEvent extends MemoryBinding {
  phase: 'step' | 'turn';
}

export interface ObservationalMemoryOptions {
  /** The API client. */
  client: MemoryClient;
  /** The conversation (a call may name another: `providerOptions: { om: { threadId } }`). */
  threadId?: string;
  /** Whose memory (default: the client's `resourceId`; a call may name another). */
  resourceId?: string;
  /** Show working memory without offering to change it. */
  readOnly?: boolean;
  /** The Actor's model as each step names it (`provider/model`), for `activateAfterIdle: "auto"` and
   * `activateOnProviderChange`; default: the wrapped model's `provider/modelId` (`openai.chat/gpt-4o-mini`). */
  actorModel?: string;
  /** Called with the `data-om-*` parts of every step and turn, in order (e.g. `parts.forEach((p) => writer.write(p))`). */
  onParts?: (parts: OmPart[], event: PartsEvent) => void | Promise<void>;
}

/** What a call may set in `providerOptions.om` (and a prompt message in its own `providerOptions.om`). */
export interface OmProviderOptions {
  threadId?: string;
  resourceId?: string;
  readOnly?: boolean;
  /** On a prompt message: the id to save it under. */
  messageId?: string;
}

/** What rides on a result's `providerMetadata.om`. */
export interface OmProviderMetadata {
  threadId: string;
  resourceId: string;
  /** The `data-om-*` parts of the step and of the turn. */
  parts: OmPart[];
  /** The ids of the messages the turn saved. */
  saved: string[];
}

/** The middleware, plus the memory tools bound to its thread and what the last call saw. */
export interface ObservationalMemory extends LanguageModelMiddleware {
  /** `{ recall, updateWorkingMemory }` as AI SDK tools for this middleware's thread. */
  tools(): MemoryTools;
  /** The step answer of the most recent call (its memory system message, messages and parts). */
  readonly lastStep: StepResult | undefined;
}

/** Per transformed call: which memory, and the step's parts (so the turn can report both). */
interface CallState {
  binding: MemoryBinding;
  stepParts: OmPart[];
}

function omOptions(holder: { providerOptions?: Record<string, unknown> | undefined }): OmProviderOptions {
  const om = holder.providerOptions?.om;
  return typeof om === 'object' && om !== null ? (om as OmProviderOptions) : {};
}

/** The prompt's messages after its last assistant message (system messages excluded): this step's new input. */
function newInput(prompt: ModelPrompt): ModelMessage[] {
  const conversation = prompt.filter((m) => m.role !== 'system');
  const lastAssistant = conversation.map((m) => m.role).lastIndexOf('assistant');
  return conversation.slice(lastAssistant + 1);
}

/** How many model calls of this multi-step call came before (assistant messages after the last user message). */
function stepNumberOf(prompt: ModelPrompt): number {
  const roles = prompt.map((m) => m.role);
  return roles.slice(roles.lastIndexOf('user') + 1).filter((role) => role === 'assistant').length;
}

/** What the step route takes as `actorModel`: `provider/model`, no whitespace, 3 to 200 characters (the server's
 * pattern; JavaScript's `\w` is ASCII-only, so this may leave out a name the server would take, never the reverse). */
const ACTOR_MODEL = /^[A-Za-z0-9][\w.:@-]*\/[^\s/]\S*$/;

/** Whether the step route takes `name` as `actorModel`. */
export function isActorModelName(name: string): boolean {
  return name.length >= 3 && name.length <= 200 && ACTOR_MODEL.test(name);
}

/** The model a call runs as the server names models: the AI SDK's provider (`openai.chat`: the server compares a
 * provider by its part before the first `.`) and model id, without leading slashes or whitespace (a vLLM model served
 * from `/models/llama-3`). A name the route would still refuse is left out rather than failing every step: memory
 * then treats the model as unknown (no change noticed, the default idle time). */
function actorModelOf(model: { provider: string; modelId: string }, given: string | undefined): string | undefined {
  if (given !== undefined) return given; // checked when the middleware was made
  const name = `${model.provider}/${model.modelId.trim().replace(/^\/+/, '').replace(/\s+/g, '-')}`;
  return isActorModelName(name) ? name : undefined;
}

/** The observational memory middleware. */
export function observationalMemory(options: ObservationalMemoryOptions): ObservationalMemory {
  const { client } = options;
  if (options.actorModel !== undefined && !isActorModelName(options.actorModel)) {
    throw new TypeError(
      `actorModel must be \`provider/model\` without spaces, 3 to 200 characters (e.g. 'openai/gpt-4o-mini'), ` +
        `not ${JSON.stringify(options.actorModel.slice(0, 80))}`,
    );
  }
  // Ids are made once per prompt message: the AI SDK retries a failed call with the same message objects.
  const ids = new WeakMap<object, string>();
  const calls = new WeakMap<object, CallState>();
  let lastStep: StepResult | undefined;

  const bindingFor = (params: ModelCallOptions): MemoryBinding => {
    const call = omOptions(params);
    const threadId = call.threadId ?? options.threadId;
    const resourceId = call.resourceId ?? options.resourceId ?? client.resourceId;
    if (!threadId) {
      throw new TypeError(
        'observationalMemory needs a threadId: pass it to observationalMemory() or in providerOptions.om',
      );
    }
    if (!resourceId) {
      throw new TypeError(
        'observationalMemory needs a resourceId: pass it to observationalMemory(), the client, or providerOptions.om',
      );
    }
    const readOnly = call.readOnly ?? options.readOnly;
    return { threadId, resourceId, ...(readOnly === undefined ? {} : { readOnly }) };
  };

  const idOf = (message: ModelMessage): string => {
    const given = omOptions(message).messageId;
    if (given) return checkId('message id', given);
    let id = ids.get(message);
    if (!id) ids.set(message, (id = newMessageId()));
    return id;
  };

  const publish = async (parts: OmPart[], event: PartsEvent) => {
    if (parts.length && options.onParts) await options.onParts(parts, event);
  };

  /** Save the output and report the turn's parts; `providerMetadata.om` for the result. */
  const saveTurn = async (state: CallState | undefined, content: readonly ModelContent[], signal?: AbortSignal) => {
    if (!state) return undefined;
    const { binding } = state;
    const messages = fromModelOutput(content);
    let turnParts: OmPart[] = [];
    let saved: string[] = [];
    if (messages.length) {
      const turn = await client.turn(binding.threadId, messages, {
        resourceId: binding.resourceId,
        ...(signal ? { signal } : {}),
      });
      turnParts = turn.parts;
      saved = turn.saved;
      await publish(turnParts, { ...binding, phase: 'turn' });
    }
    const metadata: OmProviderMetadata = {
      threadId: binding.threadId,
      resourceId: binding.resourceId,
      parts: [...state.stepParts, ...turnParts],
      saved,
    };
    return metadata;
  };

  const withMetadata = <T extends { providerMetadata?: Record<string, Record<string, unknown>> | undefined }>(
    holder: T,
    metadata: OmProviderMetadata | undefined,
  ): T =>
    metadata
      ? {
          ...holder,
          providerMetadata: { ...holder.providerMetadata, om: metadata as unknown as Record<string, never> },
        }
      : holder;

  // No specification version is declared: the AI SDK 5, 6 and 7 call a middleware alike (none reads the field), each
  // with its own specification's shapes, which are told apart where they differ (files, the finish reason).
  const middleware: ObservationalMemory = {
    async transformParams({ params, model }) {
      const binding = bindingFor(params);
      const input = newInput(params.prompt)
        .map((message) => fromModelMessage(message, idOf(message)))
        .filter((m): m is MessageInput & { id: string } => m !== undefined);
      const actorModel = actorModelOf(model, options.actorModel);
      const step = await client.step(binding.threadId, input, {
        resourceId: binding.resourceId,
        stepNumber: stepNumberOf(params.prompt),
        ...(actorModel === undefined ? {} : { actorModel }),
        ...(binding.readOnly === undefined ? {} : { readOnly: binding.readOnly }),
        ...(params.abortSignal ? { signal: params.abortSignal } : {}),
      });
      lastStep = step;
      await publish(step.parts, { ...binding, phase: 'step' });

      // Every system message goes first (Anthropic and Google models take them only there): the app's, in order, then
      // the memory system message, then any system message memory holds; then the conversation memory shows.
      const shown = toModelPrompt(step.messages, specOf(model));
      const prompt: ModelPrompt = [
        ...params.prompt.filter((m) => m.role === 'system'),
        ...(step.system.trim() ? [{ role: 'system' as const, content: step.system }] : []),
        ...shown.filter((m) => m.role === 'system'),
        ...shown.filter((m) => m.role !== 'system'),
      ];

      const { om: _, ...providerOptions } = params.providerOptions ?? {};
      const transformed: ModelCallOptions = { ...params, prompt, providerOptions };
      calls.set(transformed, { binding, stepParts: step.parts });
      return transformed;
    },

    async wrapGenerate({ doGenerate, params }) {
      const result: GenerateResult = await doGenerate();
      const metadata = await saveTurn(calls.get(params), result.content, params.abortSignal);
      return withMetadata(result, metadata);
    },

    async wrapStream({ doStream, params }) {
      const { stream, ...rest } = await doStream();
      const state = calls.get(params);
      const output = new StreamedOutput();
      let finished = false;
      let failed = false; // the model failed mid-stream: what it wrote so far is not a reply to keep
      const save = async (controller: TransformStreamDefaultController<StreamPart>) => {
        try {
          return await saveTurn(state, failed ? [] : output.content(), params.abortSignal);
        } catch (error) {
          controller.enqueue({ type: 'error', error });
          return undefined;
        }
      };
      const remembered = stream.pipeThrough(
        new TransformStream<StreamPart, StreamPart>({
          async transform(part, controller) {
            if (part.type === 'error') failed = true;
            if (part.type === 'finish') {
              // Save before the finish goes on: when the caller sees it, the reply is in memory.
              finished = true;
              failed ||= finishReasonOf(part.finishReason) === 'error';
              controller.enqueue(withMetadata(part, await save(controller)));
              return;
            }
            output.add(part);
            controller.enqueue(part);
          },
          async flush(controller) {
            if (!finished) await save(controller); // a provider that ends without `finish`: keep what came
          },
        }),
      );
      return { stream: remembered, ...rest };
    },

    tools() {
      const threadId = options.threadId;
      const resourceId = options.resourceId ?? client.resourceId;
      if (!threadId || !resourceId) {
        throw new TypeError('memory.tools() needs the threadId and resourceId given to observationalMemory()');
      }
      return memoryTools({ client, threadId, resourceId });
    },

    get lastStep() {
      return lastStep;
    },
  };
  return middleware;
}

/** The unified finish reason: a string in specification v2 (AI SDK 5), `{unified, raw}` from v3 on. */
function finishReasonOf(reason: unknown): string | undefined {
  if (typeof reason === 'string') return reason;
  const unified = (reason as { unified?: unknown } | undefined)?.unified;
  return typeof unified === 'string' ? unified : undefined;
}

/** Collects a streamed call's output as the content a generate call would have returned. */
class StreamedOutput {
  private readonly items: ModelContent[] = [];
  private readonly open = new Map<string, { type: 'text' | 'reasoning'; text: string }>();

  add(part: StreamPart): void {
    switch (part.type) {
      case 'text-start':
      case 'reasoning-start': {
        const item = { type: part.type === 'text-start' ? ('text' as const) : ('reasoning' as const), text: '' };
        this.open.set(`${item.type}:${part.id}`, item);
        this.items.push(item);
        break;
      }
      case 'text-delta':
      case 'reasoning-delta': {
        const key = `${part.type === 'text-delta' ? 'text' : 'reasoning'}:${part.id}`;
        let item = this.open.get(key);
        if (!item) {
          item = { type: part.type === 'text-delta' ? 'text' : 'reasoning', text: '' };
          this.open.set(key, item);
          this.items.push(item);
        }
        item.text += part.delta;
        break;
      }
      case 'tool-call':
      case 'tool-result':
      case 'file':
        this.items.push(part);
        break;
      default:
        break;
    }
  }

  content(): ModelContent[] {
    return this.items;
  }
}
