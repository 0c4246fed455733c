// The memfit core (WebAssembly) as plain JS objects. The module returns JSON text; this parses
// it and turns the core's {"error": "..."} into a thrown MemfitError with the same message the
// CLI prints. Works in browsers, workers and Node (pass {wasmBinary} there: see tests/js/load.mjs).
import createMemfit from './memfit.mjs';

export class MemfitError extends Error {
  constructor(message) {
    super(message);
    this.name = 'MemfitError';
  }
}

/** Parses a result text; throws MemfitError when it is the core's error object. */
export function unwrap(text) {
  const value = JSON.parse(text);
  if (value && typeof value === 'object' && !Array.isArray(value) && typeof value.error === 'string') {
    throw new MemfitError(value.error);
  }
  return value;
}

const asText = (x) => (typeof x === 'string' ? x : JSON.stringify(x));

/** Loads the module. Every function takes an object (or JSON text) and returns a plain object. */
export async function loadMemfit(moduleOptions = {}) {
  const m = await createMemfit(moduleOptions);
  return {
    estimate: (request) => unwrap(m.estimateJson(asText(request))),
    plan: (request) => unwrap(m.planJson(asText(request))),
    parseConfig: (config) => unwrap(m.parseConfigJson(asText(config))),
    models: () => unwrap(m.modelsJson()),
    gpus: () => unwrap(m.gpusJson()),
    defaults: () => unwrap(m.defaultsJson()),
    intake: (input) => unwrap(m.intakeJson(asText(input))), // {config, lines?, format?, base?} -> {request, sources, defaulted, ...}
    raw: m, // the text-in/text-out functions: estimateJson, planJson, parseConfigJson, ...
  };
}
