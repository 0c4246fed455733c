// Forgiving model search over the bundled library: "llama 3.1 8b", "Qwen2.5-7B", "mixtral" find
// their models whatever the case, spaces, hyphens or a missing org. Pure: the page and the
// tests call it with the library's id list.

const compact = (s) => s.toLowerCase().replace(/[\s_\-/]+/g, '');
const words = (s) => s.toLowerCase().split(/[\s_\-/]+/).filter(Boolean);

/**
 * Bundled ids matching `query`: {exact: id | null, matches: [id...]} where exact is the one
 * model the query names (an id, or a name without its org, ignoring case and separators) and
 * matches holds every id containing all the query's words, best first.
 */
export function searchModels(query, ids) {
  const q = (query ?? '').trim();
  if (!q) return { exact: null, matches: [] };
  const byId = ids.find((id) => id.toLowerCase() === q.toLowerCase());
  if (byId) return { exact: byId, matches: [byId] };
  const cq = compact(q);
  const named = ids.filter((id) => compact(id.split('/').pop()) === cq || compact(id) === cq);
  const ws = words(q);
  const matches = ids.filter((id) => ws.every((w) => id.toLowerCase().includes(w)))
    .sort((a, b) => a.length - b.length || a.localeCompare(b));
  if (named.length === 1) return { exact: named[0], matches: [named[0], ...matches.filter((m) => m !== named[0])] };
  // A full Hub id (org/name) names one repository: a bundled id that merely contains its words
  // (allenai/OLMo-2-1124-7B-Instruct for allenai/OLMo-2-1124-7B) is offered, never taken for it.
  const hubId = q.includes('/');
  return { exact: !hubId && matches.length === 1 ? matches[0] : null, matches };
}
