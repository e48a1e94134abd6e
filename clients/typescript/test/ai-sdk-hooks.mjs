// Module hooks for ai-sdk-version.mjs: `ai` and `ai/...` (and the provider) imported outside node_modules resolve to
// the alias of the AI SDK major under test; the aliased packages' own imports are left alone.
let names = {};

export function initialize(data) {
  names = data;
}

export async function resolve(specifier, context, next) {
  if (!context.parentURL?.includes('/node_modules/')) {
    for (const [name, alias] of Object.entries(names)) {
      if (specifier === name || specifier.startsWith(`${name}/`)) {
        return next(alias + specifier.slice(name.length), context);
      }
    }
  }
  return next(specifier, context);
}
