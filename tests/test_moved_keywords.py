"""A call with a keyword the options objects replaced (docs/api.md "Options") raises one ``TypeError`` naming the
keyword and its replacement, from one table (``satcore.adapter_api.MOVED_KEYWORDS``); the keyword is never
accepted, an unknown one keeps Python's own message, and the wrapped functions keep their signatures."""

from __future__ import annotations

import inspect
import re

import pytest

from satcore import Recipe
from satcore.adapter_api import MOVED_KEYWORDS, moved_keywords

torch_adapter = pytest.importorskip("satcore.adapters.torch")
RECIPE = Recipe("adam", 1e-2, 12, 32)
SEE = "; see docs/api.md#options"


@pytest.mark.parametrize("call, message", [
    (lambda: torch_adapter.decide(None, [], [], None, recipe=RECIPE, max_trials=2),
     "decide() no longer takes max_trials=: pass policy=DecisionPolicy(recipe, trials=TrialSettings(max_trials=2))"),
    (lambda: torch_adapter.decide(None, [], [], recipe=RECIPE, candidates=["layer1"]),
     "decide() no longer takes candidates=: pass policy=DecisionPolicy(recipe, candidates=...)"),
    (lambda: torch_adapter.decide(None, [], [], recipe=RECIPE, family="mlp"),
     "decide() no longer takes family=: pass policy=DecisionPolicy(recipe, probe=ProbeConfig(family='mlp'))"),
    (lambda: torch_adapter.grow_until_saturated(None, [], [], None, recipe=RECIPE),
     "grow_until_saturated() no longer takes recipe=: pass policy=DecisionPolicy(recipe)"),
    (lambda: torch_adapter.grow_until_saturated(None, [], [], None, max_depth=3),
     "grow_until_saturated() no longer takes max_depth=: pass options=GrowthOptions(budget=GrowthBudget(max_depth=3))"),
    (lambda: torch_adapter.grow_until_saturated(None, [], [], None, tolerance=0.01),
     "grow_until_saturated() no longer takes tolerance=: pass options=GrowthOptions(GrowthCriteria(tolerance=0.01))"),
    (lambda: torch_adapter.HFCallback([], decide={"recipe": RECIPE}),
     "HFCallback() no longer takes decide=: pass policy=DecisionPolicy(recipe), train_data=train"),
    (lambda: torch_adapter.HFCallback([], candidates=["layer1"]),
     "HFCallback() no longer takes candidates=: pass config=ProbeConfig(candidates=...)"),
    (lambda: torch_adapter.expand(None, [], blocks=2, budget=0.1),
     "expand() no longer takes budget=: pass options=ExpansionOptions(budget=0.1)"),
    (lambda: torch_adapter.expand(None, [], blocks=2, seed=3),
     "expand() no longer takes seed=: pass policy=DecisionPolicy(recipe, seed=3)"),
])
def test_an_old_keyword_is_one_type_error_naming_its_replacement(call, message):
    with pytest.raises(TypeError) as err:
        call()
    assert str(err.value).startswith(message) and str(err.value).endswith(SEE), str(err.value)


def test_lightning_and_keras_take_the_same_table():
    pytest.importorskip("lightning.pytorch")
    with pytest.raises(TypeError, match=r"^LightningCallback\(\) no longer takes decide=: pass policy="):
        torch_adapter.LightningCallback([], decide={})
    tf_adapter = pytest.importorskip("satcore.adapters.tensorflow")
    with pytest.raises(TypeError, match=r"^decide\(\) no longer takes trials=: pass policy=DecisionPolicy\(recipe, "):
        tf_adapter.decide(None, [], [], recipe=RECIPE, trials=None)
    with pytest.raises(TypeError, match=r"^grow_until_saturated\(\) no longer takes max_rounds=: "):
        tf_adapter.grow_until_saturated(None, [], [], None, max_rounds=2)
    with pytest.raises(TypeError, match=r"^KerasCallback\(\) no longer takes candidates=: pass config=ProbeConfig"):
        tf_adapter.KerasCallback([], candidates=["d"])


def _callback(name):
    if name == "KerasCallback":
        return getattr(pytest.importorskip("satcore.adapters.tensorflow"), name)
    if name == "LightningCallback":
        pytest.importorskip("lightning.pytorch")
    return getattr(torch_adapter, name)


@pytest.mark.parametrize("callback, keyword, value", [
    ("HFCallback", "prefix", "fit/"), ("HFCallback", "eval_prefix", "e"), ("LightningCallback", "prefix", "fit/"),
    ("LightningCallback", "log_candidates", True), ("KerasCallback", "prefix", None)])
def test_a_class_attribute_passed_as_a_keyword_is_one_line_naming_it(callback, keyword, value):
    """A callback's class attribute passed as a keyword (``prefix`` and HFCallback's ``eval_prefix``, keywords
    once; Lightning's ``log_candidates``, the others' keyword) is answered by the one class-attribute line."""
    with pytest.raises(TypeError) as err:
        _callback(callback)([], **{keyword: value})
    assert str(err.value) == (f"{callback}() takes {keyword} as a class attribute, not a keyword: set {keyword} = "
                              f"{value!r} on a subclass or the instance; see help({callback})")


@pytest.mark.parametrize("callback", ["LightningCallback", "KerasCallback"])
def test_a_class_attribute_of_another_callback_keeps_pythons_message(callback):
    """``eval_prefix`` is HFCallback's alone: the others are not told to set an attribute they never read."""
    with pytest.raises(TypeError, match=f"^{callback}.__init__\\(\\) got an unexpected keyword argument 'eval_prefix'$"):
        _callback(callback)([], eval_prefix="e")


def test_an_unknown_keyword_keeps_pythons_message_and_signatures_are_kept():
    with pytest.raises(TypeError, match=r"^decide\(\) got an unexpected keyword argument 'bogus'$"):
        torch_adapter.decide(None, [], [], bogus=1)
    assert list(inspect.signature(torch_adapter.decide).parameters) == ["model", "train", "heldout", "loss_fn",
                                                                         "recipe", "policy", "progress"]
    assert "policy" in inspect.signature(torch_adapter.HFCallback).parameters
    assert "options" in inspect.signature(torch_adapter.expand).parameters
    assert torch_adapter.decide.__doc__.startswith("Where to insert the next block")


def test_a_moved_keyword_is_never_accepted():
    """Decorating a function that still takes a moved keyword (a funnel), or takes ``**kwargs``, is refused."""
    with pytest.raises(AssertionError, match="max_trials"):
        moved_keywords("decide")(lambda model, *, max_trials=4: None)
    with pytest.raises(AssertionError, match="kwargs"):
        moved_keywords("expand")(lambda model, **options: None)


def test_the_table_covers_the_docs_before_column():
    """Every keyword in docs/api.md's migration table (the "before" column) of these functions is in the table."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    rows = re.findall(r"^\| ([A-Za-z_, ]+) \| `([^|]*)` \| ", text, flags=re.M)
    names = {"decide": "decide", "Keras decide": "decide", "grow_until_saturated": "grow_until_saturated",
             "expand": "expand", "HFCallback, LightningCallback": "callback",
             "HFCallback, LightningCallback, KerasCallback": "callback"}
    checked = 0
    for call, before in rows:
        if call not in names:
            continue
        for keyword in re.findall(r"(?<![\w*])([a-z_]+)=", before.replace("`, `", " ")):
            if keyword not in ("recipe",) or names[call] == "grow_until_saturated":
                # a callback's class attribute (prefix, eval_prefix) is answered by its own line, tested above
                held = names[call] == "callback" and keyword in vars(torch_adapter.HFCallback)
                assert keyword in MOVED_KEYWORDS[names[call]] or held, (call, keyword)
                checked += 1
    assert checked > 30
