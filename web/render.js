// Results → DOM: the recommendation, the layouts × micro-batches grid, the selected cell's
// breakdown bar, and the Markdown export. Everything shown comes from the core's JSON.

const GiB = 2 ** 30;
export const gib = (bytes, digits = 1) => `${(bytes / GiB).toFixed(bytes / GiB >= 100 ? 0 : digits)} GiB`;
const num = (x) => Math.round(x).toLocaleString('en-US');
export const params = (n) => (n >= 1e9 ? `${(n / 1e9).toFixed(2)}B` : n >= 1e6 ? `${(n / 1e6).toFixed(1)}M` : num(n));
function bytesShort(b) {
  if (b >= GiB) return gib(b, 2);
  if (b >= 2 ** 20) return `${(b / 2 ** 20).toFixed(1)} MiB`;
  return `${(b / 1024).toFixed(1)} KiB`;
}

/** h('p', {class: 'x'}, 'text', child...) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'style') el.style.cssText = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  el.append(...children.flat().filter((c) => c != null && c !== false));
  return el;
}

/**
 * fits | tight (above 90% of the GPU) | oom (over the planner's budget: the capacity less the
 * headroom it keeps free), so that a cell never says "tight" where its row says it does not fit.
 */
export const fitClass = (device, capacity, budget = capacity) =>
  (device > budget ? 'oom' : device > 0.9 * capacity ? 'tight' : 'fit');
const FIT_WORDS = { fit: 'fits', tight: 'tight (over 90%)', oom: 'does not fit' };

const stat = (label, value, hint) => h('div', { class: 'stat' }, h('dt', {}, label), h('dd', {}, value), hint ? h('dd', { class: 'hint' }, hint) : null);

/** No layout fits: the closest one, by how much it misses, and the single changes that fit. */
function renderNothingFits(el, plan, where, warnings, onPatch) {
  const nf = plan.nothing_fits;
  const closest = nf && plan.candidates[nf.closest_index];
  const fixes = nf ? nf.suggestions.filter((s) => s.fits) : [];
  const short = nf ? nf.suggestions.filter((s) => !s.fits) : [];
  const item = (s) => h('li', {}, h('button', { type: 'button', class: 'link', 'data-patch': JSON.stringify(s.request_patch) }, sentence(s.text)),
    ` → ${s.layout}, ${gib(s.per_gpu_bytes)} per GPU`);
  el.replaceChildren(...[
    h('p', { class: 'kicker' }, `Training on ${where}`),
    h('p', { class: 'headline oom' }, 'Nothing fits',
      closest ? h('span', { class: 'sub' }, ` — closest: ${closest.label}, ${gib(closest.per_gpu.device_total_bytes)} per GPU`) : null),
    warnings,
    closest ? h('p', { class: 'why' }, `At micro-batch 1 it misses by ${gib(nf.missing_bytes)}: the planner allows ${gib(plan.budget_bytes)} per GPU ` +
      `(${gib(plan.gpu.memory_bytes)} less ${Math.round(100 * (1 - plan.budget_bytes / plan.gpu.memory_bytes))}% headroom). Its breakdown is below.`) : null,
    fixes.length ? h('p', { class: 'fix-head' }, 'Any one of these changes makes it fit (select one to apply it):') : null,
    fixes.length ? h('ul', { class: 'fixes' }, fixes.map(item)) : null,
    short.length ? h('p', { class: 'fix-head' }, fixes.length ? 'Not enough on their own:' : 'No single change makes it fit; on their own these come closest:') : null,
    short.length ? h('ul', { class: 'fixes short' }, short.map(item)) : null,
  ].filter(Boolean));
  el.onclick = (e) => {
    const b = e.target.closest('button[data-patch]');
    if (b && onPatch) onPatch(JSON.parse(b.dataset.patch));
  };
}
const sentence = (t) => t.charAt(0).toUpperCase() + t.slice(1);

/** What to weigh before trusting the answer (an approximate architecture, parts not counted, figures
 *  not measured), less what a form control already says (ctx.atControls). */
function warningList(estimate, ctx) {
  const shown = (estimate?.warnings ?? []).filter((w) => !(ctx.atControls ?? []).includes(w));
  return shown.length ? h('ul', { class: 'warnings', id: 'answer-warnings' }, shown.map((w) => h('li', {}, sentence(w)))) : null;
}

export function renderRecommendation(el, result, ctx, onPatch) {
  el.onclick = null;
  const { plan, estimate } = result;
  const where = `${ctx.gpus} × ${ctx.gpuLabel}`;
  if (!plan) {
    const pg = estimate.per_gpu;
    const inf = estimate.inference;
    const cls = fitClass(pg.device_total_bytes, pg.gpu_memory_bytes);
    el.replaceChildren(...[
      h('p', { class: 'kicker' }, `Serving on ${where}`),
      h('p', { class: `headline ${cls}` }, estimate.fits ? 'Fits' : 'Does not fit',
        h('span', { class: 'sub' }, ` — ${gib(pg.device_total_bytes)} of ${gib(pg.gpu_memory_bytes)} per GPU`)),
      warningList(estimate, ctx),
      h('dl', { class: 'stats' },
        stat('KV cache per token', bytesShort(inf.kv_cache_bytes_per_token), 'all layers, per GPU'),
        stat('KV cache', bytesShort(inf.kv_cache_bytes), `batch ${ctx.ibatch} × ${num(ctx.ictx)} tokens`),
        stat('Largest batch', inf.max_batch_at_context ? num(inf.max_batch_at_context) : 'none', `at ${num(ctx.ictx)} tokens of context`),
        stat('Longest context', inf.max_context_at_batch ? num(inf.max_context_at_batch) : 'none', `at batch ${ctx.ibatch}`)),
      // how the GPUs are split (tensor parallel, replicas) and the core's warnings, in sight
      estimate.notes.length ? h('ul', { class: 'notes', id: 'serving-notes' }, estimate.notes.map((n) => h('li', {}, n))) : null,
    ].filter(Boolean));
    return;
  }
  const r = plan.recommendation;
  if (!r) {
    renderNothingFits(el, plan, where, warningList(estimate, ctx), onPatch);
    return;
  }
  const pg = r.per_gpu;
  el.replaceChildren(...[
    h('p', { class: 'kicker' }, `Recommended for training on ${where}`),
    h('p', { class: 'headline fit', title: layoutWords(r) }, r.label, h('span', { class: 'sub' }, ` at micro-batch ${r.max_micro_batch}`)),
    warningList(estimate, ctx),
    h('dl', { class: 'stats' },
      stat('Throughput', `${num(r.tokens_per_s)} tokens/s`, `${r.step_time_s.toFixed(2)} s per step, MFU ${Math.round(plan.assumed_mfu * 100)}% assumed`),
      stat('Per GPU', gib(pg.device_total_bytes), `of ${gib(pg.gpu_memory_bytes)} (nvidia-smi)`),
      stat('Headroom', gib(pg.gpu_memory_bytes - pg.device_total_bytes), `${Math.round((1 - pg.utilization) * 100)}% free`),
      r.cpu_ram_bytes ? stat('CPU RAM', gib(r.cpu_ram_bytes), 'for offloaded states') : null),
    h('p', { class: 'why' }, plan.recommendation_text),
  ].filter(Boolean));
}

/** Columns worth showing: up to the first micro-batch where every layout is out of memory. */
function gridColumns(plan) {
  const cap = plan.budget_bytes ?? plan.gpu.memory_bytes;
  let last = plan.grid_batches.findIndex((_, i) => plan.candidates.every((c) => c.grid_device_bytes[i] > cap));
  if (last < 0) last = plan.grid_batches.length - 1;
  return plan.grid_batches.map((b, i) => ({ b, i })).slice(0, Math.min(plan.grid_batches.length, Math.max(last + 1, 4)));
}

export function renderGrid(table, plan, selected, onSelect) {
  const cap = plan.gpu.memory_bytes;
  const budget = plan.budget_bytes ?? cap;
  const cols = gridColumns(plan);
  const head = h('tr', {}, h('th', { scope: 'col', class: 'layout' }, 'Layout'),
    cols.map(({ b }) => h('th', { scope: 'col' }, `${b}`)), h('th', { scope: 'col' }, 'Max'), h('th', { scope: 'col' }, 'Tokens/s'));
  const rows = plan.candidates.map((c, r) => h('tr', selected && selected.label === c.label ? { class: 'has-selected' } : {},
    h('th', { scope: 'row', class: 'layout', title: layoutWords(c), 'data-label': c.label }, layoutName(c.label)),
    cols.map(({ b, i }) => {
      const bytes = c.grid_device_bytes[i];
      const cls = fitClass(bytes, cap, budget);
      const isSel = selected && selected.label === c.label && selected.mbs === b;
      return h('td', {
        class: `cell ${cls}${isSel ? ' selected' : ''}`, role: 'gridcell', tabindex: '-1', 'aria-selected': isSel ? 'true' : 'false',
        'data-label': c.label, 'data-mbs': String(b), 'data-row': String(r), 'data-col': String(cols.findIndex((x) => x.b === b)),
        'aria-label': `${c.label}, micro-batch ${b}: ${gib(bytes)} per GPU, ${FIT_WORDS[cls]}`,
      }, (bytes / GiB).toFixed(bytes / GiB >= 100 ? 0 : 1));
    }),
    // the selected micro-batch between two columns (6 between 4 and 8): its row's Max cell carries the mark
    h('td', selected && selected.label === c.label && selected.mbs === c.max_micro_batch && !cols.some(({ b }) => b === selected.mbs)
      ? { class: 'num selected max', title: `micro-batch ${selected.mbs}: the largest that fits, between the grid's columns` }
      : { class: 'num' }, c.max_micro_batch ? String(c.max_micro_batch) : '–'),
    h('td', { class: 'num' }, c.fits ? num(c.tokens_per_s) : '–')));
  // The embed shows the first 6 rows and the selected layout's (style.css): say how many more the
  // full calculator has.
  const selectedBelow = plan.candidates.findIndex((c) => selected && selected.label === c.label) >= 6 ? 1 : 0;
  const hidden = rows.length - 6 - selectedBelow;
  const more = hidden > 0 ? h('tfoot', { class: 'more' }, h('tr', {}, h('td', { colspan: String(cols.length + 3) },
    `+ ${hidden} more layouts in the full calculator (Open in memfit ↗)`))) : null;
  table.replaceChildren(...[h('caption', { class: 'visually-hidden' }, 'GiB per GPU for each layout (rows) and micro-batch (columns)'),
    h('thead', {}, head), h('tbody', {}, rows), more].filter(Boolean));
  const cells = [...table.querySelectorAll('td.cell')];
  const focusable = cells.find((c) => c.classList.contains('selected')) ?? cells[0];
  if (focusable) focusable.tabIndex = 0;
  table.onclick = (e) => {
    const td = e.target.closest('td.cell');
    if (td) onSelect({ label: td.dataset.label, mbs: Number(td.dataset.mbs) }, true);
  };
  table.onkeydown = (e) => {
    const td = e.target.closest('td.cell');
    if (!td) return;
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    if (e.key === 'Enter' || e.key === ' ') {
      e.preventDefault();
      onSelect({ label: td.dataset.label, mbs: Number(td.dataset.mbs) }, true);
    } else if (moves[e.key]) {
      e.preventDefault();
      const [dr, dc] = moves[e.key];
      const next = table.querySelector(`td.cell[data-row="${+td.dataset.row + dr}"][data-col="${+td.dataset.col + dc}"]`);
      if (next) {
        td.tabIndex = -1;
        next.tabIndex = 0;
        next.focus();
      }
    }
  };
}

/** What each sharding method keeps whole and what it splits, for the layout tooltips (in words, not identifiers). */
const METHOD_WORDS = {
  single: 'one GPU holds the weights, gradients and optimizer states',
  ddp: 'PyTorch DDP: every GPU holds a full copy of the weights, gradients and optimizer states',
  zero1: 'DeepSpeed ZeRO-1: optimizer states sharded',
  zero2: 'DeepSpeed ZeRO-2: optimizer states and gradients sharded',
  zero3: 'DeepSpeed ZeRO-3: weights, gradients and optimizer states sharded',
  fsdp_full_shard: 'PyTorch FSDP FULL_SHARD: weights, gradients and optimizer states sharded (as ZeRO-3)',
  fsdp_shard_grad_op: 'PyTorch FSDP SHARD_GRAD_OP: gradients and optimizer states sharded (as ZeRO-2)',
};

/** A layout in words: "zero2 + cpu optimizer offload: DeepSpeed ZeRO-2: ... over 8 GPUs; optimizer states in CPU RAM". */
export function layoutWords(c) {
  const parts = [];
  const method = METHOD_WORDS[c.method];
  if (method) parts.push(c.method === 'single' || c.method === 'ddp' || c.dp <= 1 ? method : `${method} over ${c.dp} data-parallel GPUs`);
  if (c.tp > 1) parts.push(`tensor parallel over ${c.tp} GPUs (each layer's matrices split)`);
  if (c.pp > 1) parts.push(`pipeline parallel over ${c.pp} GPUs (the layers split into stages)`);
  if (!method && c.dp > 1) parts.push(`${c.dp} data-parallel replicas`);
  if (c.offload_optimizer) parts.push('optimizer states in CPU RAM');
  if (c.offload_params) parts.push('weights in CPU RAM');
  return parts.length ? `${c.label}: ${parts.join('; ')}` : c.label;
}

/** Layout names that wrap between words but never inside a degree ("tp 2" stays whole). */
const layoutName = (label) => label.replace(/\b(tp|dp|pp) (\d+)/g, '$1\u00a0$2');

const COLORS = {
  weights: '--c1', master_weights: '--c2', gradients: '--c3', optimizer_states: '--c4', paged_optimizer_states: '--c4',
  activations: '--c5', logits_loss: '--c6', kv_cache: '--c5', optimizer_step: '--c7', cublas_workspace: '--c8',
  allocator_overhead: '--c9', allocator_whole_blocks: '--c9', cuda_context: '--c10',
};
const FALLBACK = ['--c11', '--c12', '--c7', '--c2', '--c3', '--c8'];
const colorOf = (name, i) => `var(${COLORS[name] ?? FALLBACK[i % FALLBACK.length]})`;
const pretty = (name) => name.replace(/_/g, ' ');

export function renderDetail(el, result, ctx) {
  const { estimate, selected } = result;
  if (!estimate) {
    el.replaceChildren();
    el.hidden = true;
    return;
  }
  el.hidden = false;
  const pg = estimate.per_gpu;
  const cap = pg.gpu_memory_bytes;
  const scale = Math.max(cap, pg.device_total_bytes) * 1.02;
  const pct = (b) => `${((100 * b) / scale).toFixed(3)}%`;
  const parts = pg.breakdown.filter((c) => c.bytes > 0);
  const title = selected ? `${selected.label} · micro-batch ${selected.mbs} · per GPU` : `Per GPU (${ctx.gpus > 1 ? `of ${ctx.gpus}` : 'one GPU'})`;
  const cls = fitClass(pg.device_total_bytes, cap, result.plan?.budget_bytes ?? cap);
  el.replaceChildren(...[
    h('h3', { id: 'detail-title' }, title),
    h('dl', { class: 'stats figures' },
      stat('Allocated', gib(pg.allocated_peak_bytes), 'torch.cuda.max_memory_allocated'),
      stat('Reserved', gib(pg.reserved_peak_bytes), 'torch.cuda.max_memory_reserved'),
      stat('nvidia-smi', gib(pg.device_total_bytes), `${Math.round(pg.utilization * 100)}% of ${gib(cap)} · ${FIT_WORDS[cls]}`),
      estimate.cpu_ram_bytes ? stat('CPU RAM', gib(estimate.cpu_ram_bytes), 'for offloaded states') : null),
    h('div', { class: 'bar', role: 'img', 'aria-label': `Breakdown: ${parts.map((c) => `${pretty(c.name)} ${gib(c.bytes)}`).join(', ')}; GPU capacity ${gib(cap)}` },
      parts.map((c, i) => h('span', { class: 'seg', style: `width:${pct(c.bytes)};background:${colorOf(c.name, i)}`, title: `${pretty(c.name)}: ${gib(c.bytes)}` })),
      h('span', { class: 'cap', style: `left:${pct(cap)}` }, h('span', {}, `GPU ${gib(cap)}`)),
      h('span', { class: 'mark', style: `left:${pct(pg.reserved_peak_bytes)}`, title: 'reserved' })),
    h('table', { class: 'legend' },
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Component'), h('th', { scope: 'col', class: 'num' }, 'GiB'),
        h('th', { scope: 'col', class: 'formula' }, 'How it is counted'))),
      h('tbody', {}, parts.map((c, i) => h('tr', {},
        h('td', {}, h('span', { class: 'swatch', style: `background:${colorOf(c.name, i)}`, 'aria-hidden': 'true' }), pretty(c.name)),
        h('td', { class: 'num' }, (c.bytes / GiB).toFixed(2)),
        h('td', { class: 'formula' }, c.formula))))),
    h('p', { class: 'phase' }, `Peak during ${estimate.peak_phase}${pg.allocated_method ? ` (allocated figure: ${pg.allocated_method})` : ''}. `,
      estimate.phases.map((p) => `${p.phase} ${gib(p.allocated_bytes)}`).join(' · ')),
    // a serving answer lists its notes beside the answer already
    estimate.notes.length && !estimate.inference ? h('ul', { class: 'notes' }, estimate.notes.map((n) => h('li', {}, n))) : null,
  ].filter(Boolean));
}

export function toMarkdown(result, ctx) {
  const { plan, estimate, selected } = result;
  const req = ctx.request;
  const shape = req.task === 'inference'
    ? `batch ${num(req.inference.batch_size)} × context ${num(req.inference.context_length)} tokens`
    : `sequence length ${num(req.sequence_length)}`;
  const lines = [`# memfit: ${ctx.modelName} on ${ctx.gpus} × ${ctx.gpuLabel}`, '',
    `Task ${req.task}, precision ${req.precision}, ${shape}` + (req.quantization ? `, quantization ${req.quantization}` : '') + '.', '',
    ...(estimate?.warnings ?? []).flatMap((w) => [`> **Warning:** ${w}`, ''])];
  if (plan) {
    lines.push(plan.recommendation ? `**Recommendation:** ${plan.recommendation_text}` : `**Nothing fits:** ${plan.recommendation_text}.`, '',
      '| Layout | Max micro-batch | GiB per GPU | Tokens/s | CPU RAM GiB |', '|---|---:|---:|---:|---:|',
      ...plan.candidates.map((c) => `| ${c.label} | ${c.max_micro_batch || 'OOM'} | ${(c.per_gpu.device_total_bytes / GiB).toFixed(1)} | ` +
        `${c.fits ? num(c.tokens_per_s) : '–'} | ${c.cpu_ram_bytes ? (c.cpu_ram_bytes / GiB).toFixed(1) : ''} |`), '');
  }
  if (estimate) {
    const pg = estimate.per_gpu;
    lines.push(`## ${selected ? `${selected.label}, micro-batch ${selected.mbs}` : 'Estimate'} (per GPU)`, '',
      `Allocated ${gib(pg.allocated_peak_bytes)} · reserved ${gib(pg.reserved_peak_bytes)} · nvidia-smi ${gib(pg.device_total_bytes)} of ${gib(pg.gpu_memory_bytes)}` +
      (estimate.cpu_ram_bytes ? ` · CPU RAM ${gib(estimate.cpu_ram_bytes)}` : ''), '');
    if (estimate.inference) {
      const inf = estimate.inference;
      lines.push(`KV cache: ${bytesShort(inf.kv_cache_bytes_per_token)} per token. ` +
        `Largest batch at ${num(req.inference.context_length)} tokens of context: ${inf.max_batch_at_context ? num(inf.max_batch_at_context) : 'none fits'}. ` +
        `Longest context at batch ${num(req.inference.batch_size)}: ${inf.max_context_at_batch ? `${num(inf.max_context_at_batch)} tokens` : 'none fits'}.`, '');
    }
    lines.push('| Component | GiB |', '|---|---:|', ...pg.breakdown.map((c) => `| ${pretty(c.name)} | ${(c.bytes / GiB).toFixed(2)} |`), '');
  }
  lines.push(`[Open in memfit](${ctx.url})`, '');
  return lines.join('\n');
}
