// Reading models from the Hugging Face Hub in the browser: config.json, the safetensors metadata
// (exact stored parameter count and dtypes), pre-quantized checkpoints. The optional token lives
// in sessionStorage (this tab only) and is sent to https://huggingface.co and nowhere else.

export const HUB = 'https://huggingface.co';
const TOKEN_KEY = 'memfit.hfToken';

/** "org/name", a huggingface.co URL (any page of the model), or null. */
export function parseModelId(text) {
  let s = (text ?? '').trim();
  const url = s.match(/^(?:https?:\/\/)?(?:www\.)?(?:huggingface\.co|hf\.co)\/(.*)$/i);
  if (url) s = url[1].replace(/^models\//, '').split(/[?#]/)[0].split('/').slice(0, 2).join('/');
  return /^[A-Za-z0-9][\w.-]{0,95}\/[A-Za-z0-9][\w.-]{0,95}$/.test(s) ? s : null;
}

// Browsers deny storage to a cross-site iframe (third-party storage blocking): then even reading
// `sessionStorage` throws. The token is then kept in memory for the life of the page.
let memoryToken = '';
function storage() {
  try {
    return window.sessionStorage;
  } catch {
    return null;
  }
}
export function getToken() {
  try {
    return storage()?.getItem(TOKEN_KEY) ?? memoryToken;
  } catch {
    return memoryToken;
  }
}
export function setToken(token) {
  memoryToken = (token ?? '').trim();
  try {
    if (memoryToken) storage()?.setItem(TOKEN_KEY, memoryToken);
    else storage()?.removeItem(TOKEN_KEY);
  } catch {
    // storage denied: the in-memory copy is all there is
  }
}

/** A Hub failure with a message that says what to do. kind: gated | missing | network | invalid | http */
export class HubError extends Error {
  constructor(kind, message) {
    super(message);
    this.name = 'HubError';
    this.kind = kind;
  }
}

async function hubFetch(path, id) {
  const url = `${HUB}/${path}`;
  const headers = {};
  const token = getToken();
  if (token && url.startsWith(`${HUB}/`)) headers.Authorization = `Bearer ${token}`;
  let response;
  try {
    response = await fetch(url, { headers });
  } catch {
    throw new HubError('network', `Could not reach huggingface.co (offline, blocked or down). ` +
      `Pick a bundled model from the list, or paste or upload the model's config.json below.`);
  }
  if (response.status === 401 || response.status === 403) {
    throw new HubError('gated', token
      ? `${id} is gated or private and your token was refused (HTTP ${response.status}). Accept the licence on ` +
        `huggingface.co/${id} with the account of this token, and check the token has read access.`
      : `${id} is gated or private (HTTP ${response.status}). Accept its licence on huggingface.co/${id}, ` +
        `then paste a Hub access token (read) in "Hub token" below; it stays in this browser tab.`);
  }
  if (response.status === 404) {
    throw new HubError('missing', `No config.json for "${id}" on the Hub (HTTP 404). Check the spelling (org/name), ` +
      `or paste the config.json below.`);
  }
  if (!response.ok) throw new HubError('http', `The Hub answered HTTP ${response.status} for ${id}. Try again, or paste the config.json.`);
  return response;
}

const cache = new Map();

/** {config, info} for a Hub id; info (safetensors metadata) is null when unavailable. Cached per id. */
export function fetchModel(id) {
  const key = `${id}\n${getToken()}`;
  if (!cache.has(key)) {
    const job = (async () => {
      const [configResponse, info] = await Promise.all([
        hubFetch(`${id}/resolve/main/config.json`, id),
        hubFetch(`api/models/${id}`, id).then((r) => r.json()).catch(() => null),
      ]);
      let config;
      try {
        config = JSON.parse(await configResponse.text());
      } catch {
        throw new HubError('invalid', `The Hub's config.json for ${id} is not valid JSON.`);
      }
      if (!config || typeof config !== 'object' || Array.isArray(config))
        throw new HubError('invalid', `The Hub's config.json for ${id} is not a JSON object.`);
      return { config, info };
    })();
    job.catch(() => cache.delete(key));
    cache.set(key, job);
  }
  return cache.get(key);
}

/** Hub model ids for a search (api/models?search=), most downloaded first; [] when none. */
export async function searchModels(query) {
  const response = await hubFetch(`api/models?search=${encodeURIComponent(query)}&sort=downloads&direction=-1&limit=8`, query);
  const list = await response.json();
  return Array.isArray(list) ? list.map((m) => m.id ?? m.modelId).filter((id) => typeof id === 'string' && parseModelId(id) === id) : [];
}

/** Safetensors metadata → {total, dtypes: [[dtype, count]...]} or null. */
export function storedParams(info) {
  const st = info?.safetensors;
  if (!st || typeof st.total !== 'number') return null;
  const dtypes = Object.entries(st.parameters ?? {}).sort((a, b) => b[1] - a[1]);
  return { total: st.total, dtypes };
}

/**
 * The memfit quantization a pre-quantized checkpoint implies, from config.json's
 * quantization_config: {quantization, label} or {quantization: null, label} when memfit
 * does not model the scheme, or null for an ordinary checkpoint.
 */
export function detectQuantization(config) {
  const q = config?.quantization_config;
  if (!q || typeof q !== 'object') return null;
  const method = String(q.quant_method ?? (q.load_in_4bit || q.load_in_8bit ? 'bitsandbytes' : '')).toLowerCase();
  const bits = Number(q.bits ?? q.w_bit ?? 0);
  if (method === 'gptq' && bits === 4) return { quantization: 'gptq_int4', label: 'GPTQ 4-bit' };
  if (method === 'awq' && (bits === 4 || !bits)) return { quantization: 'awq_int4', label: 'AWQ 4-bit' };
  if (method === 'fp8') return { quantization: 'fp8', label: 'FP8' };
  if (method === 'bitsandbytes' || method.startsWith('bitsandbytes')) {
    if (q.load_in_4bit || method.endsWith('4bit'))
      return q.bnb_4bit_use_double_quant
        ? { quantization: 'nf4_double', label: 'bitsandbytes 4-bit (double quant)' }
        : { quantization: 'nf4', label: 'bitsandbytes 4-bit' };
    if (q.load_in_8bit || method.endsWith('8bit')) return { quantization: 'int8', label: 'bitsandbytes 8-bit' };
  }
  return { quantization: null, label: `${method || 'unknown'}${bits ? ` ${bits}-bit` : ''}` };
}
