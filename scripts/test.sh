#!/usr/bin/env bash
# Sets up everything and runs every test: native unit tests, the same suite under ASan+UBSan,
# the calibration check against published measurements. (Later stages add themselves here.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh all

echo "== native build and unit tests"
cmake --preset native >/dev/null
cmake --build --preset native
ctest --preset native

echo "== unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake --preset asan >/dev/null
cmake --build --preset asan
ctest --preset asan

echo "== fuzzing the request/config parsers (libFuzzer + ASan/UBSan, 30 s)"
fuzz_dir=$(mktemp -d)
cp tests/fuzz/corpus/* "$fuzz_dir"/
./build/asan/tests/fuzz/fuzz_request -max_total_time=30 -max_len=4096 -timeout=10 -print_final_stats=1 "$fuzz_dir" 2>&1 | tail -3
rm -rf "$fuzz_dir"

echo "== accuracy against published measurements (tools/calibrate.py)"
python3 tools/calibrate.py --check

echo "== the measurement harness itself (pytest: the live-tensor tracker is exact on hand-computed workloads)"
"$(scripts/setup_python.sh)" -m pytest -q validate/tests

echo "== CPU validation suite: memfit validate, estimates vs real PyTorch training steps"
# Tuning set (data/validation/cpu_suite.json) and a random sample of the check set
# (data/validation/cpu_check.json; never tuned on: data/validation/README.md). The gate is
# issue 5's on both: peak allocated within 2 % on every case (MEMFIT_VALIDATE_TOLERANCE). A case
# that crashes fails the stage whatever the tolerance. The sample's seed is printed: rerun it with
# MEMFIT_CHECK_SEED=<seed> scripts/test.sh.
validate_start=$SECONDS
./build/native/cli/memfit validate data/validation/cpu_suite.json --device cpu \
  --tolerance "${MEMFIT_VALIDATE_TOLERANCE:-2}"
echo "CPU validation, tuning set: $((SECONDS - validate_start)) s"
check_seed=${MEMFIT_CHECK_SEED:-$(( (RANDOM << 15) | RANDOM ))}
check_count=${MEMFIT_CHECK_SAMPLE:-40}
check_file=$(mktemp --suffix=.json)
python3 validate/sample_cases.py data/validation/cpu_check.json --seed "$check_seed" --count "$check_count" >"$check_file"
echo "CPU validation, check set: $check_count random cases, seed $check_seed (reproduce: MEMFIT_CHECK_SEED=$check_seed MEMFIT_CHECK_SAMPLE=$check_count scripts/test.sh)"
check_start=$SECONDS
./build/native/cli/memfit validate "$check_file" --device cpu --tolerance "${MEMFIT_VALIDATE_TOLERANCE:-2}"
rm -f "$check_file"
echo "CPU validation, check-set sample (seed $check_seed): $((SECONDS - check_start)) s"

echo "== WebAssembly build and Node tests (module boundary; byte-identical to the native CLI)"
cmake --preset wasm >/dev/null
cmake --build --preset wasm
MEMFIT_CLI=build/native/cli/memfit node --test tests/js/

echo "== browser tests: the page in headless Chromium, Hub answered from fixtures (screenshots in build/screenshots)"
(cd tests/browser && node --test .)
node scripts/bench_web.mjs --runs 10
