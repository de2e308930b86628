"""The core reads in the order the data flows: statistics -> scores -> decisions -> results.

* no function of the core or the adapters takes more than 8 parameters (ast count);
* the sums and scores modules import no decision module; no import circle among the core's modules
  (imports inside functions included); the front-ends import the core only through ``satcore`` and
  ``satcore.adapter_api``; the module paths of earlier releases still import, as the same modules;
* scores compute their fold tests on request, once, and a report under other
  criteria reuses them (no re-scoring);
* the fast sign-flip enumeration counts exactly what the plain one does;
* verdicts are a str Enum whose JSON is unchanged; the CLI shows a one-line error only
  for satcore's own refusals.
"""

from __future__ import annotations

import ast
import json
import math
import pathlib

import numpy as np
import pytest

import satcore
from satcore import Criteria, Prop1Options, Verdict
from satcore._formulas import folds

CORE = pathlib.Path(satcore.__file__).parent
FRONT_ENDS = ("adapters", "cli")  # symlinks in a checkout, subpackages when installed
CORE_FILES = sorted(p for p in CORE.rglob("*.py") if p.relative_to(CORE).parts[0] not in FRONT_ENDS)
MAX_PARAMETERS = 8
ROUTE_RTOL = 256 * np.finfo(np.float64).eps  # two float64 routes to one k x k Gram's quadratic forms (k <= 16)


def _parameters(node: ast.FunctionDef) -> int:
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args]
    count = len(names) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return count - (names[:1] in (["self"], ["cls"]))


def _over_eight(root: pathlib.Path, files) -> list[str]:
    return [f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name} ({_parameters(node)})"
            for path in files for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _parameters(node) > MAX_PARAMETERS]


def test_no_core_function_takes_more_than_eight_parameters():
    assert len(CORE_FILES) > 30  # the layer folders are walked, not only the package's top level
    assert not _over_eight(CORE, CORE_FILES)


# the three training-loop callbacks' constructors, at 9: the callback's own keywords (its schedule, report, decision,
# log_candidates and dump_dir), which a framework's user passes where they build the callback, as its own
# ModelCheckpoint's; the probe's settings travel as one ProbeConfig
CALLBACK_CONSTRUCTORS = {"torch/trainer_callback.py": 9, "torch/lightning_callback.py": 9,
                         "tensorflow/callbacks.py": 9}


def test_no_adapter_function_takes_more_than_eight_parameters():
    """The adapters are held to the core's limit, the callbacks' constructors excepted (at 9, no more): a
    decision's options travel as one frozen :class:`satcore.DecisionPolicy`, a growth run's as
    :class:`satcore.GrowthOptions`, an expansion's as ``ExpansionOptions``, a probe's as its ``ProbeConfig`` (the 11
    functions over 8 before them, the option funnels among them, are gone).  The click commands of ``cli/`` are not
    held to it: click passes one parameter per flag."""
    root = CORE.resolve().parent
    files = sorted((root / "adapters").rglob("*.py"))
    assert len(files) > 40 and {"torch", "tensorflow", "onnx"} <= {p.parts[-2] for p in files}
    over = _over_eight(root, files)
    excepted = [f"adapters/{path}:" for path in CALLBACK_CONSTRUCTORS]
    constructors = [line for line in over if line.startswith(tuple(excepted)) and " __init__ (" in line]
    assert not [line for line in over if line not in constructors]
    assert sorted((line.split(":")[0].removeprefix("adapters/"), int(line.rsplit("(", 1)[1][:-1]))
                  for line in constructors) == sorted(CALLBACK_CONSTRUCTORS.items())


def _is_click_command(node: ast.FunctionDef) -> bool:
    """Decorated ``@<group>.command(...)`` or ``@click.command(...)`` (click passes one parameter per flag)."""
    return any(isinstance(d, ast.Call) and getattr(d.func, "attr", None) in ("command", "group")
               for d in node.decorator_list)


def test_no_command_line_helper_takes_more_than_eight_parameters():
    """The command line's own functions are held to the limit too; its click commands are the exemption."""
    root = CORE.resolve().parent
    files = sorted((root / "cli").rglob("*.py"))
    over = [f"{path.name}:{node.lineno} {node.name} ({_parameters(node)})"
            for path in files for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _parameters(node) > MAX_PARAMETERS
            and not _is_click_command(node)]
    commands = [node.name for path in files for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.FunctionDef) and _is_click_command(node) and _parameters(node) > MAX_PARAMETERS]
    assert "expand" in commands and "probe" in commands  # the exemption sees the long click commands
    assert not over, over


def test_the_parameter_count_sees_a_long_signature():
    """The count the test above relies on, on a signature of 9 (and self, which does not count)."""
    node = ast.parse("def f(self, a, b=1, *c, d, e=2, **g): pass\ndef h(a, b, c, d, e, f, g, h, i): pass").body
    assert [_parameters(n) for n in node] == [6, 9]


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(CORE).with_suffix("").parts
    return ".".join(("satcore",) + (parts[:-1] if parts[-1] == "__init__" else parts))


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"


def _imports(path: pathlib.Path, *, top_level_only: bool = False) -> set[str]:
    """Absolute names a file imports (a ``from x import y`` gives both ``x`` and ``x.y``), outside
    ``if TYPE_CHECKING`` blocks (annotations only); with ``top_level_only``, only those run when it loads."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if _is_type_checking(node):
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif not top_level_only:
            todo.extend(ast.iter_child_nodes(node))
    return out


def _core_import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in CORE_FILES}
    # every module reaches the others through the package ``satcore`` itself: that edge is not a layer's
    return {m: {t for t in _imports(p) if t in modules and t not in (m, "satcore")} for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, stack, found = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_core_has_no_import_circle():
    graph = _core_import_graph()
    assert "satcore._scores.scores" in graph["satcore._decisions.reporting"]  # relative imports across folders resolve
    assert not _cycles(graph), _cycles(graph)


def test_the_cycle_search_finds_a_circle_through_a_lazy_import():
    """What the test above relies on: a circle closed by an import inside a function is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    lazy = ast.parse("def f():\n    from .reporting import depth_report\n")
    assert any(isinstance(n, ast.ImportFrom) and n.module == "reporting" for n in ast.walk(lazy))


def test_front_ends_import_the_core_only_through_its_namespace_and_adapter_api():
    root = CORE.resolve().parent
    wrong = []
    for folder in FRONT_ENDS:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module
                         else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                for name in names:
                    core = name.split(".")[:2]
                    if core[0] == "satcore" and len(core) > 1 and core[1] not in ("adapters", "cli", "adapter_api"):
                        wrong.append(f"{folder}/{path.relative_to(root / folder)}:{node.lineno} {name}")
    assert not wrong, wrong
    import satcore.adapter_api as api

    assert set(api.__all__) == {n for n in vars(api) if not n.startswith("_")} - {"annotations"}


@pytest.mark.parametrize(("old", "new"), [("satcore.results", "satcore._scores.scores"),
                                          ("satcore.decision", "satcore._decisions.trials"),
                                          ("satcore.statistics", "satcore._statistics.candidate"),
                                          ("satcore._atomic", "satcore._io.atomic")])
def test_the_module_paths_of_earlier_releases_import_the_same_modules(old, new):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        moved = importlib.import_module(old)
    assert moved is importlib.import_module(new) and moved.__spec__.name == new


@pytest.mark.parametrize("module", ["_statistics/moments.py", "_statistics/candidate.py", "_statistics/depth.py",
                                    "_scores/scores.py"])
def test_sums_and_scores_import_no_decision(module):
    imports = _imports(CORE / module)
    assert not {i for i in imports if i.startswith("satcore._decisions")}


def _depth(rng, signals, n=96, batch=6):
    depth = satcore.DepthStatistics()
    for i, s in enumerate(signals):
        Q = rng.normal(size=(n, 1, 3)) + s
        Psi = rng.normal(size=(n, 1, 4)) + 1.0
        depth[f"b{i}"] = satcore.CandidateStatistics.from_samples(Q, Psi, batch_size=batch)
    return depth


def test_scores_compute_fold_tests_on_request_and_reports_reuse_them(monkeypatch):
    rng = np.random.default_rng(0)
    depth = _depth(rng, [0.0, 0.5])
    calls = []
    real = folds.fold_test
    monkeypatch.setattr(folds, "gram_fold_test", lambda *a, real_gram=folds.gram_fold_test, **k:
                        calls.append(1) or real_gram(*a, **k))
    scores = depth.score()
    assert calls == []  # scoring alone runs no test (its sign-flip p-value is the expensive part)
    strict = scores.report(Criteria(alpha=0.01), split="heldout")
    assert len(calls) == 2  # one growth-metric test per candidate
    loose = scores.report(Criteria(alpha=0.2, tolerance=1e-3), split="heldout")
    assert len(calls) == 2  # another alpha reads the same tests
    for a, b in zip(strict.tests, loose.tests):
        assert a.p_value == b.p_value and a.growth_value_sq_unbiased == b.growth_value_sq_unbiased
    # the same numbers as a report made in one call with the keyword shorthand
    direct = depth.report(alpha=0.01, split="heldout")
    assert [t.p_value_adjusted for t in direct.tests] == [t.p_value_adjusted for t in strict.tests]
    assert direct.verdict == strict.verdict
    # the lazily computed test is the one fold_test gives on the statistics' own sums
    s = depth["b1"]
    eager = real(s.fold_cross, s.fold_samples)
    lazy = scores["b1"].fold_test_euclidean
    # the score forms the fold Grams from the sums by its own route (a triangular whitening, not fold_test's):
    # the same statistic to float64 round-off of a k x k Gram's quadratic forms (k <= 16 folds)
    assert lazy.n_folds == eager.n_folds and lazy.p_value == pytest.approx(eager.p_value, rel=ROUTE_RTOL)
    for field in ("statistic", "unbiased", "se"):
        assert getattr(lazy, field) == pytest.approx(getattr(eager, field), rel=ROUTE_RTOL), field


def test_a_score_keeps_its_own_copy_of_the_fold_sums():
    """An incremental probe goes on adding batches after a look; the look's tests must not see them."""
    rng = np.random.default_rng(1)
    stats = satcore.CandidateStatistics(3, 4)
    stats.update(rng.normal(size=(40, 1, 3)) + 0.3, rng.normal(size=(40, 1, 4)))
    stats.update(rng.normal(size=(40, 1, 3)) + 0.3, rng.normal(size=(40, 1, 4)))
    score = stats.score("x")
    # what the score keeps of the folds is k x k (the Grams the tests read), not the (m, N, r) sums: a probe of
    # many wide candidates would otherwise hold m N r doubles per candidate in its scores
    k = int((stats.fold_samples > 0).sum())
    kept = score.fold_sums
    assert kept.gram.shape == kept.gram_euclidean.shape == (k, k) and kept.weights.shape == (k,)
    before = folds.fold_test(stats.fold_cross.copy(), stats.fold_samples.copy()).unbiased
    stats.update(rng.normal(size=(40, 1, 3)) - 5.0, rng.normal(size=(40, 1, 4)))
    assert score.fold_test_euclidean.unbiased == pytest.approx(before, rel=ROUTE_RTOL)


def test_options_objects_and_their_keyword_shorthand_agree_and_refuse_mixing():
    rng = np.random.default_rng(2)
    depth = _depth(rng, [0.2, 0.0])
    a = depth.report(Criteria(alpha=0.1, tolerance=0.05), prop1=Prop1Options(t=0.2), split="heldout")
    b = depth.report(alpha=0.1, tolerance=0.05, t=0.2, split="heldout")
    assert a.to_dict() == b.to_dict()
    with pytest.raises(TypeError, match="not both"):
        depth.report(Criteria(), alpha=0.1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'alhpa'"):
        depth.report(alhpa=0.1)
    with pytest.raises(satcore.InputError, match=r"alpha must be in \(0, 1\), got 1.5"):
        Criteria(alpha=1.5)
    with pytest.raises(satcore.InputError, match="rho must be a finite number > 0"):
        Criteria(rho=0.0)
    with pytest.raises(satcore.InputError, match="tolerance must be a finite number >= 0"):
        Criteria(tolerance=math.nan)


@pytest.mark.parametrize("m", [2, 3, 5, 8, 13, 16, 20])
def test_split_sign_flip_enumeration_counts_what_every_pattern_gives(m):
    """The two-halves enumeration against the plain one (a quadratic form per pattern)."""
    rng = np.random.default_rng(m)
    for shift in (0.0, 0.4, 2.0)[: 3 if m <= 16 else 1]:  # the reference costs 2^(m-1) quadratic forms
        X = rng.normal(size=(m, 5)) + shift
        G, w = X @ X.T, rng.random(m) + 0.1
        w /= w.sum()
        A = G * np.outer(w, w)
        np.fill_diagonal(A, 0.0)
        codes = np.arange(2 ** (m - 1))
        eps = np.concatenate([np.ones((codes.size, 1)), 1.0 - 2.0 * ((codes[:, None] >> np.arange(m - 1)) & 1)],
                             axis=1)
        values = np.einsum("pa,ab,pb->p", eps, A, eps)
        expected = np.count_nonzero(values >= A.sum() - 1e-12 * np.abs(A).sum()) / codes.size
        assert folds.sign_flip_p_value(G, w) == (expected, True)
    # exact ties: with G = 0 every pattern ties with the observed statistic
    assert folds.sign_flip_p_value(np.zeros((m, m)), np.full(m, 1 / m)) == (1.0, True)


def test_verdicts_are_a_str_enum_with_unchanged_json():
    assert Verdict.IMPROVABLE == "improvable" and f"{Verdict.SATURATED}" == "saturated"
    assert json.dumps({"v": Verdict.INCONCLUSIVE}) == '{"v": "inconclusive"}'
    rng = np.random.default_rng(3)
    report = _depth(rng, [0.0, 0.6]).report(split="heldout")
    assert report.verdict.verdict is Verdict.IMPROVABLE
    assert json.loads(json.dumps(report.to_dict()))["verdict"]["verdict"] == "improvable"


def test_one_best_candidate_in_every_output():
    """The decision's best candidate, not the largest raw growth value, is what every output names."""
    rng = np.random.default_rng(4)
    depth = satcore.DepthStatistics()
    # b0: a strong mean on few samples' worth of noise; b1: noise only but larger raw V (more features)
    depth["b0"] = satcore.CandidateStatistics.from_samples(rng.normal(size=(96, 1, 2)) + 0.8,
                                                           rng.normal(size=(96, 1, 2)) + 1.0, batch_size=6)
    depth["b1"] = satcore.CandidateStatistics.from_samples(rng.normal(size=(96, 1, 40)) * 3,
                                                           rng.normal(size=(96, 1, 30)), batch_size=6)
    report = depth.report(split="heldout")
    assert report.argmax == "b1" and report.best_candidate == "b0"  # the two differ here
    assert report.to_dict()["best_candidate"] == report.verdict.best_candidate == "b0"
    assert [r["best_candidate"] for r in report.to_records()] == [True, False]
    assert report.scalars()["satcore/best_candidate_index"] == 0.0
    text = str(report)
    assert "best candidate: b0" in text and "not a recommendation" in text


def test_best_candidate_is_named_so_only_when_a_candidate_passed_the_test():
    """With no candidate improvable, the text names the largest estimate as such, not as a "best candidate"."""
    rng = np.random.default_rng(6)
    improvable = _depth(rng, [0.0, 0.6]).report(split="heldout")
    assert improvable.verdict.verdict is Verdict.IMPROVABLE
    assert "best candidate: " in str(improvable)
    noise = _depth(rng, [0.0, 0.0]).report(split="heldout")
    assert noise.verdict.verdict is not Verdict.IMPROVABLE
    text = str(noise)
    assert "best candidate: " not in text
    assert f"largest unbiased V^2 (no candidate passed the test): {noise.verdict.best_candidate}" in text


def test_with_no_candidate_improvable_the_pick_and_the_largest_raw_value_are_told_apart():
    """The verdict's pick is the largest unbiased ``V^2``; the line above it names where the largest raw ``V``
    is.  Where the two differ, calling both "the largest estimate" names two places for one phrase."""
    report = _depth(np.random.default_rng(5), [0.0, 0.0]).report(split="heldout")
    assert report.verdict.verdict is not Verdict.IMPROVABLE
    unbiased = {t.name: t.growth_value_sq_unbiased for t in report.tests}
    assert report.verdict.best_candidate == max(unbiased, key=unbiased.get) == "b0" and report.argmax == "b1"
    text = str(report)
    assert "largest growth value (the raw estimate, not a recommendation): V " in text and " at b1;" in text
    assert "largest estimate" not in text
    assert "largest unbiased V^2 (no candidate passed the test): b0" in text


def test_beside_a_decision_the_first_order_pick_is_not_called_best():
    """A report led by a trial decision ("decision: insert a block at b0") names the verdict's pick the largest
    first-order value, which the decision may overrule, not the "best candidate" (the two read as contradicting
    each other where they differ)."""
    import dataclasses

    from satcore._decisions.calibration import DEFAULT_CALIBRATION
    from satcore._decisions.trials import CandidateDecision, TrialCurve, choose

    rng = np.random.default_rng(6)
    report = _depth(rng, [0.0, 0.6]).report(split="heldout")
    assert report.verdict.verdict is Verdict.IMPROVABLE and report.verdict.best_candidate == "b1"
    curve = TrialCurve((1, 2), (0.0, -0.1), (0.0, -0.1), 0.01)
    decision = choose([CandidateDecision("b0", -0.1, -0.1, (-0.2, -0.05), 0.9, -0.1, curve)],
                      satcore.Recipe("adam", 1e-3, 300, 16, "block"), 1.0, 1.0, 300,
                      DEFAULT_CALIBRATION)
    text = str(dataclasses.replace(report, decision=decision))
    assert "decision: insert a block at b0" in text and "best candidate: " not in text
    assert "largest first-order value (the decision above, from trials of your recipe, may choose elsewhere): b1" in text


def test_each_noise_floor_is_named_by_its_unit_in_every_output():
    rng = np.random.default_rng(5)
    report = _depth(rng, [0.0, 0.3]).report(split="heldout")
    c = report.candidates[0]
    record = report.to_records()[0]
    assert record["growth_noise_floor"] == c.growth_noise_floor == satcore.growth_noise_floor(c)
    assert record["noise_floor"] == c.noise_floor == math.sqrt(c.sigma_sq / c.n_samples)
    assert report.scalars()[f"satcore/{c.name}/growth_noise_floor"] == c.growth_noise_floor
    assert c.growth_noise_floor != pytest.approx(c.noise_floor)  # two units, two numbers
    text = str(report)
    assert "V_floor" in text and "C_floor" in text and "JSON growth_noise_floor" in text


def test_the_table_says_why_a_point_estimate_lies_outside_its_interval():
    rng = np.random.default_rng(6)
    report = _depth(rng, [0.0, 0.0]).report(split="heldout")
    outside = [t.name for t, c in zip(report.tests, report.candidates)
               if not t.growth_value_interval[0] <= c.growth_value <= t.growth_value_interval[1]]
    assert outside  # under H0 the raw V sits above the population V's interval
    assert f"V lies outside V_interval at {', '.join(outside)}" in str(report)
    assert "first-order verdict:" in str(report)


def test_the_cli_shows_one_line_for_satcore_errors_and_a_traceback_for_bugs(monkeypatch, capsys):
    from satcore.cli import main as cli_main

    def refuse(*args, **kwargs):
        raise satcore.InputError("a refusal")

    def bug(*args, **kwargs):
        raise ValueError("an internal bug")

    for fake, code in ((refuse, 2), (bug, None)):
        monkeypatch.setattr(cli_main.score, "callback", fake)
        if code is None:
            with pytest.raises(ValueError, match="an internal bug"):
                cli_main.main(["score", "x.npz"])
        else:
            with pytest.raises(SystemExit) as exit_info:
                cli_main.main(["score", "x.npz"])
            assert exit_info.value.code == 2
            assert capsys.readouterr().err == "satcore: error: a refusal\n"


@pytest.mark.parametrize("batch_size", [None, 7, 40])
@pytest.mark.parametrize("shape", [(83, 1, 3, 4), (50, 5, 4, 6)])
def test_from_samples_in_one_pass_equals_adding_batch_by_batch(batch_size, shape):
    """from_samples sums all samples at once; update() batch by batch is the reference (to round-off)."""
    M, T, N, r = shape
    rng = np.random.default_rng(M + T)
    Q, Psi = rng.normal(size=(M, T, N)) + 0.2, rng.normal(size=(M, T, r))
    fast = satcore.CandidateStatistics.from_samples(Q, Psi, batch_size=batch_size, curvature=True)
    slow = satcore.CandidateStatistics(N, r, T, variance=True, curvature=True)
    step = batch_size or -(-M // 16)
    for s in range(0, M, step):
        slow.update(Q[s : s + step], Psi[s : s + step])
    if batch_size is None:  # one batch for eq. (2)
        slow.sum_batch_grad_norm, slow.n_batches = math.sqrt(slow.sum_q_sq) / M, 1
    a, b = fast.to_arrays(), slow.to_arrays()
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-12, atol=1e-12 * float(np.abs(b[key]).max()), err_msg=key)
    assert fast.n_batches == slow.n_batches and fast.n_vectors == slow.n_vectors == M * T
    np.testing.assert_array_equal(fast.fold_samples, slow.fold_samples)


def test_a_decision_is_shown_above_the_first_order_table_and_in_json():
    """The report leads with the insertion decision when it carries one (the fields of InsertionDecision)."""
    from dataclasses import dataclass, replace

    @dataclass(frozen=True)
    class Candidate:
        predicted_heldout_change: float
        interval: tuple
        p_decrease: float

    @dataclass(frozen=True)
    class Decision:
        choice: str | None
        stop_reason: str | None
        candidates: dict
        cost_block_steps: int

        def to_dict(self):
            return {"choice": self.choice, "stop_reason": self.stop_reason, "cost_block_steps": self.cost_block_steps}

    rng = np.random.default_rng(7)
    report = _depth(rng, [0.3, 0.0]).report(split="heldout")
    decision = Decision("b1", None, {"b0": Candidate(0.02, (-0.01, 0.05), 0.2),
                                     "b1": Candidate(-0.04, (-0.07, -0.01), 0.97)}, 600)
    text = str(replace(report, decision=decision))
    assert text.index("decision: insert a block at b1 (decision cost: 600 block-steps)") < text.index("V_floor")
    assert text.index("decision:") < text.index("first-order verdict:")
    assert replace(report, decision=decision).to_dict()["decision"]["choice"] == "b1"
    stop = str(replace(report, decision=replace(decision, choice=None, stop_reason="held-out knee")))
    assert "decision: stop (held-out knee)" in stop
    # without one it says that statistics alone make no decision, and the JSON has no decision key
    from satcore._rendering.table import NO_DECISION
    assert "decision" not in report.to_dict() and str(report).splitlines()[1] == NO_DECISION
    assert NO_DECISION not in text and "decision: insert" not in str(report)
