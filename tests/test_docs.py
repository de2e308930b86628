"""The docs stand alone and stay in step with the code (docs/api.md, docs/core.md).

* every name in ``satcore.__all__`` is listed in docs/api.md, and every name api.md lists as a
  ``satcore`` export exists;
* every file docs/core.md and docs/api.md point to ("implemented in") exists;
* nothing in the code or the docs cites documents outside the repository (a specification's
  sections, research seeds).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import satcore

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api.md").read_text()
CORE = (ROOT / "docs" / "core.md").read_text()


def test_every_export_is_in_the_api_table():
    listed = set(re.findall(r"^\| `([A-Za-z_][A-Za-z0-9_]*)", API, flags=re.M))
    listed |= {n for row in re.findall(r"^\| (`[^|]+`(?:, `[^|]+`)+) \|", API, flags=re.M)
               for n in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row)}
    missing = [n for n in satcore.__all__ if n not in listed]
    assert not missing, f"docs/api.md does not list {missing}"
    exported_section = API.split("## Submodules not re-exported")[0]
    for name in re.findall(r"^\| `([A-Za-z_][A-Za-z0-9_]*)[(`]", exported_section, flags=re.M):
        assert hasattr(satcore, name), f"docs/api.md lists satcore.{name}, which does not exist"


@pytest.mark.parametrize("doc", ["core.md", "api.md"])
def test_implementation_pointers_exist(doc):
    text = (ROOT / "docs" / doc).read_text()
    paths = set(re.findall(r"`((?:satcore|adapters|cli|tests)/[A-Za-z0-9_/]+\.py)`", text))
    assert len(paths) >= 10
    missing = sorted(p for p in paths if not (ROOT / p).is_file())
    assert not missing, f"docs/{doc} points to missing files {missing}"


def test_no_citations_of_documents_outside_the_repository():
    pattern = re.compile("SP" + r"EC (section|identity|\d)|se" + r"ed 00\d")  # split: this file must not match
    hits = []
    for folder in ("satcore", "adapters", "cli", "docs", "tests", "bench", "examples", "studies", "zoo"):
        for path in (ROOT / folder).rglob("*"):
            generated = {"out"} & set(path.relative_to(ROOT).parts)  # examples/out, bench/out: git-ignored outputs
            if path.suffix in (".py", ".md") and not generated and "satcore/adapters" not in str(path) \
                    and "satcore/cli" not in str(path):
                hits += [f"{path.relative_to(ROOT)}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
                         if pattern.search(line)]
    hits += [f"README.md:{i}" for i, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
             if pattern.search(line)]
    assert not hits, hits


def test_readme_types_no_test_counts():
    """Counts of tests drift with every test added ("31 of about 1000" when 1200 were collected): the README
    says how to count them (``pytest --collect-only``) instead of typing a number."""
    readme = (ROOT / "README.md").read_text()
    typed = re.findall(r"\b\d[\d,]*\s+(?:of about\s+\d+|(?:slow\s+)?tests?\b|passed|slow ones)", readme)
    assert typed == []
    assert "pytest --collect-only" in readme
    assert not re.search(r"\babout \d+ tests?\b", readme)


def test_the_readme_leads_with_which_tool_answers_which_question_and_stays_short():
    """The README is the front door: the question-to-tool table first, the details in docs/ (at most 200 lines)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0] == "## Which tool answers which question"
    table = "\n".join(lines[lines.index(headings[0]):lines.index(headings[1])])
    for tool in ("satcore score", "decide(", "grow_until_saturated(", "satcore expand"):
        assert tool in table, tool


def test_the_stop_tolerance_fractions_stated_are_the_shipped_calibrations():
    """predictive-validity.md states each schedule's shipped ``generalization_gap_fraction`` (successive halving's own
    fit has none), read here from the calibrations the package ships."""
    from satcore._decisions.calibration import DEFAULT_CALIBRATION, HALVING_CALIBRATION

    page = " ".join((ROOT / "docs" / "predictive-validity.md").read_text().split())
    stated = (f"`generalization_gap_fraction` (fitted: {DEFAULT_CALIBRATION.generalization_gap_fraction:g} for the "
              f"even plan, {HALVING_CALIBRATION.generalization_gap_fraction:g} for `schedule=\"halving\"`")
    assert stated in page


def test_the_documented_practical_tolerance_runs_and_keeps_the_schedules_calibration():
    """Every page that shows how to state a practical tolerance writes one snippet, ``decide(..., policy=
    DecisionPolicy(recipe, trials=TrialSettings(calibration=decision.calibration, tolerance=...)))``, and one name
    for the shipped calibration before any decision, ``TrialSettings(schedule=...).calibration``; no page names the
    private constants or replaces the calibration's field by hand (the way before ``TrialSettings.tolerance``).  The
    snippet, evaluated as printed beside a decision of ``schedule="halving"``, builds a policy whose calibration is
    that decision's, halving's error model, with the tolerance replaced (the even plan's would swap the error model)."""
    import dataclasses

    from satcore import DecisionPolicy, Recipe, TrialSettings
    from satcore._decisions.calibration import DEFAULT_CALIBRATION, HALVING_CALIBRATION
    from satcore._decisions.trials import CandidateDecision, choose

    pages = [*(ROOT / "docs").glob("*.md"), *(ROOT / "studies").glob("*.md"), ROOT / "README.md",
             *(ROOT / "examples").glob("*.py")]
    texts = {p.relative_to(ROOT).as_posix(): " ".join(p.read_text().split()) for p in pages}
    assert not [name for name, text in texts.items() if "DEFAULT_CALIBRATION" in text or "HALVING_CALIBRATION" in text]
    assert not [name for name, text in texts.items() if re.search(r"dataclasses\.replace\([^`]*tolerance=", text)]
    snippets = {name: re.findall(r"`decide\(\.\.\., policy=([^`]*TrialSettings\([^`]*tolerance=[^`]*)\)`", text)
                for name, text in texts.items()}
    assert {"docs/predictive-validity.md", "studies/decision-validity.md"} <= {n for n, s in snippets.items() if s}
    assert all("`TrialSettings(schedule=...).calibration`" in texts[n] for n, s in snippets.items() if s)
    assert (TrialSettings().calibration, TrialSettings(schedule="halving").calibration) == (DEFAULT_CALIBRATION,
                                                                                             HALVING_CALIBRATION)
    recipe = Recipe("adam", 1e-3, 300, 32)
    decision = choose([CandidateDecision.screen_only("head", -0.1, -0.1)], recipe, 1.0, 0.5, 0,
                      TrialSettings(schedule="halving").calibration)
    for snippet in (s for found in snippets.values() for s in found):
        policy = eval(snippet.replace("tolerance=...", "tolerance=0.003"),  # noqa: S307
                      {"DecisionPolicy": DecisionPolicy, "TrialSettings": TrialSettings, "decision": decision,
                       "recipe": recipe})
        assert policy.trials.calibration == dataclasses.replace(HALVING_CALIBRATION, tolerance=0.003)
        assert policy.trials.calibration != dataclasses.replace(DEFAULT_CALIBRATION, tolerance=0.003)


def test_the_schema_versions_the_docs_name_are_the_shipped_ones():
    """Every ``satcore-report/N``, ``satcore-sweep/N`` and ``satcore-dump-meta/N`` a page names is the ``$id`` of the
    schema that ships (``satcore._io.schemas.json_schema``), except in a "What changed" section, which names the old
    ones on purpose: docs/training-loops.md called the report schema ``satcore-report/1`` after it became ``/2``."""
    from satcore._io.schemas import json_schema

    shipped = {json_schema(kind)["$id"].rsplit("/", 1)[0]: json_schema(kind)["$id"] for kind in
               ("report", "sweep", "dump-meta")}
    wrong = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        history = False
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            if line.startswith("#"):
                history = line.lstrip("#").strip().startswith("What changed")
            for named in re.findall(r"satcore-(?:report|sweep|dump-meta)/\d+", line):
                if not history and named != shipped[named.rsplit("/", 1)[0]]:
                    wrong.append(f"{page.name}:{number}: {named}")
    assert not wrong, wrong


def test_what_the_docs_say_keras_lacks_the_keras_adapter_lacks():
    """A sentence ``Keras has no ...`` names only what ``satcore.adapters.tensorflow`` does not export (docs/core.md
    said Keras had no growth loop while the adapter exports ``grow_until_saturated``, documented in docs/growth.md)."""
    pytest.importorskip("tensorflow")
    import satcore.adapters.tensorflow as keras_adapter

    said = " ".join(" ".join(re.findall(r"Keras has no ([^.;]+)", " ".join(path.read_text().split())))
                    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    lacking = {"growth loop": "grow_until_saturated", "`insert_block`": "insert_block", "`grow`": "grow"}
    claimed = [name for words, name in lacking.items() if words in said]
    assert "insert_block" in claimed  # the sentence is found (docs/core.md's)
    assert not [name for name in claimed if name in keras_adapter.__all__], said


def test_the_score_table_columns_docs_verdicts_names_are_the_printed_ones():
    """docs/verdicts.md lists the columns of ``satcore score``'s table: each is a column of the printed header (the
    page named a ``verdict`` column, whose header reads ``first-order``, the word the legend explains)."""
    from click.testing import CliRunner

    from satcore._rendering.table import LEGEND
    from satcore.cli.main import main

    text = " ".join((ROOT / "docs" / "verdicts.md").read_text().split())
    listed = re.search(r"The text table changed columns \(([^)]+)\)", text)
    assert listed, "docs/verdicts.md no longer lists the table's columns"
    named = re.findall(r"`([^`]+)`", listed.group(1))
    printed = CliRunner().invoke(main, ["score", str(ROOT / "examples" / "digits_resnet.npz"), "--quiet"])
    assert printed.exit_code == 0, printed.output
    header = next(line for line in printed.output.splitlines() if line.startswith("candidate "))
    assert len(named) >= 6 and not [c for c in named if c not in header.split()], (named, header)
    assert not [c for c in named if f"{c} = " not in LEGEND]  # each column it names is one the legend explains


def test_the_score_legend_names_the_pages_that_define_its_columns():
    """The legend under ``satcore score``'s table says where its columns are defined (a newcomer found no way from
    the printed table to the formulas): each page it names exists, with the section it names, and the page's
    section defines what the legend sends there (core.md's Quantities: AG, the growth value, realizability and C;
    verdicts.md: the noise floor, the interval and the verdicts)."""
    from satcore._rendering.table import LEGEND

    cited = dict(re.findall(r"(docs/[a-z-]+\.md)(?:, ([A-Z][a-z]+))?", LEGEND))
    assert cited == {"docs/core.md": "Quantities", "docs/verdicts.md": ""}, cited
    core = (ROOT / "docs" / "core.md").read_text().split("\n## Quantities\n")[1].split("\n## ")[0]
    assert all(f"`{name}(" in core for name in ("ag", "growth_value", "realizability", "cross_gradient"))
    verdicts = (ROOT / "docs" / "verdicts.md").read_text()
    assert all(word in verdicts for word in ("V_floor", "Holm", "**improvable**", "jackknife"))


def test_every_field_a_decision_writes_is_named_in_its_api_row():
    """docs/api.md's InsertionDecision and CandidateDecision rows name every key of their ``to_dict()``: the
    InsertionDecision row once left out ``heldout_samples``, which a stop's JSON carries beside
    ``heldout_samples_needed``."""
    from satcore import Recipe
    from satcore._decisions.trials import Calibration, TrialCurve, choose, verified_candidate

    calibration = Calibration(1.0, 0.0, (0.025, 0.5, 0.975), (-1.96, 0.0, 1.96), 0.5, 0.0, "normal residuals")
    curve = TrialCurve((2, 5, 10), (-0.01, -0.02, -0.03), (-0.01, -0.02, -0.03), 0.01)
    decision = choose([verified_candidate("a", curve, 300, calibration, -1.0)], Recipe("adam", 1e-3, 300, 64),
                      heldout_loss=1.0, training_loss=1.0, cost_block_steps=30, calibration=calibration)
    rows = {row.split("|")[1].strip(): row for row in API.splitlines() if row.startswith("| `")}
    for name, record in (("`InsertionDecision`", decision.to_dict()),
                         ("`CandidateDecision`", decision.candidates["a"].to_dict())):
        named = set(re.findall(r"`(\w+)", rows[name]))  # `candidates[name]` names candidates
        assert set(record) <= named, sorted(set(record) - named)
