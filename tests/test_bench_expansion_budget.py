"""studies/expansion_budget.py's scoring: the crossed seeds x windows interval, the equal-compute accounting
(FLOPs per step, the meter that charges a decision, steps within a budget), the realized best count and
the one-sweep-step rule, checked against hand-computed values and independent references."""

import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

BENCH = Path(__file__).resolve().parent.parent / "studies" / "expansion_budget.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_expansion_budget", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_crossed_interval_matches_the_hand_computed_mean_squares(bench):
    d = [[1.0, 2.0, 3.0], [3.0, 5.0, 4.0]]
    # by hand: mean 3; seed means 2, 4; window means 2, 3.5, 3.5
    ms_seed = 3 * (1 + 1) / 1  # W sum (row - mean)^2 / (S - 1) = 6
    ms_window = 2 * (1 + 0.25 + 0.25) / 2  # S sum (col - mean)^2 / (W - 1) = 1.5
    ms_res = (0 + 0.25 + 0.25 + 0 + 0.25 + 0.25) / 2  # residuals 0, -.5, .5 / 0, .5, -.5 = 0.5
    var = (ms_seed + ms_window - ms_res) / 6  # 7 / 6
    df = 7 ** 2 / (ms_seed ** 2 / 1 + ms_window ** 2 / 2 + ms_res ** 2 / 2)  # 49 / 37.25
    half = stats.t.ppf(0.975, df) * math.sqrt(var)
    got = bench.crossed_interval(d)
    assert got["mean"] == pytest.approx(3.0, abs=1e-12)
    assert got["df"] == pytest.approx(49 / 37.25, rel=1e-12)
    assert (got["low"], got["high"]) == pytest.approx((3 - half, 3 + half), rel=1e-12)


def test_crossed_interval_keeps_at_least_the_seeds_degrees_of_freedom(bench):
    # two seeds, the residual mean square nearly cancels the windows': Satterthwaite's value falls below 1
    d = np.array([[0.1, -0.1, 0.6, 0.1, -0.5, 0.4], [1.3, 0.9, -0.7, -1.3, -0.6, 0.0]])
    S, W = d.shape
    rows, cols, mean = d.mean(axis=1), d.mean(axis=0), d.mean()
    ms = (W * ((rows - mean) ** 2).sum() / (S - 1), S * ((cols - mean) ** 2).sum() / (W - 1),
          ((d - rows[:, None] - cols[None, :] + mean) ** 2).sum() / ((S - 1) * (W - 1)))
    combined = ms[0] + ms[1] - ms[2]
    assert combined > 0 and combined ** 2 / (ms[0] ** 2 + ms[1] ** 2 / 5 + ms[2] ** 2 / 5) < 0.01
    got = bench.crossed_interval(d)
    half = stats.t.ppf(0.975, 1) * math.sqrt(combined / (S * W))
    assert got["df"] == 1
    assert (got["low"], got["high"]) == pytest.approx((mean - half, mean + half), rel=1e-12)


def test_crossed_interval_reduces_to_the_t_interval_over_seeds_when_windows_agree(bench):
    # every window of a seed has the same difference: only the seeds vary, the interval is Student's over them
    seeds = np.array([0.02, -0.01, 0.05, 0.03])
    got = bench.crossed_interval(np.repeat(seeds[:, None], 7, axis=1))
    low, high = stats.ttest_1samp(seeds, 0.0).confidence_interval(0.95)
    assert (got["low"], got["high"]) == pytest.approx((low, high), rel=1e-9)
    assert got["df"] == pytest.approx(3)


def test_crossed_interval_with_one_seed_is_the_paired_t_interval_over_windows(bench):
    windows = np.array([0.3, -0.1, 0.25, 0.05, 0.4])
    got = bench.crossed_interval(windows[None, :])
    low, high = stats.ttest_1samp(windows, 0.0).confidence_interval(0.95)
    assert (got["low"], got["high"]) == pytest.approx((low, high), rel=1e-9)


def test_crossed_interval_wider_than_the_seed_means_alone_when_windows_vary(bench):
    rng = np.random.default_rng(0)
    window_effect = rng.normal(0, 0.5, size=50)
    d = 0.1 + rng.normal(0, 0.01, size=(3, 1)) + window_effect[None, :] + rng.normal(0, 0.01, size=(3, 50))
    crossed = bench.crossed_interval(d)
    low, high = stats.ttest_1samp(d.mean(axis=1), 0.0).confidence_interval(0.95)
    # the windows are shared by every seed, so the seed means alone miss their variance
    assert crossed["high"] - crossed["low"] > 2 * (high - low)


def test_step_flops_by_hand(bench):
    # 4 blocks of 10 FLOPs, head 3; only block 2 trains: forward 43, backward 2 x 10 (block 2) + 10 (block 3) + 3
    assert bench.step_flops(4, [2], False, 10.0, 3.0) == 76.0
    # everything trains: three forwards' worth
    assert bench.step_flops(4, range(4), True, 10.0, 3.0) == 3 * 43.0
    # nothing trains: the forward alone
    assert bench.step_flops(4, [], False, 10.0, 3.0) == 43.0


def test_block_and_head_flops_by_hand(bench):
    config = SimpleNamespace(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                             vocab_size=256)
    # projections: q 48x48, k and v 48x24, o 48x48, gate/up/down 3 x 48x96 = 20736 weights; attention 4 T d
    assert bench.block_flops(config, 48) == 2 * 20736 + 4 * 48 * 48
    assert bench.head_flops(config) == 2 * 48 * 256


def test_steps_within_a_budget(bench):
    assert bench.steps_within(100.0, 15.0, 20.0) == 4
    assert bench.steps_within(100.0, 0.0, 20.0) == 5
    assert bench.steps_within(100.0, 120.0, 20.0) == 0


def test_best_count_is_the_smallest_within_the_tolerance(bench):
    assert bench.best_count({0: 2.100, 1: 2.104, 2: 2.099, 4: 2.2}, 0.005) == 0
    assert bench.best_count({0: 2.2, 1: 2.15, 2: 2.10, 4: 2.098, 8: 2.09}, 0.005) == 8
    assert bench.best_count({0: 2.2, 1: 2.15, 2: 2.10, 4: 2.098, 8: 2.09}, 0.01) == 4


@pytest.mark.parametrize("count, best, expected", [
    (0, 1, True), (0, 2, False), (2, 4, True), (4, 8, True), (1, 4, False),
    (3, 4, True), (3, 8, False),  # 3 sits half way between 2 and 4
    (12, 8, True), (16, 8, False),  # past the end, one step per the last interval (4)
])
def test_within_one_sweep_step(bench, count, best, expected):
    assert bench.within_one_step(count, best, (0, 1, 2, 4, 8)) is expected


def test_spearman_and_sign_agreement_by_hand(bench):
    # ranks 1 2 3 4 against 1 3 2 4: 1 - 6 * 2 / (4 * 15) = 0.8
    assert bench.spearman([0.1, 0.2, 0.3, 0.4], [1.0, 3.0, 2.0, 4.0]) == pytest.approx(0.8)
    right, counted = bench.sign_agreement([0.1, -0.2, 0.3, -0.1], [0.2, 0.1, -0.3, -0.5], [True, True, False, True])
    assert (right, counted) == (2, 3)


def test_the_meter_charges_a_training_step_as_the_formula_prices_it(bench):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from satcore.adapters.torch.expansion import freeze_old, insert_blocks

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=12)
    model = transformers.LlamaForCausalLM(config)
    x = torch.randint(0, 64, (2, 12))
    for before in ([], [1], [0, "head"]):
        grown, new = insert_blocks(model, before, init="copy")
        if new:
            freeze_old(grown, new)
        positions = [b.position for b in new]
        meter = bench.FlopMeter(config)
        grown(input_ids=x, labels=x).loss.backward()
        charged = meter.close()
        assert charged == pytest.approx(bench.arm_step_flops(config, 12, 3 + len(new), positions) * 24, rel=1e-12)
    meter = bench.FlopMeter(config)
    with torch.no_grad():
        model(input_ids=x)
    forward = (3 * bench.block_flops(config, 12) + bench.head_flops(config)) * 24
    assert meter.close() == pytest.approx(forward, rel=1e-12)


def _row(pair, seed, arm, before, target, general, **extra):
    return {"key": {"pair": pair, "seed": seed, "arm": arm}, "setup": {"layers": 8}, "pretrain": {},
            "before": before, "steps_trained": 10, "charge_fraction": 0.0, "evidence": {},
            "target": float(np.mean(target)), "general": float(np.mean(general)),
            f"{pair}_windows": list(target), "general_windows": list(general), **extra}


def test_render_scores_the_count_against_the_realized_best_and_re_renders_identically(bench, tmp_path):
    base = {"key": {"pair": "near", "arm": "base"}, "setup": {"layers": 8}, "pretrain": {}, "before": [],
            "steps_trained": 0, "near_windows": [2.0, 2.2], "general_windows": [2.1, 2.3]}
    rows = [base]
    places = {0: [], 1: ["head"], 2: [4, "head"], 4: [2, 4, 6, "head"], 8: [1, 2, 3, 4, 5, 6, 7, "head"]}
    for seed in range(2):
        # K = 0 best at seed 0, K = 4 at seed 1 (within 0.005 of K = 8)
        loss = {0: 1.90, 1: 1.95, 2: 1.96, 4: 1.97, 8: 1.98} if seed == 0 else \
               {0: 2.00, 1: 1.99, 2: 1.95, 4: 1.902, 8: 1.900}
        for K, value in loss.items():
            arm = "none" if K == 0 else f"uniform-{K}"
            rows.append(_row("near", seed, arm, places[K], [value - 0.1, value + 0.1], [2.2, 2.4]))
        count = 0 if seed == 0 else 1  # seed 1: two steps from 4, a miss
        rows.append(_row("near", seed, "satcore", places[count], [1.0, 1.2], [2.2, 2.4], charge_fraction=0.08,
                         decision_seconds=4.0, train_seconds=20.0))
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = bench.render([path])
    assert "| 0 | 1.9000 | 1.9500 | 1.9600 | 1.9700 | 1.9800 | 0.0050 | 0 | 0 | yes | - |" in table
    assert "| 1 | 2.0000 | 1.9900 | 1.9500 | 1.9020 | 1.9000 | 0.0050 | 4 | 1 | no | - |" in table
    # 20 s over 10 steps: the 4 s decision is 2 steps' wall
    assert "| 0 | 8.0 | - | 4 | 2.000 | 2 |" in table
    assert "1 of 2 cells (50%, needs >= 80%; near 1 of 2): not met" in table
    assert "at most 8.0% of the budget" in table
    assert bench.render([path]) == table


def test_render_rules_pairs_each_rule_with_none_and_the_reference_by_seed(bench, tmp_path):
    """Two seeds; within a seed every window has the same difference, so each paired interval is Student's t over
    the two seeds' differences (the crossed interval's reduction, an independent reference: scipy)."""
    sweep = [{"key": {"pair": "far", "arm": "base"}, "setup": {"layers": 8}, "pretrain": {}, "before": [],
              "steps_trained": 0, "far_windows": [2.0, 2.2], "general_windows": [2.1, 2.3]}]
    losses = {"none": (1.80, 1.84), "uniform-2": (1.74, 1.75), "uniform-1": (1.75, 1.77)}  # the file's order
    places = {"none": [], "uniform-1": ["head"], "uniform-2": [0, "head"], "uniform-4": [0, 0, 0, "head"]}
    for arm, by_seed in losses.items():
        sweep += [_row("far", seed, arm, places[arm], [v - 0.1, v + 0.1], [2.2, 2.4])
                  for seed, v in enumerate(by_seed)]
    sweep.append(_row("far", 1, "uniform-4", places["uniform-4"], [1.8, 2.1], [2.2, 2.4]))  # run at one seed only
    paths = [tmp_path / "sweep.jsonl"]
    paths[0].write_text("".join(json.dumps(r) + "\n" for r in sweep))
    rules = {0.023: ((0, 1.81), (0, 1.86)), 0.0: ((1, 1.76), (1, 1.79))}  # per seed: (count, target loss)
    frontier = [{"blocks": 0, "predicted_minus_none": None, "minus_none_interval": None},
                {"blocks": 1, "predicted_minus_none": 0.15, "minus_none_interval": [-0.125, 0.425]}]
    for carry, by_seed in rules.items():
        decision = {"frontier": frontier, "record": {"decision": {"carry_error": {"per_doubling": carry}}}}
        rows = [_row("far", seed, "satcore-carry", ["head"] * count, [v - 0.1, v + 0.1], [2.2, 2.4], evidence=decision)
                for seed, (count, v) in enumerate(by_seed)]
        paths.append(tmp_path / f"rule{carry}.jsonl")
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = bench.render_rules(paths, "uniform-1")
    assert "| seed | none | uniform-1 | uniform-2 | uniform-4 | carry 0.023: K | carry 0.023: target | carry 0.023: predicted " \
        "minus K = 0 | carry 0: K | carry 0: target | carry 0: predicted minus K = 0 |" in table  # counts in order
    prediction = "K=1 +0.1500 [-0.1250, +0.4250]"  # K = 0 has no difference from itself
    assert f"| 0 | 1.8000 | 1.7500 | 1.7400 | - | 0 | 1.8100 | {prediction} | 1 | 1.7600 | {prediction} |" in table
    assert f"| 1 | 1.8400 | 1.7700 | 1.7500 | 1.9500 | 0 | 1.8600 | {prediction} | 1 | 1.7900 | {prediction} |" in table

    def student(differences):
        low, high = stats.ttest_1samp(differences, 0.0).confidence_interval(0.95)
        return f"{np.mean(differences):+.4f} [{low:+.4f}, {high:+.4f}]"

    assert f"* uniform-1 minus none: {student([-0.05, -0.07])}" in table
    assert f"* uniform-2 minus none: {student([-0.06, -0.09])}" in table
    # one seed: Student's t over its two windows, 1.8 and 2.1 minus none's 1.74 and 1.94
    assert f"* uniform-4 minus none: {student([0.06, 0.16])} (seeds 1)" in table
    assert f"* satcore (carry 0.023) minus uniform-1: {student([0.06, 0.09])}; minus none: {student([0.01, 0.02])}" \
        in table
    assert f"* satcore (carry 0) minus uniform-1: {student([0.01, 0.02])}; minus none: {student([-0.04, -0.05])}" \
        in table


def test_the_recorded_results_re_render_the_lab_notes_tables(bench):
    root = BENCH.parent.parent
    recorded = bench.main_protocol_files(root / "studies" / "results")
    notes = (root / "studies" / "expansion-budget-notes.md").read_text()
    tables = [line for line in bench.render(recorded).splitlines() if line.startswith("| ")]
    assert recorded and len(tables) > 40
    assert [line for line in tables if line not in notes] == []


@pytest.mark.parametrize("name", ["expansion_budget_smollm2.jsonl", "expansion_budget_smollm2_l4_budget.jsonl"])
def test_the_smollm2_rows_re_render_their_lab_notes_tables(bench, name):
    """The SmolLM2-135M rows (one seed, their own setup; first with the budget in steps of K = 2, then in the
    conventional arm's) are rendered on their own; their tables are the notes'."""
    root = BENCH.parent.parent
    recorded = root / "studies" / "results" / name
    if not recorded.exists():
        pytest.skip("no SmolLM2 rows recorded")
    notes = (root / "studies" / "expansion-budget-notes.md").read_text()
    tables = [line for line in bench.render([recorded]).splitlines() if line.startswith("| ")]
    assert tables
    assert [line for line in tables if line not in notes] == []


def test_the_long_budget_row_re_renders_its_lab_notes_tables(bench):
    """The 2000-step rows (near, 3 seeds; the sized satcore rows last, replacing the earlier ones) are rendered on
    their own (another setup); their tables are the notes'."""
    root = BENCH.parent.parent
    recorded = sorted((root / "studies" / "results").glob("expansion_long_*.jsonl"))
    assert recorded, "no long-budget rows recorded"
    notes = (root / "studies" / "expansion-budget-notes.md").read_text()
    tables = [line for line in bench.render(recorded).splitlines() if line.startswith("| ")]
    assert len(tables) > 10
    assert [line for line in tables if line not in notes] == []


def test_the_positive_control_re_renders_its_lab_notes_table(bench):
    """The positive control's rows (a one-block base, its own setup: the sweep, then the decision at the shipped
    carry error and at 0) render the notes' table and paired intervals."""
    results = BENCH.parent / "results"
    recorded = [results / f"expansion_budget_positive_L1_{name}_far.jsonl" for name in ("sweep", "carry", "nocarry")]
    notes = (BENCH.parent / "expansion-budget-notes.md").read_text()
    lines = [line for line in bench.render_rules(recorded, "uniform-1").splitlines() if line.startswith(("| ", "* "))]
    assert len(lines) == 1 + 10 + 5  # header, ten seeds, five paired intervals
    assert [line for line in lines if line not in notes] == []


def test_the_smollm2_protocols_flops_for_its_30_layer_llama_config_match_an_independent_count(bench):
    """The SmolLM2-135M protocol's accounting (GGUF sizes: width 576, MLP 1536, 9 query and 3 key/value heads,
    30 blocks, vocabulary 49152) against weights counted off a real block and every pass tallied by hand."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    T, tokens = 64, 4 * 64
    layer = LlamaDecoderLayer(config, 0)
    weights = sum(m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))
    assert weights == 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536  # q, o; k, v (3 of 9 heads); gate, up, down
    block = 2 * weights + 4 * T * 576  # scores and weighted values: 2 x T x d each
    head = 2 * 576 * 49152
    assert bench.block_flops(config, T) == block and bench.head_flops(config) == head
    # none: every block and the head train, three forwards' worth of the 30 blocks and the head
    assert bench.arm_step_flops(config, T, 30, []) * tokens == 3 * (30 * block + head) * tokens
    # uniform-2: new blocks at 15 and 31 of 32; forward of all, activation gradients from 15 up (17 blocks and
    # the head), weight gradients of the 2 new blocks
    positions = bench.layout_new(30, "uniform-2")
    assert positions == [15, 31]
    reference = ((32 * block + head) + (17 * block + head) + 2 * block) * tokens
    assert bench.arm_step_flops(config, T, 32, positions) * tokens == reference
    # the budget of 120 reference steps buys 120 // (3 (30 b + h) / (51 b + 2 h)) steps of the model as it is
    assert bench.steps_within(120 * reference, 0.0, 3 * (30 * block + head) * tokens) == \
        int(120 * (51 * block + 2 * head) // (3 * (30 * block + head)))


def _student(differences):
    """The paired interval of per-seed differences constant over windows: Student's t over the seeds (scipy)."""
    low, high = stats.ttest_1samp(differences, 0.0).confidence_interval(0.95)
    return f"{np.mean(differences):+.4f} [{low:+.4f}, {high:+.4f}]"


def test_render_settings_gives_each_files_uniform_arms_minus_none_paired_by_seed(bench, tmp_path):
    """Two files, two setups: per file, pair and uniform arm one line, over the seeds both it and none were run at;
    where a seed's windows differ by the same amount the interval is Student's t over the seeds, with one seed the
    paired t over its windows (independent references: scipy); a file whose rows do not share one setup gives the
    loader's message."""
    def rows(setup, pair, windows, steps):
        base = {"key": {"pair": pair, "arm": "base"}, "setup": setup, "pretrain": {}, "before": [], "steps_trained": 0,
                f"{pair}_windows": [2.0, 2.2], "general_windows": [2.1, 2.3]}
        return [base] + [_row(pair, seed, arm, [], w, [2.2, 2.4], setup=setup, steps_trained=steps[arm])
                         for arm, by_seed in windows.items() for seed, w in by_seed.items()]

    shallow = {"layers": 2, "width": 48, "pretrain_steps": 4000, "steps": 2000}
    paths = [tmp_path / "two.jsonl", tmp_path / "one.jsonl"]
    first = rows(shallow, "near", {"none": {0: [1.7, 1.9], 1: [1.74, 1.94], 2: [1.8, 2.0]},
                                   "uniform-1": {0: [1.68, 1.88], 1: [1.73, 1.93]}, "uniform-2": {2: [1.8, 2.1]}},
                 {"none": 1601, "uniform-1": 2000, "uniform-2": 1197})
    second = rows({**shallow, "layers": 1, "width": 32}, "far",
                  {"none": {0: [1.6, 1.8], 1: [1.7, 1.9]}, "uniform-1": {0: [1.5, 1.7], 1: [1.65, 1.85]}},
                  {"none": 2231, "uniform-1": 2000})
    for path, content in zip(paths, (first, second)):
        path.write_text("".join(json.dumps(r) + "\n" for r in content))
    one_seed = stats.ttest_1samp([0.0, 0.1], 0.0).confidence_interval(0.95)  # seed 2: its two windows
    assert bench.render_settings(paths).splitlines()[2:] == [
        f"| 2, 48, 4000 | near | 2000 | 0, 1 | 1601 / 2000 | K = 1: {_student([-0.02, -0.01])} |",
        f"| 2, 48, 4000 | near | 2000 | 2 | 1601 / 1197 | K = 2: +0.0500 [{one_seed[0]:+.4f}, {one_seed[1]:+.4f}] |",
        f"| 1, 32, 4000 | far | 2000 | 0, 1 | 2231 / 2000 | K = 1: {_student([-0.1, -0.05])} |"]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in first + second[1:]))
    assert bench.render_settings([mixed]).startswith("not paired:")


def test_render_arm_errors_sets_each_arms_prediction_against_its_realized_change(bench, tmp_path):
    """One setting, two seeds: per K the trials' first two readings, the predicted change, the realized change of the
    sweep's arm from the base model (mean of its windows: 2.1) and realized minus predicted; for K = 1 the paired
    difference's realized minus predicted, mean and sample standard deviation over the seeds, by hand."""
    setup = {"layers": 1, "steps": 2000}
    base = {"key": {"pair": "far", "arm": "base"}, "setup": setup, "pretrain": {}, "before": [], "steps_trained": 0,
            "far_windows": [2.0, 2.2], "general_windows": [2.1, 2.3]}
    targets = {"none": (1.80, 1.84), "uniform-1": (1.78, 1.86)}
    rows = [base] + [_row("far", seed, arm, [], [v - 0.1, v + 0.1], [2.2, 2.4], setup=setup)
                     for arm, by_seed in targets.items() for seed, v in enumerate(by_seed)]
    trials = {0: ([[-0.1, -0.2, -0.25]], [[-0.12, -0.18]]), 1: ([[-0.05, -0.1]], [[-0.03, -0.06]])}
    predicted = {0: (-0.50, -0.30), 1: (-0.40, -0.20)}  # per seed: K = 0, K = 1
    for seed in (0, 1):
        frontier = [{"blocks": 0, "trial": {"heldout_change": trials[seed][0]}, "predicted_heldout_change":
                     predicted[seed][0], "predicted_minus_none": None},
                    {"blocks": 1, "trial": {"heldout_change": trials[seed][1]}, "predicted_heldout_change":
                     predicted[seed][1], "predicted_minus_none": predicted[seed][1] - predicted[seed][0]}]
        decision = {"frontier": frontier, "plan": {"checkpoints": [19, 39, 79]}}
        rows.append(_row("far", seed, "satcore-carry", [], [1.9, 1.9], [2.2, 2.4], setup=setup,
                         evidence={"record": {"decision": decision}}))
    path = tmp_path / "control.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = bench.render_arm_errors([[path]]).splitlines()
    # K = 0: readings (-0.1 - 0.05) / 2, (-0.2 - 0.1) / 2; predicted -0.45; realized 1.82 - 2.1 = -0.28
    # K = 1: readings -0.075, -0.12; predicted -0.25; realized 1.82 - 2.1; paired: realized -0.02, +0.02 minus
    # predicted +0.2, +0.2: -0.22, -0.18 (sd 0.0283)
    assert table[2:] == ["| 1 block, 2000 | far | 0 | 2 | 19, 39 | -0.0750, -0.1500 | -0.4500 | -0.2800 | +0.1700 | - |",
                         "| 1 block, 2000 | far | 1 | 2 | 19, 39 | -0.0750, -0.1200 | -0.2500 | -0.2800 | -0.0300 | "
                         f"-0.2000 ({math.sqrt(0.0008):.4f}) |"]


def test_the_control_the_rule_can_reach_re_renders_its_lab_notes_tables(bench):
    """The control's rows (a one-block base on the near pair: the sweep, then the decision at the shipped carry error
    and at 0; a two-block base on the same pair at the shipped one), the settings tried on the way and the arm-by-arm
    misses render the notes' tables."""
    results = BENCH.parent / "results"
    notes = (BENCH.parent / "expansion-budget-notes.md").read_text()
    recorded = [results / f"expansion_budget_control_L1_{name}_near.jsonl" for name in ("sweep", "carry", "nocarry")]
    lines = [line for line in bench.render_rules(recorded, "uniform-1").splitlines() if line.startswith(("| ", "* "))]
    assert len(lines) == 1 + 10 + 3  # header, ten seeds, three paired intervals
    explored = sorted(results.glob("expansion_budget_control_explore_*.jsonl"))
    lines += [line for line in bench.render_settings(explored).splitlines() if line.startswith("| ")]
    controls = [[results / f"expansion_budget_positive_L1_{name}_far.jsonl" for name in ("sweep", "carry")],
                recorded[:2], [results / f"expansion_budget_control_L2_{name}_near.jsonl" for name in ("sweep", "carry")]]
    lines += [line for line in bench.render_rules(controls[2], "uniform-1").splitlines() if line.startswith(("| ", "* "))]
    lines += [line for line in bench.render_arm_errors([bench.main_protocol_files(results), *controls]).splitlines()
              if line.startswith("| ")]
    assert [line for line in lines if line not in notes] == []


def _control_rows(tmp_path, frontiers, general):
    """A one-block control on near at seeds 0-2: the sweep (none, uniform-1) and the shipped rule's rows, every window
    of a row one value (so each crossed interval is Student's t over the seeds); ``general``: per arm, per seed."""
    setup = {"layers": 1, "steps": 2000}
    base = {"key": {"pair": "near", "arm": "base"}, "setup": setup, "pretrain": {}, "before": [], "steps_trained": 0,
            "near_windows": [2.0, 2.0], "general_windows": [2.0, 2.0]}
    targets = {"none": (1.90, 1.92, 1.91), "uniform-1": (1.88, 1.93, 1.87)}
    sweep = [base] + [_row("near", seed, arm, [] if arm == "none" else ["head"], [v, v], [general[arm][seed]] * 2,
                           setup=setup, steps_trained=2231 if arm == "none" else 2000)
                      for arm, by_seed in targets.items() for seed, v in enumerate(by_seed)]
    rule = [base]
    for seed, frontier in enumerate(frontiers):
        decision = {"frontier": frontier, "tolerance": 0.006, "chosen_blocks": 0, "carry_error": {"per_doubling": 0.023}}
        rule.append(_row("near", seed, "satcore-carry", [], [1.91, 1.91], [general["satcore"][seed]] * 2, setup=setup,
                         steps_trained=2109, evidence={"frontier": frontier, "record": {"decision": decision}}))
    paths = [tmp_path / "sweep.jsonl", tmp_path / "carry.jsonl"]
    for path, rows in zip(paths, (sweep, rule)):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def _frontier(general_change, minus_none, interval):
    """One decision's frontier, K = 0 and K = 1: the general predictions and K = 1's paired difference from K = 0."""
    errors = {"windows": 0.02, "seeds": 0.0}
    return [{"blocks": 0, "predicted_heldout_change": -0.2, "interval": [-0.3, -0.1], "standard_errors": errors,
             "predicted_minus_none": None, "minus_none_interval": None, "predicted_general_change": general_change[0]},
            {"blocks": 1, "predicted_heldout_change": -0.2 + minus_none, "interval": [-0.25, -0.05],
             "standard_errors": errors, "predicted_minus_none": minus_none, "minus_none_interval": interval,
             "minus_none_standard_errors": {**errors, "carry": 0.03}, "predicted_general_change": general_change[1]}]


def test_render_control_gives_the_general_loss_its_criterion_and_the_gain_each_stop_could_resolve(bench, tmp_path):
    """Three seeds, every window of a row one value: each interval is Student's t over the seeds' differences, the
    criterion's Spearman scipy's; only K = 0's realized change (+0.10, +0.08, +0.09 from the base model) is above seed
    noise, and K = 0 was predicted to fall at seed 0 (2 of 3 signs right); the paired differences (uniform-1 minus
    none) are all above it; a stop's resolvable gain is the half-width of an interval reaching below minus the
    tolerance (seeds 0 and 2), none where the interval lies above it (seed 1)."""
    general = {"none": (2.10, 2.08, 2.09), "uniform-1": (1.98, 1.97, 2.01), "satcore": (2.09, 2.065, 2.08)}
    predicted = ((-0.01, -0.03), (0.05, 0.0), (0.02, -0.02))
    frontiers = [_frontier(predicted[0], 0.05, [-0.10, 0.20]), _frontier(predicted[1], 0.10, [0.02, 0.18]),
                 _frontier(predicted[2], -0.05, [-0.11, 0.01])]
    table = bench.render_control([_control_rows(tmp_path, frontiers, general)], "uniform-1")
    assert "| 1 block, 2000 | near | none | 0 | 3 | 2231 | 2.0900 | " + _student([0.10, 0.08, 0.09]) + " |  | " \
        + _student([0.12, 0.11, 0.08]) + " |" in table
    assert "| 1 block, 2000 | near | uniform-1 | 1 | 3 | 2000 | 1.9867 | " + _student([-0.02, -0.03, 0.01]) + " | " \
        + _student([-0.12, -0.11, -0.08]) + " |  |" in table
    assert "| 1 block, 2000 | near | satcore (carry 0.023) | 0 | 3 | 2109 | 2.0783 | " \
        + _student([0.09, 0.065, 0.08]) + " | " + _student([-0.01, -0.015, -0.01]) + " | " \
        + _student([0.11, 0.095, 0.07]) + " |" in table
    changes = stats.spearmanr([-0.01, -0.03, 0.05, 0.0, 0.02, -0.02], [0.10, -0.02, 0.08, -0.03, 0.09, 0.01])[0]
    paired = stats.spearmanr([-0.02, -0.05, -0.04], [-0.12, -0.11, -0.08])[0]
    line = (f"predicted vs realized general change: Spearman {changes:+.3f} over 6 points (needs >= 0.6); sign right "
            f"2 of 3 above seed noise (needs >= 85%): not met; paired to K = 0: K > 0 minus K = 0, predicted vs "
            f"realized: Spearman {paired:+.3f} over 3 points (needs >= 0.6); sign right 3 of 3 above seed noise "
            f"(needs >= 85%): not met")
    assert f"* 1 block, 2000, near: {line}" in table and f"* all 1 controls: {line}" in table
    realized = ("-0.0200", "+0.0100", "-0.0400")  # uniform-1 minus none, target
    for seed, gain in enumerate(("0.150", "-", "0.060")):
        assert f"| 1 block, 2000 | near | carry 0.023 | {seed} | 0 / 0 | " in table
        assert f" | not recorded | {gain} | K=1 {realized[seed]} |" in table.splitlines()[-3 + seed]


def test_the_rerun_control_decisions_reproduce_the_recorded_ones_and_record_their_resolvable_gain(bench):
    """The one-block near control's decisions rerun by the code that records ``decision.resolvable_gain`` (both rules,
    ten seeds): every frontier and held-out loss as first recorded, and each stop's recorded gain is the one
    ``_recomputed_choice`` reads off the first recording, which predates the field (both lines state it)."""
    results = BENCH.parent / "results"
    for rule in ("carry", "nocarry"):
        first = {r["key"].get("seed"): r for r in bench._rows(results / f"expansion_budget_control_L1_{rule}_near.jsonl")}
        rerun = [r for r in bench._rows(results / f"expansion_budget_control_L1_{rule}_resolvable_near.jsonl")
                 if r["key"]["arm"] != "base"]
        assert sorted(r["key"]["seed"] for r in rerun) == list(range(10))
        for row in rerun:
            old = first[row["key"]["seed"]]
            assert [row[k] for k in ("near_windows", "general_windows")] == [old[k] for k in ("near_windows",
                                                                                                "general_windows")]
            assert row["evidence"]["frontier"] == old["evidence"]["frontier"]
            decision, before = row["evidence"]["record"]["decision"], old["evidence"]["record"]["decision"]
            choice = bench._recomputed_choice(before)
            assert "resolvable_gain" not in before and decision["chosen_blocks"] == before["chosen_blocks"] == 0
            assert (choice.chosen_blocks, choice.resolvable_gain) == (0, decision["resolvable_gain"])
            # the line's words are the code's (they changed after the recording); its claim and number are the rows'
            gain = decision["resolvable_gain"]
            for reason in (choice.reason, decision["reason"]):
                assert reason.startswith(before["reason"])
                assert (gain is None and reason == before["reason"]) or (
                    f"could show only a gain beyond about {gain:.3g} nats" in reason)


def test_the_controls_general_loss_criterion_and_resolvable_gains_re_render_their_lab_notes_tables(bench):
    """The three controls as the notes render them (the one-block near control with its rerun decisions, the two-block
    one with its uniform-2 rows, the positive control): every table row and criterion line is the notes'."""
    results = BENCH.parent / "results"
    settings = [[results / f"expansion_budget_{name}.jsonl" for name in names] for names in (
        ("control_L1_sweep_near", "control_L1_carry_resolvable_near", "control_L1_nocarry_resolvable_near"),
        ("control_L2_sweep_near", "control_L2_uniform2_near", "control_L2_carry_near"),
        ("positive_L1_sweep_far", "positive_L1_carry_far", "positive_L1_nocarry_far"))]
    notes = (BENCH.parent / "expansion-budget-notes.md").read_text()
    lines = [line for line in bench.render_control(settings, "uniform-1").splitlines() if line.startswith(("| ", "* "))]
    assert len(lines) == (1 + 14) + 4 + (1 + 45)  # the general loss (14 arms), 3 controls and pooled, 45 stops
    assert [line for line in lines if line not in notes] == []


def test_charged_losses_add_the_charge_measured_on_the_arm_the_decision_chose(bench):
    """By hand: the sweep's arm plus the scaled per-window loss of the satcore row against the sweep row with its
    places (K = 0 chosen: none; K = 1 chosen: uniform-1); a satcore row whose places no sweep row has is refused."""
    arms = {"none": {0: _row("near", 0, "none", [], [1.0, 2.0], [3.0, 3.0])},
            "uniform-1": {0: _row("near", 0, "uniform-1", ["head"], [0.9, 1.7], [2.0, 2.5])}}
    at_zero = {0: _row("near", 0, "satcore-carry", [], [1.1, 2.4], [3.0, 2.9])}
    assert bench.charged_losses(arms, at_zero, 1, 0, "near_windows", 2.0) == pytest.approx([1.1, 2.5], abs=1e-12)
    assert bench.charged_losses(arms, at_zero, 1, 0, "general_windows", 2.0) == pytest.approx([2.0, 2.3], abs=1e-12)
    at_one = {0: _row("near", 0, "satcore-carry", ["head"], [0.95, 1.8], [2.0, 2.5])}
    assert bench.charged_losses(arms, at_one, 0, 0, "near_windows", 1.0) == pytest.approx([1.05, 2.1], abs=1e-12)
    with pytest.raises(ValueError, match="places"):
        bench.charged_losses(arms, {0: _row("near", 0, "satcore-carry", [0], [1.0, 1.0], [1.0, 1.0])}, 0, 0,
                             "near_windows", 1.0)


def _forgetting_files(tmp_path):
    """A one-block control on near at seeds 0-2 (base general loss 2.0): the sweep (none, uniform-1) and raced satcore
    rows choosing K = 0 (charge ceiling twice the recorded cost), every window of a row one value.  Predicted general
    change: K = 0 +0.10, K = 1 -0.01 (seed 2: +0.02, so a limit of 0 leaves out every arm); K = 1's paired difference
    from K = 0 is not credible, so without a limit K = 0 is chosen."""
    setup = {"layers": 1, "steps": 2000}
    base = {"key": {"pair": "near", "arm": "base"}, "setup": setup, "pretrain": {}, "before": [], "steps_trained": 0,
            "near_windows": [2.0, 2.0], "general_windows": [2.0, 2.0]}
    losses = {"none": ((1.90, 1.92, 1.91), (2.10, 2.08, 2.09)), "uniform-1": ((1.88, 1.93, 1.87), (1.98, 1.97, 2.01)),
              "satcore-carry": ((1.91, 1.93, 1.915), (2.10, 2.07, 2.10))}
    errors = {"windows": 0.02, "seeds": 0.0}
    rows = [base]
    for arm, (target, general) in losses.items():
        for seed in range(3):
            extra = {}
            if arm == "satcore-carry":
                frontier = [{"blocks": K, "predicted_heldout_change": -0.2 + 0.02 * K, "interval": [-0.3, -0.1],
                             "standard_errors": errors, "predicted_minus_none": None if K == 0 else 0.02,
                             "minus_none_interval": None if K == 0 else [-0.1, 0.2],
                             "minus_none_standard_errors": None if K == 0 else {**errors, "carry": 0.05},
                             "predicted_general_change": g, "general_interval": [g - 0.03, g + 0.03]}
                            for K, g in ((0, 0.10), (1, 0.02 if seed == 2 else -0.01))]
                decision = {"frontier": frontier, "tolerance": 0.006, "race": {"on": True, "ceiling_cost_steps": 40.0},
                            "cost_steps": 20.0}
                extra = {"evidence": {"frontier": frontier, "record": {"decision": decision}}}
            rows.append(_row("near", seed, arm, ["head"] if arm == "uniform-1" else [], [target[seed]] * 2,
                             [general[seed]] * 2, setup=setup, **extra))
    path = tmp_path / "control.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [path]


def test_render_forgetting_scores_each_limit_by_the_realized_losses_of_the_count_it_chooses(bench, tmp_path):
    """By hand, limit 0 (charge scale 40 / 20 = 2): seeds 0, 1 choose K = 1 (K = 0 over it), realized target 1.88 +
    2 (0.01) = 1.90 and 1.93 + 2 (0.01) = 1.95, general 1.98 + 0 and 1.97 - 0.02; seed 2 leaves out every arm and
    adds nothing: 1.91 + 2 (0.005) = 1.92, general 2.09 + 2 (0.01) = 2.11; its general change from the base model,
    +0.11, is the one over the limit.  The conventional rule's limit is K = 1's prediction: K = 1 at every seed.  No
    limit: the satcore rows as recorded.  Each interval Student's t over the seeds (windows agree)."""
    table = bench.render_forgetting([_forgetting_files(tmp_path)])
    lines = table.splitlines()
    assert len(lines) == 2 + len(bench.FORGETTING_RULES)
    assert ("| 1 block, 2000 | near | satcore-carry | 0 | 3 | K=0: 1, K=1: 2 | 1 | 2 | " + " | ".join(_student(d) for d in (
        [0.02, 0.02, 0.05], [0.0, -0.02, 0.10], [0.0, 0.03, 0.01], [-0.12, -0.13, 0.02])) + " |") in lines
    assert ("| 1 block, 2000 | near | satcore-carry | none (default) | 3 | K=0: 3 | - | - | " + " | ".join(_student(d) for d in (
        [0.03, 0.0, 0.045], [0.12, 0.10, 0.09], [0.01, 0.01, 0.005], [0.0, -0.01, 0.01])) + " |") in lines
    # K = 1 everywhere, seed 2 at scale 2: target 1.87 + 0.01, general 2.01 + 0.02, over uniform-1's change (seeds 0,
    # 1: at most it, 1.98 and 1.95)
    assert ("| 1 block, 2000 | near | satcore-carry | as uniform-1 is predicted to forget | 3 | K=1: 3 | 0 | 2 | "
            + " | ".join(_student(d) for d in ([0.02, 0.02, 0.01], [0.0, -0.02, 0.02], [0.0, 0.03, -0.03],
                                               [-0.12, -0.13, -0.06])) + " |") in lines


def test_the_forgetting_limits_re_render_their_lab_notes_table(bench):
    """The main protocol and the three controls as the notes render them: every row of the table is the notes'."""
    results = BENCH.parent / "results"
    controls = [[results / f"expansion_budget_{name}.jsonl" for name in names] for names in (
        ("control_L1_sweep_near", "control_L1_carry_resolvable_near"),
        ("control_L2_sweep_near", "control_L2_uniform2_near", "control_L2_carry_near"),
        ("positive_L1_sweep_far", "positive_L1_carry_far"))]
    notes = (BENCH.parent / "expansion-budget-notes.md").read_text()
    lines = [line for line in bench.render_forgetting([bench.main_protocol_files(results), *controls]).splitlines()
             if line.startswith("| ")]
    assert len(lines) == 1 + len(bench.FORGETTING_RULES) * (3 * 2 + 3)  # two frontiers on the main pairs, one a control
    assert [line for line in lines if line not in notes] == []


def _paired_decision(point, errors, tolerance=0.006, conventional=2):
    """A recorded decision whose frontier holds K = 0 and the ``conventional`` count, that count's paired difference
    from K = 0 ``point`` with the standard errors ``errors`` and its 95% interval from them."""
    half = 1.959963984540054 * math.sqrt(sum(v ** 2 for v in errors.values()))
    frontier = [{"blocks": K, "predicted_heldout_change": -0.1, "interval": [-0.2, 0.0],
                 "standard_errors": {"windows": 0.05, "seeds": 0.0}, "predicted_minus_none": None if K == 0 else point,
                 "minus_none_interval": None if K == 0 else [point - half, point + half],
                 "minus_none_standard_errors": None if K == 0 else errors} for K in (0, conventional)]
    return {"frontier": frontier, "tolerance": tolerance}


def test_prior_choice_puts_each_frontier_in_the_case_its_paired_interval_says(bench):
    """Expanding credibly better than K = 0 (interval below 0, point below minus the tolerance): the shipped rule's
    K, "pays".  Not expanding credibly better than the conventional count (point above the tolerance and z standard
    errors above 0): K = 0.  Neither: the conventional count.  The carry error widens the test only where the variant
    says so; z = 0 is the point against the tolerance alone."""
    errors = {"windows": 0.02, "seeds": 0.0, "carry": 0.05}
    pays = _paired_decision(-0.2, errors)
    assert [bench.prior_choice(pays, 2, v) for v in ((0.0, False), (1.96, True))] == [(2, "pays")] * 2
    worse = _paired_decision(0.05, errors)  # 0.05 - 1.96 x 0.02 > 0; 0.05 - 1.96 x 0.0539 < 0 < 0.05 - 0.674 x 0.0539
    assert bench.prior_choice(worse, 2, (1.96, False)) == (0, "does not pay")
    assert bench.prior_choice(worse, 2, (1.96, True)) == (2, "could not tell")
    assert bench.prior_choice(worse, 2, (0.674, True)) == (0, "does not pay")
    small = _paired_decision(0.005, errors)  # above 0, not above the tolerance 0.006
    assert bench.prior_choice(small, 2, (0.0, False)) == (2, "could not tell")
    # the code before the carry error recorded no standard errors: the interval's half-width over z, here 0.0539
    unrecorded = _paired_decision(0.05, errors)
    unrecorded["frontier"][1]["minus_none_standard_errors"] = None
    assert [bench.prior_choice(unrecorded, 2, (z, carry)) for z, carry in ((0.674, False), (1.0, False), (1.0, True))] \
        == [(0, "does not pay"), (2, "could not tell"), (2, "could not tell")]


def test_render_prior_scores_each_variant_by_the_realized_losses_of_the_count_it_chooses(bench, tmp_path):
    """The forgetting fixture's control (K = 1's paired difference from K = 0 +0.02, windows' standard error 0.02,
    carry 0.05, tolerance 0.006; charge ceiling twice the recorded cost), by hand: z = 0 takes the point, above the
    tolerance, for "does not pay": K = 0 at every seed, realized none + 2 (satcore - none), target 1.92, 1.94, 1.92,
    general 2.10, 2.06, 2.11;
    z = 1 (0.02 - 0.02 is not above 0) and z = 0.674 with the carry (0.02 - 0.674 x 0.0539 < 0): "could not tell",
    uniform-1 + 2 (satcore - none), target 1.90, 1.95, 1.88, general 1.98, 1.95, 2.03.  The shipped rule: the satcore
    rows as recorded (1.91, 1.93, 1.915).  Each interval Student's t over the seeds (windows agree); every count here
    is within one sweep step of the realized best (K = 1, 0, 1)."""
    lines = bench.render_prior([_forgetting_files(tmp_path)], variants=((0.0, False), (1.0, False), (0.674, True)),
                               decisions=("satcore-carry",)).splitlines()
    assert len(lines) == 2 + 4
    assert lines[2].startswith("| 1 block, 2000 | near | satcore-carry | as recorded | 3 | K=0: 3 | - | 3 of 3 | ")
    assert lines[3] == ("| 1 block, 2000 | near | satcore-carry | z 0 | 3 | K=0: 3 | does not pay: 3 | 3 of 3 | "
                        + " | ".join(_student(d) for d in ([0.04, 0.01, 0.05], [0.12, 0.09, 0.10], [0.02, 0.02, 0.01],
                                                           [0.0, -0.02, 0.02], [0.01, 0.01, 0.005])) + " |")
    by_hand = " | ".join(_student(d) for d in ([0.02, 0.02, 0.01], [0.0, -0.02, 0.02], [0.0, 0.03, -0.03],
                                               [-0.12, -0.13, -0.06], [-0.01, 0.02, -0.035]))
    assert lines[4] == f"| 1 block, 2000 | near | satcore-carry | z 1 | 3 | K=1: 3 | could not tell: 3 | 3 of 3 | {by_hand} |"
    assert lines[5] == (f"| 1 block, 2000 | near | satcore-carry | z 0.674, carry | 3 | K=1: 3 | could not tell: 3 | 3 of 3 "
                        f"| {by_hand} |")
    recorded = bench.render_prior([_forgetting_files(tmp_path)], variants=((0.0, False),), decisions=("satcore-carry",),
                                  charge="recorded").splitlines()   # scale 1: the satcore rows themselves
    assert recorded[3].endswith(" | +0.0000 [+0.0000, +0.0000] |")


def test_the_symmetric_rules_re_render_their_lab_notes_tables(bench):
    """The main protocol, the three controls and the one-block control's full trials as the notes render them (every
    variant at the race's ceiling; the variant fitted leaving one setting out, both charges): every row is the notes'.
    The fit's claim there: no variant ahead of or level with the decisions as recorded on the main pairs."""
    results = BENCH.parent / "results"
    controls = [[results / f"expansion_budget_{name}.jsonl" for name in names] for names in (
        ("control_L1_sweep_near", "control_L1_carry_resolvable_near"),
        ("control_L2_sweep_near", "control_L2_uniform2_near", "control_L2_carry_near"),
        ("positive_L1_sweep_far", "positive_L1_carry_far"), ("control_L1_sweep_near", "control_L1_full_near"))]
    settings = [bench.main_protocol_files(results), *controls]
    notes = (BENCH.parent / "expansion-budget-notes.md").read_text()
    table = [line for line in bench.render_prior(settings).splitlines() if line.startswith("| ")]
    fit = [line for line in bench.render_prior_fit(settings).splitlines() if line.startswith("| ")]
    assert len(table) == 1 + (1 + len(bench.PRIOR_VARIANTS)) * (3 * 2 + 4) and len(fit) == 1 + 2 * 10
    assert [line for line in table + fit if line not in notes] == []
    main = [line.split(" | ") for line in table if line.startswith("| 8 blocks") and "as recorded |" not in line]
    assert all(float(cells[-1].split()[0]) > 0 for cells in main)   # every variant behind as recorded on the main pairs
