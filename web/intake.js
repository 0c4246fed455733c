// The launch-config box (issue 8): a pasted or uploaded Axolotl / LLaMA-Factory / torchtune /
// LitGPT YAML, TrainingArguments JSON or CLI flags, DeepSpeed JSON or accelerate config ->
// the core's intake (the same input `memfit intake FILE` builds in cli/launch_config.cpp) ->
// the form, with where each field came from. YAML is parsed by the `yaml` package (vendor/yaml,
// loaded on first use), which keeps every node's source offset for the line numbers.
import { h } from './render.js';

/**
 * A plain YAML scalar as the CLI reads it (cli/launch_config.cpp `scalar`): YAML 1.2 core
 * booleans and null, then a whole-string integer (strtoll), then a whole-string number (strtod).
 */
export function scalarValue(s) {
  if (['true', 'True', 'TRUE'].includes(s)) return true;
  if (['false', 'False', 'FALSE'].includes(s)) return false;
  if (['', '~', 'null', 'Null', 'NULL'].includes(s)) return null;
  if (/^[+-]?\d+$/.test(s)) return Number(s);
  if (/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(s) || /^[+-]?0[xX][0-9a-fA-F]+$/.test(s)) return Number(s.replace(/^\+/, ''));
  if (/^[+-]?(inf|infinity|nan)$/i.test(s)) return null; // a non-finite double: JSON null, as the CLI's dump
  return s;
}

/** The YAML tree as JSON; `lines` gets every mapping key's dotted path -> 1-based line. */
function convert(node, path, lines, doc, lineCounter, YAML) {
  if (YAML.isAlias(node)) return convert(node.resolve(doc), path, lines, doc, lineCounter, YAML);
  if (YAML.isMap(node)) {
    const obj = {};
    for (const pair of node.items) {
      const key = String(YAML.isScalar(pair.key) ? pair.key.value : pair.key);
      const sub = path ? `${path}.${key}` : key;
      if (pair.key?.range) lines[sub] = lineCounter.linePos(pair.key.range[0]).line;
      obj[key] = convert(pair.value, sub, lines, doc, lineCounter, YAML);
    }
    return obj;
  }
  if (YAML.isSeq(node)) return node.items.map((item) => convert(item, path, lines, doc, lineCounter, YAML));
  if (YAML.isScalar(node)) return node.type === 'PLAIN' ? scalarValue(String(node.value ?? '')) : String(node.value);
  return null;
}

/** `--key value`, `--key=value` and bare `--flag` (true), line by line (parse_flags). */
function parseFlags(text, lines) {
  const obj = {};
  let pending = '';
  text.split('\n').forEach((lineText, i) => {
    for (const w of lineText.split(/[ \t\n\v\f\r]+/).filter(Boolean)) {
      if (w === '\\') continue;
      if (w.startsWith('--')) {
        if (pending) obj[pending] = true;
        pending = '';
        const body = w.slice(2);
        const eq = body.indexOf('=');
        if (eq >= 0) {
          obj[body.slice(0, eq)] = scalarValue(body.slice(eq + 1));
          lines[body.slice(0, eq)] = i + 1;
        } else {
          pending = body;
          lines[pending] = i + 1;
        }
      } else if (pending) {
        obj[pending] = scalarValue(w);
        pending = '';
      }
    }
  });
  if (pending) obj[pending] = true;
  return obj;
}

/** Launch-config text -> {config, lines}, exactly as read_launch_config; throws with the reason. */
export function readLaunchConfig(text, YAML) {
  const lines = {};
  const flags = text.includes('--');
  try {
    const lineCounter = new YAML.LineCounter();
    const docs = YAML.parseAllDocuments(text, { lineCounter, schema: 'failsafe', uniqueKeys: false });
    const doc = Array.isArray(docs) ? docs[0] : null;
    if (doc?.errors.length) throw doc.errors[0];
    if (doc && YAML.isMap(doc.contents)) return { config: convert(doc.contents, '', lines, doc, lineCounter, YAML), lines };
  } catch (e) {
    if (!flags) throw new Error(`not valid YAML or JSON: ${e.message}`);
  }
  if (flags) return { config: parseFlags(text, lines), lines };
  throw new Error('the file is neither a YAML/JSON mapping nor a command line of --flag value pairs');
}

const FORMATS = { axolotl: 'Axolotl', llamafactory: 'LLaMA-Factory', torchtune: 'torchtune', litgpt: 'LitGPT',
  training_args: 'TrainingArguments', deepspeed: 'DeepSpeed', accelerate: 'accelerate' };

/** Where each request field came from, what was defaulted and ignored, and the core's notes. */
function renderReport(el, result, name) {
  const rows = Object.entries(result.sources).map(([field, src]) => h('tr', {},
    h('th', { scope: 'row' }, field),
    h('td', {}, src.key ? h('code', {}, src.key) : `(${src.default})`, src.line ? ` · line ${src.line}` : '')));
  el.replaceChildren(
    h('p', { class: 'ok' }, `${name} read as ${FORMATS[result.format] ?? result.format}: the form below now holds its setup.`),
    h('table', { class: 'sources' }, h('thead', {}, h('tr', {}, h('th', {}, 'Request field'), h('th', {}, 'From the file'))),
      h('tbody', {}, rows)),
    ...(result.defaulted.length ? [h('p', { class: 'hint' }, `Not in the file, so memfit's or the framework's default: ${result.defaulted.join(', ')}.`)] : []),
    ...(result.ignored?.length ? [h('p', { class: 'hint' }, `Ignored (no effect on memory): ${result.ignored.join(', ')}.`)] : []),
    ...(result.notes ?? []).map((n) => h('p', { class: 'hint' }, n)));
}

/**
 * Wires the box. callIntake(input) runs the core's intake; base() is the request so far that a
 * file may lack (the GPU); apply(request) puts the result on the form.
 */
export function setupIntake({ text, file, report }, { callIntake, base, apply }) {
  let yaml;
  async function read(source, name) {
    if (!source.trim()) return report.replaceChildren();
    try {
      yaml ??= import('./vendor/yaml/index.js');
      const input = { ...readLaunchConfig(source, await yaml), format: 'auto', base: base() };
      const result = await callIntake(input);
      const defaulted = result.defaulted.filter((f) => !(f in result.sources)); // as `memfit intake` prints it
      renderReport(report, { ...result, defaulted }, name);
      apply(result.request);
    } catch (e) {
      report.replaceChildren(h('p', { class: 'error', role: 'alert' }, `That launch config could not be read: ${e.message}`));
    }
  }
  let timer = 0;
  text.addEventListener('input', () => {
    clearTimeout(timer);
    timer = setTimeout(() => read(text.value, 'The pasted config'), 300);
  });
  file.addEventListener('change', async () => {
    const f = file.files?.[0];
    if (!f) return;
    text.value = await f.text();
    read(text.value, f.name);
  });
}
