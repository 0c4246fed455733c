// The page: form state ⇄ URL, model from the Hub / bundled library / a pasted config, and a
// recomputation (in a worker) on every change. All arithmetic happens in the core.
import * as hub from './hub.js';
import { h, params, renderDetail, renderGrid, renderRecommendation, toMarkdown } from './render.js';
import { buildRequest, decodeConfig, defaultState, encodeConfig, readForm, stateFromUrl, stateToHash, writeForm } from './state.js';

const $ = (id) => document.getElementById(id);
const form = $('setup');
const embed = new URL(location.href).searchParams.get('embed') === '1';
document.body.classList.toggle('embed', embed);

const LABELS = {
  task: { full: 'Full fine-tuning', lora: 'LoRA', qlora: 'QLoRA (quantized base)', inference: 'Inference (serving)' },
  precision: { fp32: 'fp32', amp_bf16: 'bf16 mixed (AMP)', amp_fp16: 'fp16 mixed (AMP)', bf16: 'bf16', fp16: 'fp16' },
  quant: { none: 'Unquantized', int8: '8-bit (bitsandbytes)', nf4: 'NF4 4-bit', nf4_double: 'NF4 4-bit + double quant',
    gptq_int4: 'GPTQ 4-bit', awq_int4: 'AWQ 4-bit', fp8: 'FP8 (block-scaled)', mxfp4: 'MXFP4', nvfp4: 'NVFP4' },
  optimizer: { adamw: 'AdamW', adamw_fused: 'AdamW (fused)', adamw_loop: 'AdamW (per-tensor loop)', adamw_8bit: 'AdamW 8-bit',
    paged_adamw_8bit: 'Paged AdamW 8-bit', paged_adamw: 'Paged AdamW 32-bit', sgd: 'SGD', sgd_momentum: 'SGD + momentum',
    adafactor: 'Adafactor', lion: 'Lion' },
  attn: { eager: 'Eager', sdpa: 'SDPA', flash_attention_2: 'FlashAttention-2' },
  kv: {},
};
const OPTION_KEYS = { task: 'task', precision: 'precision', quant: 'quantization', optimizer: 'optimizer', attn: 'attention', kv: 'inference.kv_cache_dtype' };

// ---- The core: a module worker, or the main thread where workers cannot load modules.
function coreInWorker() {
  const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
  const pending = new Map();
  let seq = 0;
  worker.onmessage = ({ data }) => {
    const p = pending.get(data.seq);
    pending.delete(data.seq);
    if (data.error == null) p.resolve(data.value);
    else p.reject(Object.assign(new Error(data.error), { core: data.core }));
  };
  const failed = new Promise((_, reject) => worker.addEventListener('error', (e) => reject(new Error(e.message || 'worker failed'))));
  const call = (op, arg) => Promise.race([failed, new Promise((resolve, reject) => {
    pending.set(++seq, { resolve, reject });
    worker.postMessage({ seq, op, arg });
  })]);
  return { call, where: 'a worker' };
}

async function coreOnMainThread() {
  const [{ loadMemfit }, { compute }] = await Promise.all([import('./memfit-api.mjs'), import('./compute.js')]);
  const api = await loadMemfit();
  const ops = { init: () => ({ models: api.models(), gpus: api.gpus(), defaults: api.defaults() }), compute: (job) => compute(api, job),
    parseConfig: (c) => api.parseConfig(c) };
  return {
    call: async (op, arg) => {
      try {
        return ops[op](arg);
      } catch (e) {
        throw Object.assign(new Error(e.message), { core: e.name === 'MemfitError' });
      }
    },
    where: 'the main thread',
  };
}

let core;
let init;
try {
  core = coreInWorker();
  init = await core.call('init');
} catch {
  core = await coreOnMainThread();
  init = await core.call('init');
}

// ---- Form setup from the core's defaults and catalogs.
const models = init.models.filter((m) => !m.error);
const bundled = new Map(models.map((m) => [m.id.toLowerCase(), m]));
const gpus = new Map(init.gpus.map((g) => [g.name, g]));
$('model-list').replaceChildren(...models.map((m) => h('option', { value: m.id }, `${m.model_type} · ${params(m.params)}`)));
for (const [field, key] of Object.entries(OPTION_KEYS))
  $(field).replaceChildren(...init.defaults.options[key].filter((v) => v !== 'serve') // task "serve": the Serve panel (serve.js)
    .map((v) => h('option', { value: v }, LABELS[field][v] ?? v)));
$('gpu').replaceChildren(...init.gpus.map((g) => h('option', { value: g.name }, g.label)), h('option', { value: 'custom' }, 'Custom memory…'));

const defaults = defaultState(init.defaults);
let state = stateFromUrl(new URL(location.href), defaults);
writeForm(form, state);
$('config-text').value = state.cfg ? safeDecode(state.cfg, '') : '';
$('hf-token').value = hub.getToken();

function safeDecode(text, fallback) {
  try {
    return JSON.stringify(decodeConfig(text), null, 2);
  } catch {
    return fallback;
  }
}

// ---- Model resolution: pasted config, bundled library, or the Hub.
class PageError extends Error {}
let prefilledFor = '';

async function resolveModel(s) {
  if (s.cfg) {
    let config;
    try {
      config = decodeConfig(s.cfg);
    } catch {
      throw new PageError('The config.json in this link is damaged: paste it again.');
    }
    return { ref: { config }, name: 'pasted config.json', source: 'Pasted config.json' };
  }
  const id = hub.parseModelId(s.model);
  if (!id) {
    throw new PageError(s.model.trim()
      ? `"${s.model.trim()}" is not a model id: type org/name (e.g. meta-llama/Llama-3.1-8B), paste a huggingface.co link, or pick a bundled model.`
      : 'Type a Hugging Face model id (org/name), paste a huggingface.co link, or pick one of the bundled models.');
  }
  if (id !== s.model) {
    state.model = id; // a pasted huggingface.co link becomes its id (in the URL, and in the field once it loses focus)
    writeForm(form, state);
    syncUrl();
  }
  const known = bundled.get(id.toLowerCase());
  if (known) return { ref: { id: known.id }, name: known.id, source: 'Bundled config' };
  setStatus(`Fetching ${id} from huggingface.co…`, 'busy');
  const { config, info } = await hub.fetchModel(id);
  const stored = hub.storedParams(info);
  const quant = hub.detectQuantization(config);
  let extra = '';
  if (quant && prefilledFor !== id) {
    prefilledFor = id;
    if (quant.quantization && state.quant === 'none') {
      state.quant = quant.quantization;
      if (state.task === 'full') state.task = quant.quantization.startsWith('nf4') || quant.quantization === 'int8' ? 'qlora' : 'lora';
      writeForm(form, state);
      syncUrl();
    }
  }
  if (quant) extra = quant.quantization ? ` Pre-quantized checkpoint (${quant.label}): weights set to ${LABELS.quant[quant.quantization]}.`
    : ` Pre-quantized checkpoint (${quant.label}): memfit does not model this scheme; weights are estimated unquantized.`;
  return { ref: { id, config }, name: id, source: 'From huggingface.co', stored, extra };
}

function setStatus(text, kind = '') {
  const el = $('model-status');
  el.textContent = text;
  el.className = `status ${kind}`;
}

function describeModel(model, result) {
  const m = (result.estimate ?? result.plan).model;
  const p = (result.plan ?? result.estimate).params;
  let text = `${model.source} · ${m.model_type} · ${params(p.total)} parameters`;
  if (model.stored) {
    const dtypes = model.stored.dtypes.map(([d]) => d).join(' + ');
    text += ` · Hub safetensors: ${params(model.stored.total)} stored as ${dtypes}`;
    const diff = Math.abs(model.stored.total - p.total) / p.total;
    if (diff > 0.01) text += ' (quantized packing or extra tensors change the stored count)';
  }
  if (m.approximate) text += ' · approximate: some sizes were inferred';
  return text + (model.extra ?? '');
}

// ---- Recompute.
let lastResult = null;
let lastModel = null;
let computed = 0; // recomputations shown so far (tests wait on body[data-computed])
let running = false;
let again = false;

function context(request, model) {
  const g = gpus.get(state.gpu);
  return { request, modelName: model?.name ?? state.model, gpus: state.gpus, gpuLabel: g ? g.label : `${state.mem} GiB GPU`,
    ibatch: state.ibatch, ictx: state.ictx, url: location.href.replace(/[?&]embed=1/, '') };
}

function showError(message) {
  const el = $('error');
  el.hidden = !message;
  el.textContent = message ?? '';
  if (message) {
    $('grid-card').hidden = true;
    $('detail').hidden = true;
    $('recommendation').hidden = true;
  }
}

async function recompute() {
  const s = state;
  let model;
  try {
    model = await resolveModel(s);
  } catch (e) {
    if (s !== state) return;
    const message = e instanceof PageError || e instanceof hub.HubError ? e.message : `Could not load the model: ${e.message}`;
    setStatus(message, 'error');
    if (e instanceof hub.HubError && e.kind === 'gated') $('token-box').open = true;
    showError(e instanceof hub.HubError && e.kind === 'network'
      ? 'huggingface.co is unreachable. Bundled models (type or pick one from the list) and pasted configs still work.' : message);
    lastResult = null;
    return;
  }
  const request = buildRequest(state, model.ref);
  const selection = state.sel ? { label: state.sel.split('|')[0], mbs: Number(state.sel.split('|')[1]) || null } : null;
  let result;
  try {
    result = await core.call('compute', { request, selection, userMicroBatch: state.mbs });
  } catch (e) {
    setStatus(model.source, '');
    showError(e.core ? e.message : `Internal error: ${e.message}`);
    lastResult = null;
    return;
  }
  lastResult = { ...result, request };
  lastModel = model;
  setStatus(describeModel(model, result), 'ok');
  showError(null);
  render();
  $('timing').textContent = result.planMs != null ? `Plan computed in ${Math.round(result.planMs)} ms (in ${core.where}).` : '';
  window.memfit = { result: lastResult, planMs: result.planMs, ms: result.ms };
  document.body.dataset.ready = 'true';
  document.body.dataset.computed = String(++computed);
}

function render() {
  const result = lastResult;
  const ctx = context(result.request, lastModel);
  const reco = $('recommendation');
  reco.hidden = false;
  renderRecommendation(reco, result, ctx);
  $('grid-card').hidden = !result.plan;
  if (result.plan) renderGrid($('grid'), result.plan, result.selected, select);
  renderDetail($('detail'), result, ctx);
  $('embed-model').textContent = lastModel?.name ?? '';
  $('open-full').href = ctx.url.replace(/\?[^#]*/, '');
}

async function update() {
  if (running) {
    again = true;
    return;
  }
  running = true;
  try {
    await recompute();
  } finally {
    running = false;
    if (again) {
      again = false;
      update();
    }
  }
}

function select(cell, focus) {
  state = { ...state, sel: `${cell.label}|${cell.mbs}` };
  syncUrl();
  update().then(() => {
    if (focus) document.querySelector(`#grid td.cell[data-label="${CSS.escape(cell.label)}"][data-mbs="${cell.mbs}"]`)?.focus();
  });
}

function syncUrl() {
  const hash = stateToHash(state, defaults);
  if (location.hash !== hash) history.replaceState(null, '', `${location.pathname}${location.search}${hash}`);
}

// ---- Events: every change recomputes; typing is debounced, the core runs in a worker.
let timer = 0;
function schedule(delay) {
  clearTimeout(timer);
  timer = setTimeout(update, delay);
}
function syncVisibility() {
  document.body.dataset.task = state.task;
  document.body.dataset.gpu = state.gpu === 'custom' ? 'custom' : 'catalog';
}

$('model').addEventListener('blur', () => writeForm(form, state));
form.addEventListener('input', (e) => {
  const target = e.target;
  if (target.id === 'config-text' || target.id === 'hf-token' || target.id === 'config-file') return;
  const before = state;
  state = readForm(form, state);
  if (target.name === 'model') state.cfg = '';
  if (target.name === 'task') {
    if (state.task === 'qlora' && !['nf4', 'nf4_double', 'int8'].includes(state.quant)) state.quant = 'nf4';
    if (state.task === 'full' && state.quant !== 'none') state.quant = 'none';
    writeForm(form, state);
  }
  if (target.name === 'gpu' && state.gpu === 'custom' && before.gpu !== 'custom' && gpus.get(before.gpu)) {
    state.mem = +(gpus.get(before.gpu).memory_bytes / 2 ** 30).toFixed(1);
    writeForm(form, state);
  }
  // A new setup invalidates a picked micro-batch column unless the user picked the layout only.
  if (target.name !== 'sel' && before.sel && (target.name === 'mbs' || target.name === 'gpus' || target.name === 'model')) state.sel = '';
  syncVisibility();
  syncUrl();
  const typing = target.tagName === 'INPUT' && target.type !== 'checkbox';
  schedule(target.name === 'model' ? 450 : typing ? 150 : 0);
});

$('config-text').addEventListener('input', () => usePastedConfig($('config-text').value));
$('config-file').addEventListener('change', async (e) => {
  const file = e.target.files?.[0];
  if (!file) return;
  $('config-text').value = await file.text();
  usePastedConfig($('config-text').value);
});
$('config-clear').addEventListener('click', () => {
  $('config-text').value = '';
  state = { ...state, cfg: '' };
  syncUrl();
  schedule(0);
});

function usePastedConfig(text) {
  if (!text.trim()) return;
  let config;
  try {
    config = JSON.parse(text);
  } catch (e) {
    setStatus(`That config.json is not valid JSON: ${e.message}. Check for a missing comma, quote or bracket.`, 'error');
    return;
  }
  if (!config || typeof config !== 'object' || Array.isArray(config)) {
    setStatus('A config.json is a JSON object ({...}).', 'error');
    return;
  }
  state = { ...state, cfg: encodeConfig(config), sel: '' };
  syncUrl();
  schedule(150);
}

$('hf-token').addEventListener('change', () => {
  hub.setToken($('hf-token').value);
  schedule(0);
});

$('copy-link').addEventListener('click', async () => {
  syncUrl();
  try {
    await navigator.clipboard.writeText(location.href);
    toast('Link copied: it reopens this exact setup.');
  } catch {
    toast(`Copy this link: ${location.href}`);
  }
});

function download(name, type, text) {
  const a = h('a', { href: URL.createObjectURL(new Blob([text], { type })), download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}
const slug = () => (lastModel?.name ?? 'model').replace(/[^\w.-]+/g, '_');
$('export-json').addEventListener('click', () => {
  if (!lastResult) return toast('Nothing to export yet.');
  const { request, plan, estimate, selected } = lastResult;
  download(`memfit-${slug()}.json`, 'application/json',
    `${JSON.stringify({ url: location.href, request, selected, plan, estimate }, null, 2)}\n`);
});
$('export-md').addEventListener('click', () => {
  if (!lastResult) return toast('Nothing to export yet.');
  download(`memfit-${slug()}.md`, 'text/markdown', toMarkdown(lastResult, context(lastResult.request, lastModel)));
});

let toastTimer = 0;
function toast(text) {
  const el = $('toast');
  el.textContent = text;
  el.classList.add('show');
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => el.classList.remove('show'), 4000);
}

window.addEventListener('hashchange', () => {
  state = stateFromUrl(new URL(location.href), defaults);
  writeForm(form, state);
  syncVisibility();
  schedule(0);
});

syncVisibility();
syncUrl();
await update();
