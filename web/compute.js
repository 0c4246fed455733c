// One recomputation of the page: the plan over the cluster (training) and the estimate of the
// selected grid cell. Pure: runs the same in the worker and, as a fallback, on the main thread.

/** The estimate request for one layout of the plan at one micro-batch. */
export function cellRequest(request, candidate, microBatch) {
  return {
    ...request,
    micro_batch_size: microBatch,
    parallelism: {
      method: candidate.method, dp: candidate.dp, tp: candidate.tp, pp: candidate.pp,
      sequence_parallel: candidate.sequence_parallel, offload_optimizer: candidate.offload_optimizer,
      offload_params: candidate.offload_params, ...(request.parallelism?.gpus_per_node ? { gpus_per_node: request.parallelism.gpus_per_node } : {}),
    },
  };
}

/**
 * job: {request, selection: {label, mbs} | null, userMicroBatch: number | null}
 * returns {plan, estimate, selected: {label, mbs}, request (what `estimate` answered), ms}
 */
export function compute(api, job) {
  const t0 = performance.now();
  const { request } = job;
  if (request.task === 'inference') {
    const estimate = api.estimate(request);
    return { plan: null, estimate, selected: null, request, ms: performance.now() - t0 };
  }
  const plan = api.plan(request);
  const planMs = performance.now() - t0;
  const want = job.selection;
  // When nothing fits, the breakdown shown is the layout closest to fitting.
  const fallback = plan.recommendation ?? plan.candidates[plan.nothing_fits?.closest_index ?? 0];
  const candidate = plan.candidates.find((c) => c.label === want?.label) ?? fallback;
  if (!candidate) return { plan, estimate: null, selected: null, request, ms: planMs, planMs };
  const mbs = want?.label === candidate.label && want?.mbs ? want.mbs : job.userMicroBatch ?? Math.max(1, candidate.max_micro_batch);
  const cell = cellRequest(request, candidate, mbs);
  const estimate = api.estimate(cell);
  return { plan, estimate, selected: { label: candidate.label, mbs }, request: cell, ms: performance.now() - t0, planMs };
}
