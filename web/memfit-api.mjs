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

/**
 * The module's text functions (estimateJson, planJson, ...): each copies its argument into the
 * module's memory as UTF-8, calls the C export, and copies the result text out.
 */
function textFunctions(m) {
  const call = (fn, text) => {
    const size = m.lengthBytesUTF8(text);
    const ptr = m._malloc(size + 1);
    try {
      m.stringToUTF8(text, ptr, size + 1);
      return m.UTF8ToString(fn(ptr, size));
    } finally {
      m._free(ptr);
    }
  };
  return {
    estimateJson: (text) => call(m._memfit_estimate, text),
    planJson: (text) => call(m._memfit_plan, text),
    parseConfigJson: (text) => call(m._memfit_parse_config, text),
    setLibraryJson: (text) => call(m._memfit_set_library, text),
    modelsJson: () => m.UTF8ToString(m._memfit_models()),
    gpusJson: () => m.UTF8ToString(m._memfit_gpus()),
    defaultsJson: () => m.UTF8ToString(m._memfit_defaults()),
    call, // (C export, text) -> text: the intake module uses it too
  };
}

/** The launch-config intake module: resolves to text -> result text. */
async function loadIntake(moduleOptions) {
  const { default: createMemfitIntake } = await import('./memfit-intake.mjs');
  const m = await createMemfitIntake(moduleOptions);
  const call = textFunctions(m).call;
  return (text) => call(m._memfit_intake, text);
}

/** The bundled model library (library.json next to this file), fetched while the module compiles. */
async function fetchLibrary() {
  const response = await fetch(new URL('./library.json', import.meta.url));
  if (!response.ok) throw new Error(`library.json: HTTP ${response.status}`);
  return response.text();
}

/**
 * Loads the module and hands it the model library. Every function takes an object (or JSON
 * text) and returns a plain object. options.library: library.json's text (Node, which cannot
 * fetch a file URL); the rest goes to the Emscripten module.
 */
export async function loadMemfit({ library, intake: intakeOptions = {}, ...moduleOptions } = {}) {
  let intake = null;
  const [module, libraryText] = await Promise.all([createMemfit(moduleOptions), library ?? fetchLibrary()]);
  const m = textFunctions(module);
  unwrap(m.setLibraryJson(libraryText));
  return {
    estimate: (request) => unwrap(m.estimateJson(asText(request))),
    plan: (request) => unwrap(m.planJson(asText(request))),
    parseConfig: (config) => unwrap(m.parseConfigJson(asText(config))),
    models: () => unwrap(m.modelsJson()),
    gpus: () => unwrap(m.gpusJson()),
    defaults: () => unwrap(m.defaultsJson()),
    // {config, lines?, format?, base?} -> {request, sources, defaulted, ...}; async: the intake is its
    // own module (memfit-intake.wasm), loaded on the first call. options.intake: its module options
    // (Node: {wasmBinary}).
    intake: async (input) => unwrap((await (intake ??= loadIntake(intakeOptions)))(asText(input))),
    raw: m, // the text-in/text-out functions: estimateJson, planJson, parseConfigJson, ...
  };
}
