"""python -m memfit: the CLI's commands over the same core (cli/main.cpp, cli/report.cpp).

    python -m memfit estimate REQUEST.json [--json]
    python -m memfit plan REQUEST.json [--json]
    python -m memfit models | gpus | defaults
    python -m memfit inspect CONFIG.json
REQUEST.json may be - for standard input. Errors: exit 2 and one line on stderr.
"""
import json
import sys

from . import _core

_BAD_INPUT, _USAGE = 2, 64
_GIB = 1073741824.0


def _count(n):
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:.0f}"


def print_estimate(e):
    for w in e.get("warnings", []):  # first, as the CLI prints them (cli/report.cpp)
        print(f"warning: {w}")
    m, g, req = e["model"], e["per_gpu"], e["request"]
    print(f"{m.get('id', 'inline config')} ({m['model_type']}): {_count(e['params']['total'])} parameters, "
          f"{_count(e['params']['trainable'])} trainable")
    if req["task"] == "inference":
        inf = req["inference"]
        print(f"task inference, {req['precision']}, {req['quantization']} weights, batch {inf['batch_size']} x context "
              f"{inf['context_length']}, on {req['gpu']['name']} ({g['gpu_memory_bytes'] / _GIB:.1f} GiB)\n")
    else:
        print(f"task {req['task']}, {req['precision']}, micro-batch {req['micro_batch_size']} x sequence "
              f"{req['sequence_length']}, on {req['gpu']['name']} ({g['gpu_memory_bytes'] / _GIB:.1f} GiB)\n")
    total = g["device_total_bytes"]
    print("  %-26s %10s %7s" % ("component", "GiB", "share"))
    for c in g["breakdown"]:
        print("  %-26s %10.2f %6.1f%%" % (c["name"], c["bytes"] / _GIB, 100.0 * c["bytes"] / total if total > 0 else 0.0))
    print("\n  %-26s %10.2f   torch.cuda.max_memory_allocated (%s)" % ("peak allocated", g["allocated_peak_bytes"] / _GIB,
                                                                        g.get("allocated_method", "engine")))
    print("  %-26s %10.2f   torch.cuda.max_memory_reserved (%s)" % ("peak reserved", g["reserved_peak_bytes"] / _GIB,
                                                                     g.get("reserved_method", "approximate rule")))
    print("  %-26s %10.2f   nvidia-smi" % ("device total", g["device_total_bytes"] / _GIB))
    print("\npeak during: %s. %s (%.1f%% of the GPU)." % (e["peak_phase"], "FITS" if e["fits"] else "DOES NOT FIT",
                                                        100.0 * g["utilization"]))
    if "inference" in e:
        inf = e["inference"]
        print("KV cache: %.3f MiB per token; largest batch at this context: %s; longest context at this batch: %s" % (
            inf["kv_cache_bytes_per_token"] / 1048576.0, json.dumps(inf["max_batch_at_context"]),
            json.dumps(inf["max_context_at_batch"])))
    if e["cpu_ram_bytes"] > 0:
        print("CPU RAM for offload: %.1f GiB" % (e["cpu_ram_bytes"] / _GIB))
    for n in e["notes"]:
        print(f"note: {n}")


def print_plan(p):
    print(f"{p['model'].get('id', 'inline config')} on {p['num_gpus']} x {p['gpu']['name']} ({p['gpus_per_node']} per node)\n")
    print("  %-46s %9s %10s %12s %10s" % ("layout", "max batch", "GiB/GPU", "tokens/s", "CPU GiB"))
    for c in p["candidates"]:
        gib = c["per_gpu"]["device_total_bytes"] / _GIB
        if c["fits"]:
            print("  %-46s %9s %10.1f %12.0f %10.1f" % (c["label"], c["max_micro_batch"], gib, c["tokens_per_s"],
                                                        c["cpu_ram_bytes"] / _GIB))
        else:
            print("  %-46s %9s %10.1f %12s %10s" % (c["label"], "OOM", gib, "-", "-"))
    print(f"\nrecommendation: {p['recommendation_text']}")
    print(f"LLMem's rule would pick: {p['llmem_choice']}")


def print_models(models):
    for m in models:
        if "error" in m:
            print("  %-44s %-14s (partial config: %s)" % (m["id"], "", m["error"]))
        else:
            print("  %-44s %-14s %10s%s" % (m["id"], m["model_type"], _count(m["params"]),
                                           "  (partial config)" if m["partial"] else ""))


def print_gpus(gpus):
    print("  %-16s %-32s %9s %10s %9s" % ("name", "label", "GiB", "TFLOP/s", "GB/s"))
    for g in gpus:
        print("  %-16s %-32s %9.1f %10.0f %9.0f" % (g["name"], g["label"], g["memory_bytes"] / _GIB, g["bf16_tflops"],
                                                  g["memory_bandwidth_gbs"]))


def _usage():
    sys.stderr.write("usage: python -m memfit estimate REQUEST.json [--json]\n"
                     "       python -m memfit plan REQUEST.json [--json]\n"
                     "       python -m memfit models | gpus | defaults\n"
                     "       python -m memfit inspect CONFIG.json\n"
                     "REQUEST.json may be - for standard input; see README.md for the request fields.\n")
    return _USAGE


def _emit(text, as_json, report):
    result = json.loads(text)
    if isinstance(result, dict) and "error" in result:
        sys.stderr.write(f"memfit: {result['error']}\n")
        return _BAD_INPUT
    if as_json or report is None:
        sys.stdout.write(_core.indented(text) + "\n")
    else:
        report(result)
    return 0


def _read(path):
    if path == "-":
        return sys.stdin.buffer.read().decode("utf-8", errors="replace")
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        return _usage()
    cmd, rest = argv[0], argv[1:]
    as_json = "--json" in rest
    positional = [a for a in rest if a != "--json"]
    if cmd in ("estimate", "plan", "inspect"):
        if len(positional) != 1:
            return _usage()
        try:
            text = _read(positional[0])
        except OSError:
            sys.stderr.write(f"memfit: cannot read {positional[0]}: check the path\n")
            return _BAD_INPUT
        if cmd == "estimate":
            return _emit(_core.estimate_json(text), as_json, print_estimate)
        if cmd == "plan":
            return _emit(_core.plan_json(text), as_json, print_plan)
        return _emit(_core.parse_config_json(text), True, None)
    commands = {"models": (_core.models_json, print_models), "gpus": (_core.gpus_json, print_gpus),
                "defaults": (_core.defaults_json, None)}
    if cmd in commands:
        function, report = commands[cmd]
        return _emit(function(), as_json, report)
    if cmd in ("--help", "-h", "help"):
        _usage()
        return 0
    sys.stderr.write(f'memfit: unknown command "{cmd}"\n')
    return _usage()


if __name__ == "__main__":
    sys.exit(main())
