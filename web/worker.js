// Runs the core off the main thread so typing never waits for a plan.
import { loadMemfit } from './memfit-api.mjs';
import { compute } from './compute.js';

const ready = loadMemfit();
const ops = {
  init: (api) => ({ models: api.models(), gpus: api.gpus(), defaults: api.defaults() }),
  compute: (api, job) => compute(api, job),
  parseConfig: (api, config) => api.parseConfig(config),
  intake: (api, input) => api.intake(input),
};

self.onmessage = async ({ data: { seq, op, arg } }) => {
  try {
    const api = await ready;
    self.postMessage({ seq, value: await ops[op](api, arg) }); // intake is async (its own module)
  } catch (e) {
    self.postMessage({ seq, error: e?.message ?? String(e), core: e?.name === 'MemfitError' });
  }
};
