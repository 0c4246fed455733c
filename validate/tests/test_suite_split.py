"""The CPU suite's tuning/check split (data/validation/README.md) is what make_suite.py draws,
the two sets are disjoint, the generated shapes span the stated ranges, and the CI sample of the
check set is reproducible from its seed.

Run: python3 -m pytest validate/tests/test_suite_split.py -q   (no torch needed)
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import make_suite  # noqa: E402
import make_tiny_configs as tiny  # noqa: E402
import sample_cases  # noqa: E402


def load(path):
    with open(path) as f:
        return json.load(f)


TUNING = load(make_suite.OUT)["cases"]
CHECK = load(make_suite.CHECK_OUT)["cases"]
HOLDOUT = load(make_suite.HOLDOUT_OUT)["cases"]
LATER_HOLDOUTS = {n: load(make_suite.later_holdout_path(n))["cases"] for n, *_ in make_suite.LATER_HOLDOUTS}


def key(c):
    return json.dumps(c, sort_keys=True)


def test_committed_files_are_the_generators_draw():
    # a hand edit of either file (moving a case, tuning a check case away) fails here
    tuning, check = make_suite.generated_cases()
    assert [key(c) for c in CHECK] == [key(c) for c in check]
    expected = make_suite.fixed_cases() + make_suite.other_generators() + tuning + make_suite.pattern_cases()
    assert [key(c) for c in TUNING] == [key(c) for c in expected]


def test_holdout_is_its_own_draw_disjoint_from_both_sets():
    assert [key(c) for c in HOLDOUT] == [key(c) for c in make_suite.holdout_cases()]
    assert len(HOLDOUT) == make_suite.HOLDOUT
    names = {c["name"] for c in HOLDOUT}
    assert len(names) == len(HOLDOUT) and all(n.startswith("holdout/") for n in names)
    # a case identical to a tuning or check case (same request) would not be held out
    def request(c):
        return json.dumps({k: v for k, v in c.items() if k != "name"}, sort_keys=True)
    assert not {request(c) for c in HOLDOUT} & {request(c) for c in TUNING + CHECK}


def test_later_holdouts_are_their_own_draws_disjoint_from_every_set():
    def request(c):
        return json.dumps({k: v for k, v in c.items() if k != "name"}, sort_keys=True)
    earlier = {request(c) for c in TUNING + CHECK + HOLDOUT}
    for n, _, count, _ in make_suite.LATER_HOLDOUTS:
        cases = LATER_HOLDOUTS[n]
        assert [key(c) for c in cases] == [key(c) for c in make_suite.later_holdout_cases(n)]
        assert len(cases) == count and all(c["name"].startswith(f"holdout{n}/") for c in cases)
        requests = {request(c) for c in cases}
        assert not requests & earlier
        earlier |= requests


def test_sets_are_disjoint_and_the_fixed_cases_stay_in_tuning():
    assert not {c["name"] for c in TUNING} & {c["name"] for c in CHECK}
    assert not {key(c) for c in TUNING} & {key(c) for c in CHECK}
    fixed = make_suite.fixed_cases()
    # the original 374 one-shape cases less gptj/full/fp32/nogc/sdpa: GPT-J has no SDPA path in
    # Transformers 5.23, and the estimator now rejects that request (issue 8); plus
    # llama/lora-qv/amp_bf16/nogc/sdpa (PEFT LoRA under autocast, added with the LitGPT cases)
    assert len(fixed) == 374
    assert [key(c) for c in TUNING[:374]] == [key(c) for c in fixed]
    assert len(CHECK) == make_suite.GENERATED - round(make_suite.TUNING_SHARE * make_suite.GENERATED)


def test_generated_shapes_span_the_stated_ranges():
    gen = [c for c in TUNING if sample_cases.SHAPED.search(c["name"])] + CHECK
    shapes = [tiny.shape_of(c["model"]["config"]) for c in gen]
    hidden = [h for h, _, _ in shapes]
    layers = [n for _, n, _ in shapes]
    vocab = [v for _, _, v in shapes]
    seqs = [c["sequence_length"] for c in gen]
    mbs = [c["micro_batch_size"] for c in gen]
    assert min(hidden) == 64 and max(hidden) == 512
    assert set(layers) == {2, 3, 4}
    assert min(vocab) == 1024 and max(vocab) == 32000
    assert min(seqs) == 32 and max(seqs) == 1024
    assert set(mbs) == {1, 2, 3, 4}
    assert {c["family"] for c in [{"family": c["name"].split("/")[0]} for c in CHECK]} == set(make_suite.FAMILIES)
    lora = [c for c in gen if c["task"] == "lora"]
    assert len({c["lora"]["rank"] for c in lora}) == 5
    # the random draws use every optimizer of OPTIMIZERS; a pattern case may add one they never draw
    # (the loop AdamW of mixtral/h256-L2-V1024/full/bf16/nogc/sdpa/b1s64/adamw_loop)
    drawn = {c["optimizer"] for c in gen if c["task"] != "inference"}
    assert set(make_suite.OPTIMIZERS) <= drawn
    assert drawn - set(make_suite.OPTIMIZERS) <= {"adamw_loop"}


def test_shaped_selection_splits_the_tuning_set():
    suite = load(make_suite.OUT)
    shaped = sample_cases.select(suite, True)["cases"]
    rest = sample_cases.select(suite, False)["cases"]
    assert len(shaped) + len(rest) == len(TUNING)
    assert len(shaped) == len(make_suite.generated_cases()[0]) + len(make_suite.pattern_cases())
    assert all(sample_cases.SHAPED.search(c["name"]) for c in CHECK)


def test_sample_is_reproducible_from_its_seed():
    suite = load(make_suite.CHECK_OUT)
    a = sample_cases.sample(suite, 1234, 40)["cases"]
    b = sample_cases.sample(suite, 1234, 40)["cases"]
    c = sample_cases.sample(suite, 1235, 40)["cases"]
    assert [x["name"] for x in a] == [x["name"] for x in b]
    assert [x["name"] for x in a] != [x["name"] for x in c]
    assert len(a) == 40 and {x["name"] for x in a} <= {x["name"] for x in CHECK}
