// The page state: one flat object of form values, its defaults (from the core's defaults()),
// the URL that carries it, and the request it means.

/** Field name → kind. The form's control names and the URL's keys are these names. */
export const FIELDS = {
  model: 'text', cfg: 'text', task: 'text', precision: 'text', quant: 'text', optimizer: 'text', seq: 'int',
  mbs: 'int?', gas: 'int', ckpt: 'bool', attn: 'text', rank: 'int', alpha: 'num', targets: 'text', adapter: 'text',
  ibatch: 'int', ictx: 'int', kv: 'text', gpu: 'text', mem: 'num', gpus: 'int', gpn: 'int', sel: 'text',
  lc: 'text', // a launch config's request and the form it gave (intake.js; base64url JSON)
};

const KV_BITS = { 16: 'bf16', 32: 'fp32', 8: 'fp8', 4: 'int4' };

/** The page's defaults are the core's (memfit defaults); micro-batch defaults to "largest that fits". */
export function defaultState(coreDefaults) {
  const r = coreDefaults.request;
  return {
    // precision and LoRA targets: the core's per-model, per-framework choice unless the user picks
    model: r.model.id ?? '', cfg: '', task: r.task, precision: 'auto', quant: r.quantization, optimizer: r.optimizer,
    seq: r.sequence_length, mbs: null, gas: r.gradient_accumulation_steps, ckpt: r.gradient_checkpointing, attn: r.attention,
    rank: r.lora.rank, alpha: r.lora.alpha, targets: '',
    adapter: r.lora.adapter_dtype, ibatch: r.inference.batch_size, ictx: r.inference.context_length,
    kv: KV_BITS[r.inference.kv_cache_bits] ?? 'bf16', gpu: r.gpu.name, mem: r.gpu.memory_gib, gpus: r.num_gpus,
    gpn: r.parallelism.gpus_per_node, sel: '', lc: '',
  };
}

function parseValue(kind, text) {
  if (kind === 'bool') return text === '1' || text === 'true' || text === 'on';
  if (kind === 'text') return text;
  if (kind === 'int?' && text === '') return null;
  const n = Number(text);
  return text === '' || !Number.isFinite(n) ? NaN : n;
}

const formatValue = (kind, v) => (kind === 'bool' ? (v ? '1' : '0') : v == null ? '' : String(v));

/** State from the page URL: query (embed links) then hash (shared links), over the defaults. */
export function stateFromUrl(url, defaults) {
  const s = { ...defaults };
  for (const params of [url.searchParams, new URLSearchParams(url.hash.slice(1))])
    for (const [k, v] of params) if (k in FIELDS) s[k] = parseValue(FIELDS[k], v);
  return s;
}

/** The hash that reproduces `s`: only what differs from the defaults. */
export function stateToHash(s, defaults) {
  const params = new URLSearchParams();
  for (const [k, kind] of Object.entries(FIELDS)) {
    const v = formatValue(kind, s[k]);
    if (v !== formatValue(kind, defaults[k]) || k === 'model') params.set(k, v);
  }
  return `#${params.toString()}`;
}

/** Reads the form controls named after FIELDS. */
export function readForm(form, s) {
  const out = { ...s };
  for (const [k, kind] of Object.entries(FIELDS)) {
    const el = form.elements.namedItem(k);
    if (!el) continue;
    out[k] = el.type === 'checkbox' ? el.checked : parseValue(kind, el.value.trim());
  }
  return out;
}

export function writeForm(form, s) {
  for (const [k, kind] of Object.entries(FIELDS)) {
    const el = form.elements.namedItem(k);
    if (!el) continue;
    if (el.type === 'checkbox') el.checked = !!s[k];
    else if (document.activeElement !== el) el.value = Number.isNaN(s[k]) ? '' : formatValue(kind, s[k]);
  }
}

/** base64url of a config's JSON (pasted configs travel in the URL). */
export const encodeConfig = (config) =>
  btoa(String.fromCharCode(...new TextEncoder().encode(JSON.stringify(config)))).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
export function decodeConfig(text) {
  const bin = atob(text.replace(/-/g, '+').replace(/_/g, '/'));
  return JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0))));
}

/**
 * The form for a launch config's request (the core's intake): what it gives, the page's
 * "automatic" or default value for what it leaves out, the GPUs as they were unless it names
 * them. `lc` keeps the request and this form, so that buildRequest sends the request itself
 * plus only what the user changes afterwards.
 */
export function stateFromRequest(r, s, defaults) {
  const l = r.lora ?? {};
  const targets = l.targets === 'all-linear' ? 'all-linear' : Array.isArray(l.targets) ? l.targets.join(',') : '';
  const form = {
    model: r.model?.id ?? s.model, cfg: r.model?.id ? '' : s.cfg, task: r.task ?? defaults.task, precision: r.precision ?? 'auto',
    quant: r.quantization ?? 'none', optimizer: r.optimizer ?? defaults.optimizer, seq: r.sequence_length ?? defaults.seq,
    mbs: r.micro_batch_size ?? null, gas: r.gradient_accumulation_steps ?? defaults.gas, ckpt: r.gradient_checkpointing ?? defaults.ckpt,
    attn: r.attention ?? defaults.attn, rank: l.rank ?? defaults.rank, alpha: l.alpha ?? defaults.alpha, targets,
    adapter: l.adapter_dtype ?? 'auto', gpus: r.num_gpus ?? s.gpus, gpn: r.parallelism?.gpus_per_node ?? s.gpn,
    gpu: r.gpu?.name ?? (r.gpu?.memory_gib ? 'custom' : s.gpu), mem: r.gpu?.memory_gib ?? s.mem,
    ibatch: r.inference?.batch_size ?? s.ibatch, ictx: r.inference?.context_length ?? s.ictx, kv: r.inference?.kv_cache_dtype ?? s.kv,
  };
  return { ...s, ...form, sel: '', lc: encodeConfig({ request: r, form }) };
}

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

/** Sets on `out` every leaf where `now` differs from `then` (the user's edits since). */
function overlayEdits(out, now = {}, then = {}) {
  for (const k of new Set([...Object.keys(now), ...Object.keys(then)])) {
    if (same(now[k], then[k])) continue;
    if (isObject(now[k]) && isObject(then[k])) overlayEdits((out[k] = isObject(out[k]) ? out[k] : {}), now[k], then[k]);
    else if (now[k] === undefined) delete out[k];
    else out[k] = now[k];
  }
}

/** The core request for state `s` and a model reference ({id} or {config, id?}). */
export function buildRequest(s, model) {
  const plain = formRequest(s, model);
  if (!s.lc) return plain;
  let launch;
  try {
    launch = decodeConfig(s.lc);
  } catch {
    return plain; // a damaged link: the form alone
  }
  const out = structuredClone(launch.request);
  overlayEdits(out, plain, formRequest({ ...s, ...launch.form }, model));
  out.model = model;
  return out;
}

function formRequest(s, model) {
  const r = {
    model, task: s.task, optimizer: s.optimizer, sequence_length: s.seq,
    gradient_accumulation_steps: s.gas, gradient_checkpointing: s.ckpt, attention: s.attn, num_gpus: s.gpus,
    gpu: s.gpu === 'custom' ? { memory_gib: s.mem } : { name: s.gpu }, parallelism: s.gpn ? { gpus_per_node: s.gpn } : {},
  };
  if (s.precision !== 'auto') r.precision = s.precision;
  if (s.quant && s.quant !== 'none') r.quantization = s.quant;
  if (s.mbs != null) r.micro_batch_size = s.mbs;
  if (s.task === 'lora' || s.task === 'qlora') {
    r.lora = { rank: s.rank, alpha: s.alpha, adapter_dtype: s.adapter };
    if (s.targets.trim() === 'all-linear') r.lora.targets = 'all-linear';
    else if (s.targets.trim()) r.lora.targets = s.targets.split(/[\s,]+/).filter(Boolean);
  }
  if (s.task === 'inference') {
    r.inference = { batch_size: s.ibatch, context_length: s.ictx, kv_cache_dtype: s.kv };
    // "tp" with no degree: the core takes the largest TP that divides the heads and the GPUs and
    // runs the rest as replicas (3 GPUs, 32 heads: 3 replicas), and says so in a note.
    if (s.gpus > 1) r.parallelism = { ...r.parallelism, method: 'tp' };
    delete r.gradient_accumulation_steps;
  }
  return r;
}
