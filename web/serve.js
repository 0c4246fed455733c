// The "Serve" panel (issue 11): which context lengths and how many concurrent requests a
// serving engine (vLLM, SGLang) fits on the selected GPUs. Self-contained: its own controls and
// its own instance of the core (task "serve"); it reads only the model (the main form's resolved
// model, see mainModel) and the GPU from the main form (#model, #gpu, #mem) and never writes to it.
import { loadMemfit } from './memfit-api.mjs';

const CONTEXTS = [2048, 4096, 8192, 16384, 32768, 65536, 131072];
const CONCURRENCY = [1, 2, 4, 8, 16, 32, 64, 128, 256];
const $ = (id) => document.getElementById(id);
const GIB = 2 ** 30;

/** Requests of `context` tokens the KV cache holds at once (vLLM: whole blocks per request). */
export function fitsCell(serving, context, concurrency) {
  if (context > serving.max_model_len_that_fits) return false;
  const block = serving.block_size || 1;
  return Math.ceil(context / block) * block * concurrency <= serving.kv_cache_tokens;
}

/** The task "serve" request for one context length. */
export function serveRequest(base, controls, context) {
  const serving = {
    engine: controls.engine,
    max_model_len: context,
    tensor_parallel_size: controls.tp,
    kv_cache_dtype: controls.kv,
  };
  if (controls.engine === 'vllm') serving.gpu_memory_utilization = controls.util;
  else serving.mem_fraction_static = controls.util;
  return { model: base.model, gpu: base.gpu, task: 'serve', serving };
}

function readControls() {
  return {
    engine: $('serve-engine').value,
    util: Number($('serve-util').value),
    tp: Math.max(1, Number($('serve-tp').value) || 1),
    kv: $('serve-kv').value,
    context: Number($('serve-context').value),
    concurrency: Math.max(1, Number($('serve-conc').value) || 1),
  };
}

// The main form's model as the core reads it: a bundled id, or the config fetched from the Hub or
// pasted (app.js announces each resolved model with a 'memfit:model' event; { failed } when it did
// not load). Before the first announcement, the field's id.
let mainModel = null;
if (typeof document !== 'undefined') document.addEventListener('memfit:model', (e) => { mainModel = e.detail; });

function readBase() {
  const id = $('model')?.value?.trim();
  const gpuName = $('gpu')?.value;
  const gpu = gpuName === 'custom' ? { memory_gib: Number($('mem')?.value) || 80 } : { name: gpuName || 'H100' };
  if (mainModel?.failed) return { model: null, failed: mainModel.failed, gpu, id };
  return { model: mainModel?.ref ?? { id: id || 'meta-llama/Llama-3.1-8B' }, gpu, id };
}

/** The main form's model did not load: no figures (a grid of ✗ would read as "nothing fits"). */
function renderWaiting(base) {
  $('serve-error').hidden = true;
  $('serve-grid').replaceChildren();
  $('serve-summary').replaceChildren(el('p', {}, `The serving figures wait for the model above: ${base.failed}`));
}

const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const kid of kids) e.append(kid);
  return e;
};

function renderGrid(rows, target) {
  const table = $('serve-grid');
  table.replaceChildren();
  const head = el('tr', {}, el('th', { scope: 'col' }, 'context \\ concurrency'));
  for (const c of CONCURRENCY) head.append(el('th', { scope: 'col' }, String(c)));
  table.append(el('thead', {}, head));
  const body = el('tbody');
  for (const { context, serving, error } of rows) {
    const tr = el('tr', {}, el('th', { scope: 'row' }, `${context / 1024}K`));
    for (const c of CONCURRENCY) {
      const ok = !error && fitsCell(serving, context, c);
      const cell = el('td', { class: ok ? 'fit' : 'oom', 'data-fits': ok ? '1' : '0' }, ok ? '✓' : '✗');
      if (context === target.context && c === target.concurrency) cell.classList.add('selected');
      tr.append(cell);
    }
    body.append(tr);
  }
  table.append(body);
}

// The GPU the panel sized, as the main form names it (a custom GPU by its memory).
function gpuLabel(base) {
  if (base.gpu.name) return $('gpu')?.selectedOptions?.[0]?.textContent?.trim() || base.gpu.name;
  return `a ${base.gpu.memory_gib} GiB GPU`;
}

function renderSummary(s, warnings, controls, base) {
  const p = $('serve-summary');
  const lines = [
    `${s.engine_profile} on ${gpuLabel(base)}: model weights ${(s.weights_bytes / GIB).toFixed(2)} GiB per GPU, KV cache ${(s.kv_cache_bytes / GIB).toFixed(2)} GiB`,
    `GPU KV cache size: ${s.kv_cache_tokens.toLocaleString('en-US')} tokens; maximum concurrency for ${controls.context.toLocaleString('en-US')} tokens per request: ${s.max_concurrency.toFixed(2)}x`,
    s.fits ? `${controls.concurrency} concurrent ${controls.context.toLocaleString('en-US')}-token requests ${fitsCell(s, controls.context, controls.concurrency) ? 'fit' : 'do not all fit at once'}.`
      : `One ${controls.context.toLocaleString('en-US')}-token request does not fit (${(s.shortfall_bytes / GIB).toFixed(2)} GiB short)` +
        (s.fixes.length ? `; would fit with ${s.fixes.map((f) => f.change).join(', or ')}.` : '.'),
  ];
  p.replaceChildren(...lines.map((t) => el('p', {}, t)), ...warnings.map((w) => el('p', { class: 'field-msg warning' }, `Warning: ${w}`)));
}

export async function startServePanel(apiPromise = loadMemfit()) {
  const card = $('serve-card');
  if (!card) return;
  const style = document.createElement('style');
  style.textContent = '#serve-grid td{text-align:center}#serve-grid td.fit{background:#dcf3e3}#serve-grid td.oom{background:#f7dede}' +
    '#serve-grid td.selected{outline:2px solid currentColor}#serve-card .fields{display:flex;flex-wrap:wrap;gap:.5rem 1rem}';
  document.head.append(style);
  const api = await apiPromise;
  let pending = 0;
  const update = () => {
    const ticket = ++pending;
    queueMicrotask(() => {
      if (ticket !== pending) return;
      const controls = readControls();
      const base = readBase();
      if (!base.model) {
        renderWaiting(base);
        card.dataset.model = base.id ?? '';
        card.dataset.ready = '1';
        return;
      }
      const rows = CONTEXTS.map((context) => {
        try {
          return { context, serving: api.estimate(serveRequest(base, controls, context)).serving };
        } catch (e) {
          return { context, error: e.message };
        }
      });
      const err = rows.find((r) => r.error);
      $('serve-error').hidden = !err;
      $('serve-error').textContent = err ? err.error : '';
      renderGrid(rows, controls);
      try {
        const answer = api.estimate(serveRequest(base, controls, controls.context));
        renderSummary(answer.serving, answer.warnings ?? [], controls, base);
      } catch (e) {
        $('serve-summary').replaceChildren(el('p', {}, e.message));
      }
      card.dataset.model = base.id ?? '';
      card.dataset.ready = '1';
    });
  };
  // The main form sets the model and GPU without change events (URL state, Hub lookups):
  // follow them by polling the two values.
  let seen = '';
  setInterval(() => {
    const now = JSON.stringify(readBase());
    if (now !== seen) {
      seen = now;
      update();
    }
  }, 400);
  $('serve-engine').addEventListener('change', () => {
    $('serve-util').value = $('serve-engine').value === 'vllm' ? '0.9' : '0.88';
    update();
  });
  for (const id of ['serve-util', 'serve-tp', 'serve-kv', 'serve-context', 'serve-conc', 'model', 'gpu', 'mem'])
    $(id)?.addEventListener('change', update);
  update();
}

if (typeof document !== 'undefined' && document.getElementById('serve-card')) startServePanel();
