// The form's own checks, in the words of its labels: errors (the core would refuse the value)
// and warnings (valid but probably a typo), shown next to the control they are about. The
// core's messages name request fields; coreErrorField() puts them next to the right control.

/** Form field → its label, the request field it fills, and when a valid value is implausible. */
const FIELD_INFO = {
  seq: { label: 'Sequence length', request: 'sequence_length', whole: true, warnAbove: [1 << 20, 'longer than any model is trained on (1,048,576 tokens)'] },
  mbs: { label: 'Micro-batch', request: 'micro_batch_size', whole: true, optional: true, warnAbove: [4096, 'far above what fits on a GPU at any sequence length'] },
  gas: { label: 'Gradient accumulation', request: 'gradient_accumulation_steps', whole: true, warnAbove: [10000, 'one optimizer step would take that many forward and backward passes; typical values are 1 to 64'] },
  rank: { label: 'LoRA rank', request: 'lora.rank', whole: true, warnAbove: [4096, 'above the width of most layers; typical ranks are 8 to 256'] },
  alpha: { label: 'LoRA alpha', request: 'lora.alpha' },
  targets: { label: 'Target modules', request: 'lora.targets' },
  attn: { label: 'Attention', request: 'attention' },
  ibatch: { label: 'Batch size', request: 'inference.batch_size', whole: true, warnAbove: [100000, 'more concurrent sequences than any server batches'] },
  ictx: { label: 'Context (tokens)', request: 'inference.context_length', whole: true, warnAbove: [1 << 21, 'longer than any model\'s context window'] },
  mem: { label: 'Memory per GPU (GiB)', request: 'gpu.memory_gib', positive: true, warnAbove: [1024, 'more than any GPU has (the largest hold under 300 GiB)'] },
  gpus: { label: 'Number of GPUs', request: 'num_gpus', whole: true, warnAbove: [100000, 'more GPUs than the largest clusters hold (about 100,000)'] },
  gpn: { label: 'GPUs per node', request: 'parallelism.gpus_per_node', whole: true, warnAbove: [72, 'more than any server holds (NVL72 racks hold 72)'] },
};
const TASK_FIELDS = { seq: 'train', mbs: 'train', gas: 'train', rank: 'lora', alpha: 'lora', targets: 'lora', ibatch: 'inference', ictx: 'inference' };
const applies = (name, s) => {
  const scope = TASK_FIELDS[name];
  if (!scope) return name !== 'mem' || s.gpu === 'custom';
  if (scope === 'train') return s.task !== 'inference';
  if (scope === 'lora') return s.task === 'lora' || s.task === 'qlora';
  return s.task === 'inference';
};
const fmt = (n) => n.toLocaleString('en-US');

/** {field: {error} | {warning}} for the state's numeric fields. */
export function fieldProblems(s) {
  const out = {};
  for (const [name, info] of Object.entries(FIELD_INFO)) {
    if (!applies(name, s) || name === 'targets' || name === 'attn') continue;
    const v = s[name];
    if (v == null && info.optional) continue;
    if (v == null || Number.isNaN(v)) out[name] = { error: `${info.label}: enter a number.` };
    else if (info.whole && (!Number.isInteger(v) || v < 1)) out[name] = { error: `${info.label} must be a whole number of 1 or more (not ${v}).` };
    else if (info.positive && !(v > 0)) out[name] = { error: `${info.label} must be more than 0.` };
    else if (info.warnAbove && v > info.warnAbove[0]) out[name] = { warning: `${fmt(v)} is ${info.warnAbove[1]}: check for a typo.` };
  }
  return out;
}

/** The form field a core error is about, and the message in the form's words; null if none. */
export function coreErrorField(message) {
  const m = message.match(/request field "([\w.]+)"/);
  let entry = m && Object.entries(FIELD_INFO).find(([, info]) => info.request === m[1]);
  // a bare field name: "sequence_length 2048 exceeds the 1024 positions ..."
  const bare = (info) => new RegExp(`(^|[\\s"(])(${info.request.replace('.', '\\.')}|${info.request.split('.').pop()})\\b`, 'g');
  let named = false;
  if (!entry) {
    entry = Object.entries(FIELD_INFO).find(([, info]) => info.request.includes('_') && bare(info).test(message));
    named = !!entry;
  }
  if (!entry && /LoRA target/i.test(message)) entry = ['targets', FIELD_INFO.targets];
  // "FlashAttention-2 needs an Ampere or newer GPU ...: use attention "sdpa"": the Attention control
  if (!entry && /^FlashAttention-2 /.test(message)) {
    const sdpa = message.replace(/use attention "sdpa"/, 'set Attention to SDPA (or pick a newer GPU)')
      .replace(/use precision "amp_bf16" \(fp32 weights, bf16 autocast\) or "bf16", or attention "sdpa"/,
        'set Precision to bf16 mixed precision or bf16, or Attention to SDPA');
    return { name: 'attn', message: sdpa + (/[.)]$/.test(sdpa) ? '' : '.') };
  }
  if (!entry) return null;
  const [name, info] = entry;
  const text = message.replace(/request field "[\w.]+"/, info.label).replace(named ? bare(info) : /$^/, `$1${info.label.toLowerCase()}`)
    .replace(/; got null$/, ' (the field is empty)')
    .replace(/; got (.+)$/, ' (not $1)')
    .replace(/\b\d{5,}\b/g, (d) => fmt(Number(d)));
  return { name, message: text.charAt(0).toUpperCase() + text.slice(1) + (/[.)]$/.test(text) ? '' : '.') };
}

/** Marks each control (aria-invalid) and writes its message under it; clears the others. */
export function showFieldMessages(form, problems) {
  for (const el of form.querySelectorAll('.field-msg')) el.remove();
  for (const el of form.querySelectorAll('[aria-invalid], [aria-describedby^="msg-"]')) {
    el.removeAttribute('aria-invalid');
    el.removeAttribute('aria-errormessage');
    if (el.getAttribute('aria-describedby')?.startsWith('msg-')) el.removeAttribute('aria-describedby');
  }
  for (const [name, p] of Object.entries(problems)) {
    const control = form.elements.namedItem(name);
    if (!control) continue;
    const id = `msg-${name}`;
    const note = document.createElement('span');
    note.className = `field-msg ${p.error ? 'error' : 'warning'}`;
    note.id = id;
    note.textContent = p.error ?? p.warning;
    control.closest('label')?.append(note);
    if (p.error) {
      control.setAttribute('aria-invalid', 'true');
      control.setAttribute('aria-errormessage', id);
    }
    control.setAttribute('aria-describedby', id);
  }
}
