// Runs the tests against an earlier major of the AI SDK: `ai` (and its OpenAI-compatible provider) resolve to the
// aliases package.json installs for that major, for the package's own code as for the tests and the example.
//
//   OM_TEST_AI_MAJOR=5 NODE_OPTIONS=--import=./test/ai-sdk-version.mjs node --test ...   (scripts/test.mjs does this)
import { register } from 'node:module';

const ALIASES = {
  5: { ai: 'ai-v5', '@ai-sdk/openai-compatible': 'openai-compatible-v1' },
  6: { ai: 'ai-v6', '@ai-sdk/openai-compatible': 'openai-compatible-v2' },
};

const aliases = ALIASES[process.env.OM_TEST_AI_MAJOR ?? ''];
if (aliases) register('./ai-sdk-hooks.mjs', import.meta.url, { data: aliases });
