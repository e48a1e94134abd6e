// Mastra's Observational Memory (the TypeScript reference) over bench/engine_turns.py's conversation, offline.
//
//     node bench/reference/run.mjs <input.json> <output.json>
//
// The input (written by bench/reference_compare.py) holds the turns, the thresholds, the mode's OM config and the
// timing. A real Agent with a real Memory (InMemoryStore) runs each turn through `agent.generate`, so Mastra's own
// processor drives observation, buffering, activation and reflection. The Observer, Reflector and Actor are mock
// LanguageModelV2 objects: no network. The Observer and Reflector answer like bench/engine_turns.py's sim model
// (`observer_answer` / `reflector_answer`); the Actor answers with the conversation's assistant text. Every model call
// is logged (role, system text, prompt text, answer, when) with the OM hooks' triggers, so Python counts tokens with
// the engine's tokenizer. `countTexts` asks for the reference's own token estimate (tokenx) of some texts.
//
// Time is real but scaled: each Observer/Reflector call takes `latencyMs`, the Actor `actorLatencyMs`, and turn n starts
// `n * turnPeriodMs` after the first (bench/engine_turns.py: 1 s, 4 s, 12 s on a simulated clock).
import { readFileSync, writeFileSync } from 'node:fs';
import { Agent } from '@mastra/core/agent';
import { InMemoryStore } from '@mastra/core/storage';
import { Memory } from '@mastra/memory';
import { TokenCounter } from '@mastra/memory/processors';

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// --- the roles' answers: ports of observer_answer / reflector_answer in bench/engine_turns.py -----------------------
function observerAnswer(transcript) {
  const lines = [];
  for (const line of transcript.split('\n')) {
    if ((line.startsWith('User') || line.startsWith('Assistant')) && line.includes(': ')) {
      const at = line.indexOf(': ');
      const who = line.slice(0, at).split(/\s+/)[0];
      const said = line.slice(at + 2).split(/\s+/).filter(Boolean).slice(0, 30).join(' ');
      lines.push(`* 🟡 (09:00) ${who} said: ${said}`);
    }
  }
  const body = 'Date: Jan 1, 2025\n' + (lines.length ? lines : ['* 🟢 (09:00) Nothing notable']).join('\n');
  return `<observations>\n${body}\n</observations>\n<current-task>\nPrimary: the plan\n</current-task>`;
}

function reflectorAnswer(observations) {
  const notes = observations.split('\n').filter((line) => line.trim() && !line.startsWith('Date:'));
  const kept = notes.filter((_, i) => i % 3 === 0);
  return '<observations>\nDate: Jan 1, 2025\n' + (kept.length ? kept : notes.slice(0, 1)).join('\n') + '\n</observations>';
}

// The Reflector prompt carries the observations between these two markers (buildReflectorPrompt in @mastra/memory).
function observationsToReflect(prompt) {
  const start = prompt.indexOf('## OBSERVATIONS TO REFLECT ON\n\n');
  if (start < 0) return '';
  const rest = prompt.slice(start + '## OBSERVATIONS TO REFLECT ON\n\n'.length);
  const end = rest.indexOf('\n\n---\n\n');
  return end < 0 ? rest : rest.slice(0, end);
}

// --- mock models --------------------------------------------------------------------------------------------------
function promptTexts(prompt) {
  const system = [];
  const rest = [];
  for (const message of prompt) {
    if (message.role === 'system') {
      system.push(message.content);
      continue;
    }
    const parts = typeof message.content === 'string' ? [{ type: 'text', text: message.content }] : message.content;
    for (const part of parts) if (part.type === 'text') rest.push(part.text);
  }
  return { system: system.join('\n'), prompt: rest.join('\n') };
}

class Log {
  constructor(started) {
    this.started = started;
    this.calls = [];
    this.turn = -1;
  }
  now() {
    return performance.now() - this.started;
  }
}

function mockModel(role, log, latencyMs, answer) {
  const call = async (options) => {
    const startedMs = log.now();
    const { system, prompt } = promptTexts(options.prompt);
    await sleep(latencyMs);
    const text = answer(prompt);
    log.calls.push({ role, turn: log.turn, startedMs, endedMs: log.now(), system, prompt, answer: text });
    const usage = { inputTokens: 0, outputTokens: 0, totalTokens: 0 };
    return { text, usage };
  };
  return {
    specificationVersion: 'v2',
    provider: 'mock',
    modelId: `mock-${role}`,
    supportedUrls: {},
    async doGenerate(options) {
      const { text, usage } = await call(options);
      return { content: [{ type: 'text', text }], finishReason: 'stop', usage, warnings: [] };
    },
    async doStream(options) {
      const { text, usage } = await call(options);
      const parts = [
        { type: 'stream-start', warnings: [] },
        { type: 'text-start', id: 't' },
        { type: 'text-delta', id: 't', delta: text },
        { type: 'text-end', id: 't' },
        { type: 'finish', finishReason: 'stop', usage },
      ];
      return {
        stream: new ReadableStream({
          start(controller) {
            for (const part of parts) controller.enqueue(part);
            controller.close();
          },
        }),
      };
    },
  };
}

// --- one run -------------------------------------------------------------------------------------------------------
async function run(input) {
  const log = new Log(performance.now());
  let actorText = '';
  const hookEvents = [];
  const hook = (kind) => (info) => hookEvents.push({ kind, turn: log.turn, atMs: log.now(), trigger: info?.trigger });
  const observer = mockModel('observer', log, input.latencyMs, (prompt) =>
    observerAnswer(prompt.split('## New Message History to Observe').at(-1)),
  );
  const reflector = mockModel('reflector', log, input.latencyMs, (prompt) =>
    reflectorAnswer(observationsToReflect(prompt)),
  );
  const actor = mockModel('actor', log, input.actorLatencyMs, () => actorText);
  const om = structuredClone(input.observationalMemory);
  om.observation = { ...om.observation, model: observer };
  om.reflection = { ...om.reflection, model: reflector };
  om.hooks = {
    onObservationStart: hook('observation-start'),
    onObservationEnd: hook('observation-end'),
    onReflectionStart: hook('reflection-start'),
    onReflectionEnd: hook('reflection-end'),
  };
  const memory = new Memory({ storage: new InMemoryStore(), options: { observationalMemory: om } });
  const agent = new Agent({
    id: 'bench-actor',
    name: 'bench-actor',
    instructions: 'You are a helpful assistant.',
    model: actor,
    memory,
  });

  const steps = [];
  for (const [n, [user, assistant]] of input.turns.entries()) {
    const due = n * input.turnPeriodMs;
    if (log.now() < due) await sleep(due - log.now());
    log.turn = n;
    actorText = assistant;
    const stepStarted = log.now();
    const calls = log.calls.length;
    await agent.generate(user, { memory: { thread: 't1', resource: 'r1' } });
    const actorCall = log.calls.slice(calls).find((c) => c.role === 'actor');
    steps.push({ turn: n, startedMs: stepStarted, actorStartedMs: actorCall?.startedMs, endedMs: log.now() });
  }
  await memory.settled();
  // The reference's own token estimate (tokenx) of the texts Python asks about, to compare with o200k.
  const counter = new TokenCounter();
  const tokenx = Object.fromEntries(
    Object.entries(input.countTexts ?? {}).map(([name, texts]) => [
      name,
      texts.reduce((sum, text) => sum + counter.countString(text), 0),
    ]),
  );
  return { calls: log.calls, steps, hookEvents, tokenx };
}

const [inputPath, outputPath] = process.argv.slice(2);
const input = JSON.parse(readFileSync(inputPath, 'utf8'));
const result = await run(input);
writeFileSync(outputPath, JSON.stringify(result));
