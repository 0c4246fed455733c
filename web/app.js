// The page: form state ⇄ URL, model from the Hub / bundled library / a pasted config, and a
// recomputation (in a worker) on every change. All arithmetic happens in the core.
import * as hub from './hub.js';
import { h, params, renderDetail, renderGrid, renderRecommendation, toMarkdown } from './render.js';
import { buildRequest, decodeConfig, defaultState, encodeConfig, readForm, stateFromRequest, stateFromUrl, stateToHash, writeForm } from './state.js';
import { setupIntake } from './intake.js';
import { searchModels } from './search.js';
import { markScrollEdges } from './scroll-edges.js';
import { fieldProblems, coreErrorField, showFieldMessages } from './fields.js';

const $ = (id) => document.getElementById(id);
const form = $('setup');
const startUrl = new URL(location.href);
const embed = startUrl.searchParams.get('embed') === '1' || new URLSearchParams(startUrl.hash.slice(1)).get('embed') === '1';
document.body.classList.toggle('embed', embed);
if (embed) applyTheme(startUrl.searchParams);

/** Embed theming: the <memfit-calculator> element forwards its --memfit-* custom properties. */
function applyTheme(query) {
  const vars = { accent: ['--accent', '--focus'], bg: ['--bg'], card: ['--card', '--field'], fg: ['--fg'], muted: ['--muted'],
    border: ['--border'], radius: ['--radius'], font: ['--font'] };
  for (const [key, names] of Object.entries(vars)) {
    const value = query.get(`theme-${key}`);
    if (value && !/[;{}<>]/.test(value)) for (const name of names) document.documentElement.style.setProperty(name, value);
  }
}

const LABELS = {
  task: { full: 'Full fine-tuning', lora: 'LoRA', qlora: 'QLoRA (quantized base)', inference: 'Inference (serving)' },
  precision: { fp32: 'fp32', amp_bf16: 'bf16 mixed precision (fp32 weights, bf16 math)',
    amp_fp16: 'fp16 mixed precision (fp32 weights, fp16 math)', bf16: 'bf16 (weights and math)', fp16: 'fp16 (weights and math)' },
  quant: { none: 'Unquantized', int8: '8-bit (bitsandbytes)', nf4: 'NF4 4-bit', nf4_double: 'NF4 4-bit + double quant',
    gptq_int4: 'GPTQ 4-bit', awq_int4: 'AWQ 4-bit', fp8: 'FP8 (block-scaled)', mxfp4: 'MXFP4', nvfp4: 'NVFP4' },
  optimizer: { adamw: 'AdamW', adamw_fused: 'AdamW (fused)', adamw_loop: 'AdamW (per-tensor loop)', adamw_8bit: 'AdamW 8-bit',
    paged_adamw_8bit: 'Paged AdamW 8-bit', paged_adamw: 'Paged AdamW 32-bit', sgd: 'SGD', sgd_momentum: 'SGD + momentum',
    adafactor: 'Adafactor', lion: 'Lion' },
  attn: { auto: 'Automatic (what the framework picks)', eager: 'Eager', sdpa: 'SDPA', flash_attention_2: 'FlashAttention-2' },
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
    parseConfig: (c) => api.parseConfig(c), intake: (input) => api.intake(input) };
  return {
    call: async (op, arg) => {
      try {
        return await ops[op](arg); // intake is async (its own module)
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
$('precision').prepend(h('option', { value: 'auto' }, 'Automatic: what the framework loads'));
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

// ---- Model resolution: pasted config, bundled library (forgiving search), or the Hub.
class PageError extends Error {
  constructor(message, { field = null, pending = false } = {}) {
    super(message);
    this.field = field; // the control it is about
    this.pending = pending; // waiting for the user (not a failure)
  }
}
let prefilledFor = '';
const ids = models.map((m) => m.id);
// The Hub is asked only for an id the user committed to (Enter, leaving the field, a paste, a
// pick from a list, a link): never for the half-typed ids between keystrokes.
let committed = true;
let configSource = state.cfg ? 'config.json from the link' : '';
let modelBeforeConfig = state.cfg ? '' : state.model;

function showSuggestions(list, heading) {
  const box = $('model-suggest');
  box.hidden = !list.length;
  box.replaceChildren(...(list.length ? [h('p', { class: 'hint' }, heading),
    h('ul', {}, list.map((id) => h('li', {}, h('button', { type: 'button', class: 'link', 'data-id': id }, id))))] : []));
}
$('model-suggest').addEventListener('click', (e) => {
  const id = e.target.closest('button[data-id]')?.dataset.id;
  if (!id) return;
  $('model').value = id;
  state = { ...state, model: id, cfg: '', sel: '' };
  committed = true;
  showSuggestions([]);
  syncUrl();
  schedule(0);
});

/** Online, Hub ids for a query that no bundled model matches (api/models?search=), cached. */
const hubSearches = new Map();
async function suggestFromHub(query) {
  if (query.length < 3 || embed) return;
  if (!hubSearches.has(query)) hubSearches.set(query, hub.searchModels(query).catch(() => []));
  const found = await hubSearches.get(query);
  if (state.model.trim() === query && found.length) showSuggestions(found, 'On huggingface.co:');
}

let waitingForCommit = false;
async function resolveModel(s) {
  waitingForCommit = false;
  if (s.cfg) {
    let config;
    try {
      config = decodeConfig(s.cfg);
    } catch {
      throw new PageError('The config.json in this link is damaged: paste it again.');
    }
    const name = typeof config._name_or_path === 'string' && config._name_or_path.trim() ? config._name_or_path.trim() : s.model;
    return { ref: { config }, name: name || 'config.json', source: configSource || 'Pasted config.json' };
  }
  const typed = s.model.trim();
  const found = searchModels(typed, ids);
  if (found.exact) {
    showSuggestions([]);
    if (found.exact !== s.model) {
      state.model = found.exact; // "llama 3.1 8b" becomes its id (in the URL, and in the field once it loses focus)
      syncUrl();
    }
    const known = bundled.get(found.exact.toLowerCase());
    return { ref: { id: known.id }, name: known.id, source: 'Bundled config' };
  }
  const id = hub.parseModelId(s.model);
  if (found.matches.length) {
    const n = found.matches.length;
    showSuggestions(found.matches.slice(0, 8), n === 1 ? `A bundled model close to "${typed}":`
      : `${n} bundled models match "${typed}"${n > 8 ? ' (the first 8)' : ''}:`);
    if (!id) throw new PageError(`Several bundled models match "${typed}": pick one from the list under the field.`, { field: 'model', pending: true });
  } else {
    showSuggestions([]);
  }
  if (!id) {
    suggestFromHub(typed);
    throw new PageError(typed
      ? `No bundled model matches "${typed}". Type a Hugging Face id (org/name, e.g. meta-llama/Llama-3.1-8B), paste a huggingface.co link, or paste the model's config.json.`
      : 'Type a model name (e.g. llama 3.1 8b), a Hugging Face id (org/name) or a huggingface.co link.', { field: 'model' });
  }
  if (id !== s.model) {
    state.model = id; // a pasted huggingface.co link becomes its id (in the URL, and in the field once it loses focus)
    writeForm(form, state);
    syncUrl();
  }
  if (!committed) {
    waitingForCommit = true;
    throw new PageError(`${id} is not bundled: press Enter to load it from huggingface.co.`, { field: 'model', pending: true });
  }
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
  if (!result) return `${model.source}${model.extra ?? ''}`;
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

/** The full calculator's address for this setup (embed mode drops its query: embed, theme). */
const fullUrl = () => `${location.origin}${location.pathname}${stateToHash(state, defaults)}`;

function context(request, model) {
  const g = gpus.get(state.gpu);
  return { request, modelName: model?.name ?? state.model, gpus: state.gpus, gpuLabel: g ? g.label : `${state.mem} GiB GPU`,
    ibatch: state.ibatch, ictx: state.ictx, url: fullUrl() };
}

/** The message's Hub model pages (huggingface.co/org/name, where a gated model's licence is
 *  accepted) as links. */
function withHubLinks(message) {
  return message.split(/(huggingface\.co\/[\w.-]+\/[\w.-]*[\w-])/).map((part, i) => (i % 2
    ? h('a', { href: `https://${part}`, target: '_blank', rel: 'noopener' }, part) : part));
}

/** Shows an error (or clears it with null). The last valid result stays, marked as stale. */
function showError(message, { stale = true } = {}) {
  const el = $('error');
  el.hidden = !message;
  el.replaceChildren(...(message ? withHubLinks(message) : []));
  const hasResult = !!lastResult && stale;
  $('results').classList.toggle('stale', !!message && hasResult);
  if (message && hasResult) el.append(h('span', { class: 'stale-note' }, ' The results below are for the last valid setup.'));
  if (message && !hasResult) {
    $('grid-card').hidden = true;
    $('detail').hidden = true;
    $('recommendation').hidden = true;
  }
  updateSummary(message);
}

/** The Serve panel (serve.js) sizes the model the main form resolved: a bundled id, or the config
 *  fetched from the Hub or pasted ({ ref }), or nothing when it did not load ({ failed }). */
function announceModel(detail) {
  document.dispatchEvent(new CustomEvent('memfit:model', { detail }));
}

/** The model could not be resolved: say so next to the field and in the results. */
function modelFailed(e) {
  let message = e instanceof PageError || e instanceof hub.HubError ? e.message : `Could not load the model: ${e.message}`;
  const network = e instanceof hub.HubError && e.kind === 'network';
  if (network && embed) message = `huggingface.co is unreachable, and ${state.model} is not bundled. Open in memfit ↗ to paste its config.json.`;
  setStatus(message, e.pending ? 'hint' : 'error');
  if (e.pending) { // waiting for the user, not a failure: the last result stays, marked stale
    $('error').hidden = true;
    $('results').classList.toggle('stale', !!lastResult);
    return;
  }
  announceModel({ failed: message });
  if (e instanceof hub.HubError && e.kind === 'gated') $('token-box').open = true;
  if (network) $('config-box').open = true; // the way on is to paste or upload the config
  showError(network && !embed
    ? 'huggingface.co is unreachable. Bundled models (type a name, e.g. llama 3.1 8b) and pasted or uploaded configs still work.' : message);
}

async function recompute() {
  const s = state;
  const problems = fieldProblems(s);
  showFieldMessages(form, problems);
  const blocking = Object.entries(problems).filter(([, p]) => p.error);
  if (blocking.length) {
    showError(`${blocking.map(([, p]) => p.error).join(' ')}`);
    return;
  }
  let model;
  try {
    model = await resolveModel(s);
  } catch (e) {
    if (s !== state) return;
    modelFailed(e);
    return;
  }
  const request = buildRequest(state, model.ref);
  const selection = state.sel ? { label: state.sel.split('|')[0], mbs: Number(state.sel.split('|')[1]) || null } : null;
  let result;
  try {
    result = await core.call('compute', { request, selection, userMicroBatch: state.mbs });
  } catch (e) {
    setStatus(describeModel(model, null), '');
    const field = e.core ? coreErrorField(e.message) : null;
    if (field) showFieldMessages(form, { ...problems, [field.name]: { error: field.message } });
    showError(field ? field.message : e.core ? e.message : `Internal error: ${e.message}`);
    return;
  }
  lastResult = { ...result, request };
  lastModel = model;
  // A GPU alias from a link or an embed attribute ("H100", "h100-80gb"): the core's catalog name.
  const gpuName = result.plan?.gpu.name ?? result.estimate?.request.gpu.name;
  if (state.gpu !== 'custom' && !gpus.has(state.gpu) && gpus.has(gpuName)) {
    state.gpu = gpuName;
    writeForm(form, state);
    syncUrl();
  }
  setStatus(describeModel(model, result), 'ok');
  showError(null);
  render();
  const slow = bf16Warning(result);
  if (slow) showFieldMessages(form, { ...problems, precision: { warning: slow.charAt(0).toUpperCase() + slow.slice(1) } });
  $('timing').textContent = result.planMs != null ? `Plan computed in ${Math.round(result.planMs)} ms (in ${core.where}).` : '';
  window.memfit = { result: lastResult, planMs: result.planMs, ms: result.ms };
  announceModel({ ref: model.ref });
  document.body.dataset.ready = 'true';
  document.body.dataset.computed = String(++computed);
}

function render() {
  const result = lastResult;
  const ctx = { ...context(result.request, lastModel), atControls: [bf16Warning(result)].filter(Boolean) };
  const reco = $('recommendation');
  reco.hidden = false;
  renderRecommendation(reco, result, ctx, applyPatch);
  $('grid-card').hidden = !result.plan;
  if (result.plan) renderGrid($('grid'), result.plan, result.selected, select);
  const skipped = result.plan?.skipped ?? [];
  $('skipped').hidden = !skipped.length;
  $('skipped').textContent = skipped.length ? `Not possible for this model: ${skipped.map((s) => `${s.label} (${s.error})`).join('; ')}.` : '';
  renderDetail($('detail'), result, ctx);
  $('precision-hint').textContent = precisionWords(result);
  updateSummary(null);
  $('embed-model').textContent = lastModel?.name ?? '';
  $('open-full').href = ctx.url;
}

/**
 * bf16 on a GPU without it (V100, T4): the run starts, because PyTorch emulates bf16 there, with
 * the same memory but much slower; the core warns, and the page says it at the Precision control
 * (not again in the answer's warnings).
 */
const bf16Warning = (result) => result.estimate?.warnings?.find((w) => /no native bf16/.test(w)) ?? null;

/**
 * What the run loads and what it trains, in words, from the request the core answered (its
 * precision and LoRA targets resolved where the form left them automatic).
 */
function precisionWords(result) {
  const r = result.estimate?.request;
  if (!r) return '';
  const half = { fp32: 'fp32', amp_bf16: 'fp32', amp_fp16: 'fp32', bf16: 'bf16', fp16: 'fp16' }[r.precision] ?? r.precision;
  const math = { amp_bf16: 'bf16', amp_fp16: 'fp16' }[r.precision] ?? half;
  const quant = r.quantization && r.quantization !== 'none' ? LABELS.quant[r.quantization] ?? r.quantization : '';
  const auto = state.precision === 'auto' ? 'Automatic: ' : '';
  if (r.task === 'inference') return `${auto}weights loaded in ${quant || math}; math in ${math}.`; // serving has no fp32 master copy
  // DeepSpeed's mixed precision keeps half-precision weights and an fp32 master copy in the optimizer
  const deepspeed = /^zero/.test(r.parallelism?.method ?? '') && math !== half;
  if (r.task === 'full') return `${auto}${deepspeed ? `${math} weights with an fp32 master copy (DeepSpeed)` : `weights loaded in ${half}`}` +
    `, all of them trained; math in ${math}.`;
  const targets = Array.isArray(r.lora?.targets) ? r.lora.targets.join(', ') : r.lora?.targets;
  return `${auto}base model loaded in ${quant || half} and frozen; LoRA adapters trained${targets ? ` on ${targets}` : ''}; math in ${math}.`;
}

/** The one-line answer pinned to the bottom of a phone screen while the form is in view. */
function updateSummary(message) {
  const el = $('summary');
  const headline = $('recommendation').querySelector('.headline');
  el.textContent = message ? 'Fix the setup: see the message below ↓' : headline ? `${headline.textContent} ↓` : '';
  el.classList.toggle('oom', !!message || !!headline?.classList.contains('oom'));
}

/** Applies a suggested change ({request field: value}) from the "nothing fits" card. */
function applyPatch(patch) {
  const keys = { gradient_checkpointing: 'ckpt', task: 'task', quantization: 'quant', sequence_length: 'seq', num_gpus: 'gpus' };
  const next = { ...state, sel: '' };
  for (const [k, v] of Object.entries(patch)) if (keys[k]) next[keys[k]] = v;
  state = next;
  writeForm(form, state);
  syncVisibility();
  syncUrl();
  schedule(0);
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
  // mixed precision (fp32 weights, half-precision math) is a training recipe: serving loads half weights
  for (const o of $('precision').options) if (o.value.startsWith('amp_')) o.disabled = state.task === 'inference' && o.value !== state.precision;
  document.body.dataset.gpu = state.gpu === 'custom' ? 'custom' : 'catalog';
}

$('model').addEventListener('blur', () => writeForm(form, state));
// Enter or leaving the field commits a typed id: only then may it be fetched from the Hub.
function commitModel() {
  if (committed) return;
  committed = true;
  if (waitingForCommit) schedule(0); // only an id that waits for the Hub needs a new run
}
$('model').addEventListener('change', commitModel);
$('model').addEventListener('keydown', (e) => e.key === 'Enter' && commitModel());
form.addEventListener('submit', (e) => e.preventDefault());
form.addEventListener('input', (e) => {
  const target = e.target;
  if (['config-text', 'hf-token', 'config-file', 'launch-text', 'launch-file'].includes(target.id)) return;
  const before = state;
  state = readForm(form, state);
  if (target.name === 'model') {
    state.cfg = '';
    configSource = '';
    // typing is not committing; a paste or a pick from the browser's list is
    committed = e.inputType === 'insertFromPaste' || e.inputType === 'insertReplacementText' || e.inputType === undefined;
  }
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

$('config-text').addEventListener('input', () => usePastedConfig($('config-text').value, 'Pasted config.json'));
$('config-file').addEventListener('change', async (e) => {
  const file = e.target.files?.[0];
  if (!file) return;
  $('config-text').value = await file.text();
  usePastedConfig($('config-text').value, `Uploaded ${file.name}`, file.name);
});
$('config-clear').addEventListener('click', () => {
  $('config-text').value = '';
  state = { ...state, cfg: '', model: modelBeforeConfig || defaults.model };
  configSource = '';
  committed = true;
  writeForm(form, state);
  $('model').value = state.model;
  syncUrl();
  schedule(0);
});

/** A pasted or uploaded config.json replaces the model; the model field names it. */
function usePastedConfig(text, source, fileName = '') {
  if (!text.trim()) return;
  let config;
  try {
    config = JSON.parse(text);
  } catch (e) {
    setStatus(`That config.json is not valid JSON: ${e.message}. Check for a missing comma, quote or bracket.`, 'error');
    showError('The pasted config.json is not valid JSON (see the message under the model field).');
    return;
  }
  if (!config || typeof config !== 'object' || Array.isArray(config)) {
    setStatus('A config.json is a JSON object ({...}).', 'error');
    showError('The pasted config.json is not a JSON object ({...}).');
    return;
  }
  if (!state.cfg) modelBeforeConfig = state.model;
  const named = typeof config._name_or_path === 'string' && config._name_or_path.trim();
  configSource = source;
  state = { ...state, cfg: encodeConfig(config), sel: '', model: named || fileName || 'pasted config.json' };
  writeForm(form, state);
  $('model').value = state.model; // even while it has the focus
  syncUrl();
  schedule(150);
}

// A launch config (intake.js) sets the whole form; the GPU stays the page's unless the file names one.
setupIntake({ text: $('launch-text'), file: $('launch-file'), report: $('launch-report') }, {
  callIntake: (input) => core.call('intake', input),
  base: () => ({ gpu: state.gpu === 'custom' ? { memory_gib: state.mem } : { name: state.gpu } }),
  apply: (request) => {
    if (request.model?.id && state.cfg) configSource = '';
    state = stateFromRequest(request, state, defaults);
    committed = true;
    writeForm(form, state);
    $('model').value = state.model;
    syncVisibility();
    syncUrl();
    schedule(0);
  },
});

$('hf-token').addEventListener('change', () => {
  hub.setToken($('hf-token').value);
  schedule(0);
});

$('copy-link').addEventListener('click', async () => {
  syncUrl();
  try {
    await navigator.clipboard.writeText(fullUrl());
    toast('Link copied: it reopens this exact setup.');
  } catch {
    toast(`Copy this link: ${fullUrl()}`);
  }
});

function download(name, type, text) {
  const a = h('a', { href: URL.createObjectURL(new Blob([text], { type })), download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}
const slug = () => (lastModel?.name ?? 'model').replace(/\.json$/, '').replace(/[^\w.-]+/g, '_');
$('export-json').addEventListener('click', () => {
  if (!lastResult) return toast('Nothing to export yet.');
  const { request, plan, estimate, selected } = lastResult;
  download(`memfit-${slug()}.json`, 'application/json',
    `${JSON.stringify({ url: fullUrl(), request, selected, plan, estimate }, null, 2)}\n`);
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

// Embedded (an iframe, or the <memfit-calculator> element): tell the host page our height.
if (embed && window.parent !== window) {
  const post = () => window.parent.postMessage({ memfit: 'size', height: Math.ceil(document.documentElement.getBoundingClientRect().height) }, '*');
  new ResizeObserver(post).observe(document.documentElement);
}

// Phones: the wide tables show which side scrolls on.
for (const scroller of document.querySelectorAll('.scroll-frame > .scroll')) markScrollEdges(scroller);

// Phones: a pinned one-line answer while the results are out of view.
new IntersectionObserver(([e]) => document.body.classList.toggle('results-in-view', e.isIntersecting))
  .observe($('results'));

syncVisibility();
syncUrl();
await update();
