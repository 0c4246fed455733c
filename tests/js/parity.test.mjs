// Bit-identical numbers natively and in wasm: every request below goes through the native CLI
// (`memfit estimate|plan - --json`, a pretty-printed dump of the core's JSON) and through the
// wasm module's raw text functions. The wasm text must equal the CLI's output with the
// indentation removed, byte for byte; errors must carry the same message.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { load, CLI } from './load.mjs';

let api;
before(async () => {
  assert.ok(existsSync(CLI), `native CLI not found at ${CLI}: build it with cmake --preset native && cmake --build --preset native`);
  ({ api } = await load());
});

/** JSON text with the whitespace between tokens removed (strings left alone). */
function minify(text) {
  let out = '';
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      out += c;
      if (c === '\\') out += text[++i];
      else if (c === '"') inString = false;
    } else if (c === '"') {
      inString = true;
      out += c;
    } else if (!' \n\r\t'.includes(c)) {
      out += c;
    }
  }
  return out;
}

function native(command, requestText) {
  const r = spawnSync(CLI, [command, '-', '--json'], { input: requestText, encoding: 'utf8' });
  if (r.status === 0) return { ok: true, text: r.stdout };
  assert.equal(r.status, 2, `CLI exit status ${r.status}: ${r.stderr}`);
  return { ok: false, message: r.stderr.replace(/^memfit: /, '').replace(/\n$/, '') };
}

const tiny = {
  model_type: 'llama', hidden_size: 256, intermediate_size: 688, num_hidden_layers: 4, num_attention_heads: 8,
  num_key_value_heads: 4, vocab_size: 1000, max_position_embeddings: 2048, tie_word_embeddings: true,
};

const id = (m) => ({ id: m });
const cases = [];
const add = (command, name, request) => cases.push({ command, name, request });

// task "serve" (issue 11): vLLM and SGLang accounting, and the serving planner (doubles included).
add('estimate', 'serve vllm llama-3.1-8b', { model: id('meta-llama/Llama-3.1-8B'), task: 'serve', gpu: { name: 'H100' },
  serving: { engine: 'vllm', max_model_len: 32768 } });
add('estimate', 'serve vllm 0.6.4 gemma-2 fp8 kv', { model: id('google/gemma-2-9b'), task: 'serve', gpu: { name: 'L40S-48GB' },
  serving: { engine: 'vllm', engine_version: '0.6.4', kv_cache_dtype: 'fp8', max_model_len: 8192, gpu_memory_utilization: 0.85 } });
add('estimate', 'serve sglang deepseek-v2-lite tp2', { model: id('deepseek-ai/DeepSeek-V2-Lite'), task: 'serve', gpu: { name: 'A100-80GB' },
  serving: { engine: 'sglang', tp_size: 2, context_length: 16384 } });
add('estimate', 'serve 70b does not fit (fixes)', { model: id('meta-llama/Llama-3.1-70B'), task: 'serve', gpu: { name: 'H100' },
  serving: { tensor_parallel_size: 2, max_model_len: 131072 } });
add('plan', 'serve plan 3 gpus', { model: id('Qwen/Qwen3-30B-A3B'), task: 'serve', cluster: { gpu: { name: 'H100' }, num_gpus: 3 },
  serving: { max_model_len: 32768 } });

// Tasks x precisions x models (single GPU).
const models = ['meta-llama/Llama-2-7b-hf', 'meta-llama/Llama-3.1-8B', 'Qwen/Qwen3-30B-A3B', 'deepseek-ai/DeepSeek-V2-Lite',
  'google/gemma-2-2b', 'openai-community/gpt2', 'tiiuae/falcon-7b', 'mistralai/Mixtral-8x7B-v0.1', 'microsoft/phi-2',
  'bigscience/bloom-560m', 'Qwen/Qwen2.5-0.5B', 'EleutherAI/pythia-1b'];
const precisions = ['fp32', 'amp_bf16', 'amp_fp16', 'bf16', 'fp16'];
models.forEach((m, i) => {
  add('estimate', `full ${m} ${precisions[i % 5]}`, { model: id(m), precision: precisions[i % 5], micro_batch_size: 1 + (i % 3),
    sequence_length: 512 * (1 + (i % 4)), gradient_checkpointing: i % 2 === 0,
    // auto: gemma-2 has no sdpa path; FlashAttention-2 refuses fp32 weights without autocast
    attention: ['eager', 'auto', precisions[i % 5] === 'fp32' ? 'eager' : 'flash_attention_2'][i % 3] });
});
add('estimate', 'lora all-linear', { model: id('meta-llama/Llama-3.1-8B'), task: 'lora', lora: { rank: 64, alpha: 16, targets: 'all-linear' }, precision: 'bf16' });
add('estimate', 'lora q,v fp32 adapters', { model: id('mistralai/Mistral-7B-v0.1'), task: 'lora', lora: { rank: 8, targets: ['q_proj', 'v_proj'], adapter_dtype: 'fp32' } });
add('estimate', 'qlora example', { model: id('meta-llama/Llama-2-7b-hf'), task: 'qlora', quantization: 'nf4_double', optimizer: 'paged_adamw_8bit',
  lora: { rank: 16, alpha: 32, targets: 'all-linear' }, precision: 'bf16', micro_batch_size: 1, gradient_checkpointing: true, gpu: { name: 'RTX4090-24GB' } });
add('estimate', 'qlora int8 MoE', { model: id('Qwen/Qwen3-30B-A3B'), task: 'qlora', quantization: 'int8' });
for (const opt of ['adamw_fused', 'adamw_loop', 'adamw_8bit', 'sgd', 'sgd_momentum', 'adafactor', 'lion'])
  add('estimate', `optimizer ${opt}`, { model: id('Qwen/Qwen2.5-1.5B'), optimizer: opt, sequence_length: 1024 });
for (const kv of ['bf16', 'fp8', 'int4'])
  add('estimate', `inference kv ${kv}`, { model: id('meta-llama/Llama-3.1-70B'), task: 'inference', precision: 'bf16',
    inference: { batch_size: 8, context_length: 8192, kv_cache_dtype: kv }, gpu: { name: 'H100-80GB' }, num_gpus: 4, parallelism: { method: 'tp', tp: 4 } });
add('estimate', 'inference gptq', { model: id('meta-llama/Llama-2-13b-hf'), task: 'inference', quantization: 'gptq_int4', inference: { batch_size: 4, context_length: 4096 } });
add('estimate', 'inference MLA expanded', { model: id('deepseek-ai/DeepSeek-V2-Lite'), task: 'inference', inference: { mla_cache: 'expanded', context_length: 16384 } });
// Parallel methods on 8 GPUs.
for (const method of ['ddp', 'zero1', 'zero2', 'zero3', 'fsdp_full_shard', 'fsdp_shard_grad_op', 'fsdp_hybrid'])
  add('estimate', `8 GPUs ${method}`, { model: id('meta-llama/Llama-2-13b-hf'), num_gpus: 8, parallelism: { method, gpus_per_node: 4 }, gpu: { name: 'A100-40GB' } });
add('estimate', 'tp 4 x dp 2 sp', { model: id('meta-llama/Llama-3.1-8B'), num_gpus: 8, parallelism: { method: 'tp', tp: 4, dp: 2, sequence_parallel: true } });
add('estimate', 'pp 4 x dp 2', { model: id('meta-llama/Llama-2-13b-hf'), num_gpus: 8, parallelism: { method: 'pp', pp: 4, dp: 2 } });
add('estimate', 'zero3 offload', { model: id('meta-llama/Llama-2-70b-hf'), num_gpus: 8, parallelism: { method: 'zero3', offload_optimizer: true, offload_params: true } });
add('estimate', 'custom GPU memory', { model: id('microsoft/phi-2'), gpu: { memory_gib: 12.5 } });
add('estimate', 'inline config', { model: { config: tiny }, micro_batch_size: 3, sequence_length: 300 });
add('estimate', 'cpu device', { model: { config: tiny }, device: 'cpu', precision: 'fp32' });
// Plans.
add('plan', 'plan 7B on 8 A100', { model: id('meta-llama/Llama-2-7b-hf'), num_gpus: 8 });
add('plan', 'plan 70B on 16 H100 x 2 nodes', { model: id('meta-llama/Llama-3.1-70B'), cluster: { gpu: { name: 'H100-80GB' }, num_gpus: 16, gpus_per_node: 8 } });
add('plan', 'plan qlora 1 GPU', { model: id('meta-llama/Llama-3.1-8B'), task: 'qlora', gpu: { name: 'RTX4090-24GB' } });
add('plan', 'plan lora MoE 4 GPUs', { model: id('mistralai/Mixtral-8x7B-v0.1'), task: 'lora', num_gpus: 4, gpu: { name: 'H100-80GB' }, gradient_checkpointing: true });
add('plan', 'error plan for inference', { model: id('Qwen/Qwen2.5-72B-Instruct'), task: 'inference', num_gpus: 8 });
add('plan', 'plan inline config 2 GPUs', { model: { config: tiny }, num_gpus: 2, gpu: { memory_gib: 1 } });
add('plan', 'plan nothing fits', { model: id('meta-llama/Llama-3.1-405B'), num_gpus: 2, gpu: { name: 'RTX4090-24GB' } });
// Errors.
add('estimate', 'error unknown model', { model: id('no/such-model') });
add('estimate', 'error bad task', { model: id('openai-community/gpt2'), task: 'pretrain' });
add('estimate', 'error unknown field', { model: id('openai-community/gpt2'), micro_batch: 4 });
add('estimate', 'error full + quantized', { model: id('openai-community/gpt2'), quantization: 'nf4' });
add('estimate', 'error unknown GPU', { model: id('openai-community/gpt2'), gpu: { name: 'TPUv9' } });
add('estimate', 'error sdpa for a model without it', { model: id('bigscience/bloom-560m'), attention: 'sdpa' });
add('estimate', 'error zero batch', { model: id('openai-community/gpt2'), micro_batch_size: 0 });
add('estimate', 'error config without sizes', { model: { config: { model_type: 'llama' } } });
add('estimate', 'error rejected: FlashAttention-2 over fp32 weights', { model: id('meta-llama/Llama-3.1-8B'), task: 'lora', precision: 'fp32',
  attention: 'flash_attention_2', gpu: { name: 'A100-80GB' } });
add('estimate', 'error rejected: Adafactor under FSDP2', { model: id('meta-llama/Llama-3.1-8B'), optimizer: 'adafactor', num_gpus: 8,
  parallelism: { method: 'fsdp_full_shard' } });
add('plan', 'error no model', { task: 'full' });
add('plan', 'error not JSON', '{"model": {"id": "openai-community/gpt2"},');
add('plan', 'error not an object', '[1, 2]');

test(`the spread has at least 30 requests (${cases.length})`, () => assert.ok(cases.length >= 30));

for (const c of cases) {
  test(`${c.command}: ${c.name}`, () => {
    const text = typeof c.request === 'string' ? c.request : JSON.stringify(c.request);
    const expected = native(c.command, text);
    const raw = (c.command === 'plan' ? api.raw.planJson : api.raw.estimateJson)(text);
    const got = JSON.parse(raw);
    if (!expected.ok) {
      // a run the framework rejects is marked as such (memfit::Rejected), the same message either way
      assert.deepEqual(got, /^error rejected/.test(c.name) ? { error: expected.message, rejected: true } : { error: expected.message });
      assert.match(c.name, /^error/, `unexpected error: ${expected.message}`);
      return;
    }
    assert.ok(!c.name.startsWith('error'), 'expected an error');
    assert.equal(raw, minify(expected.text).trimEnd(), 'wasm text differs from the CLI output');
    assert.deepEqual(got, JSON.parse(expected.text));
  });
}
