"""Hostile and careless arguments to ``satcore expand`` and the Python ``decide`` / ``grow`` entry points, a round
after those of ``test_hostile_checkpoints.py``: each must end in exit status 2 (``InputError`` in Python) with ONE
line naming the argument or file and what is wrong, no traceback, nothing written.
"""

from __future__ import annotations

import os
import re

import numpy as np

import pytest
from click.testing import CliRunner

from satcore import InputError
from satcore.cli.main import main
from test_hostile_inputs import assert_one_line


def refused(result, *expect):
    assert result.exit_code == 2, (result.output, result.exception)
    assert_one_line(result.stderr, expect)


@pytest.mark.parametrize("kind", ["missing", "file", "fifo"])
def test_a_model_dir_that_is_no_folder_is_named_for_what_it_is(kind, tmp_path):
    """MODEL_DIR that does not exist, or is a file or a FIFO: before, each read 'not a directory', which sent the
    user looking for a folder where there was nothing, or a file they had given by mistake."""
    pytest.importorskip("torch")
    model = tmp_path / "model"
    if kind == "file":
        model.write_text("{}")
    elif kind == "fifo":
        os.mkfifo(model)
    data = tmp_path / "corpus.txt"
    data.write_text("hello world\n")
    out = tmp_path / "o"
    expect = {"missing": "does not exist (a Hugging Face model folder is expected)",
              "file": "is a file, not a Hugging Face model folder",
              "fifo": "is a FIFO, not a Hugging Face model folder"}[kind]
    refused(CliRunner().invoke(main, ["expand", str(model), "--data", str(data), "--blocks", "1", "-o", str(out)]),
            f"{model}: {expect}")
    assert not out.exists()
    from satcore.adapters.torch.checkpoint_dir import load_causal_lm

    with pytest.raises(InputError, match=f"^{model}: {expect.split(' (')[0]}"):
        load_causal_lm(model)


@pytest.fixture(scope="module")
def mlp_probe():
    """A small residual MLP on digits and its probe result (blocks.0, blocks.1, head)."""
    torch = pytest.importorskip("torch")
    from satcore.adapters.torch import probe
    from zoo.models_torch import ResidualMLP, digits, per_sample_ce

    X, y = digits()
    torch.manual_seed(0)
    model = ResidualMLP()
    return model, probe(model, [(X[i : i + 32], y[i : i + 32]) for i in range(0, 128, 32)], per_sample_ce)


def test_grow_at_a_candidate_the_probe_lacks_is_an_input_error(mlp_probe):
    """grow(model, result, 'nope'): before, a bare ValueError, which a caller catching satcore's InputError (as the
    command line does) did not catch; now an InputError naming the argument, as the TensorFlow adapter's."""
    from satcore.adapters.torch import grow

    model, result = mlp_probe
    with pytest.raises(InputError, match=r"^at: unknown candidate 'nope'; the probe has \['blocks\.0', 'blocks\.1', "
                                         r"'head'\]$"):
        grow(model, result, "nope", rho=0.1)


@pytest.mark.parametrize("step, expect", [
    (dict(alpha=float("nan")), r"^alpha must be a finite number, got nan$"),
    (dict(alpha=float("inf")), r"^alpha must be a finite number, got inf$"),
    (dict(rho=float("inf")), r"^rho must be a finite number, got inf$"),
    (dict(alpha="0.1"), r"^alpha must be a finite number, got '0\.1' \(str\)$"),
    (dict(alpha=1e308), r"^alpha 1e\+308: the block's weights -alpha C K\^\+ pass float64's range; give a smaller "
                        r"step$"),
])
def test_grow_refuses_a_step_that_gives_weights_of_nan_or_inf(step, expect, mlp_probe):
    """grow(alpha=nan) and grow(rho=inf) returned a model whose new block held NaN or infinite weights and a NaN or
    -inf predicted change, without a word; alpha=1e308 printed NumPy's overflow RuntimeWarning and did the same.  Each
    is one line naming the step now (warnings are errors here), and the model is not copied.  A negative step stays
    (the reverse of the fitted block, which examples/pretrained_llm.py checks): its predicted change is the positive
    step's, negated."""
    import warnings

    from satcore.adapters.torch import grow

    model, result = mlp_probe
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=expect):
            grow(model, result, "blocks.0", **step)
        forward, backward = grow(model, result, "blocks.0", alpha=0.5), grow(model, result, "blocks.0", alpha=-0.5)
    assert backward.predicted_change == pytest.approx(-forward.predicted_change, rel=1e-12)
    assert forward.predicted_change < 0


@pytest.mark.parametrize("call, expect", [
    (lambda s: s.matched_projection(np.ones((2, 1)), np.eye(1), float("nan")), r"^alpha must be a finite number"),
    (lambda s: s.predicted_loss_change(np.ones((2, 1)), np.eye(1), float("-inf")), r"^alpha must be a finite number"),
    (lambda s: s.alpha_for_relative_update(float("nan"), 1.0, 0.5), r"^rho must be a finite number, got nan$"),
    (lambda s: s.alpha_for_relative_update(0.1, -1.0, 0.5), r"^stream_rms must be >= 0, got -1"),
    (lambda s: s.alpha_for_relative_update(1e300, 1e300, 0.5), r"^rho 1e\+300: its step rho \|\|z\|\|_S / V \(1e\+300 x 1e\+300 / 0\.5\) passes float64's range$"),
    (lambda s: s.matched_projection(np.full((2, 1), 1e200), np.eye(1), 1e200), r"^alpha 1e\+200: the block's "),
])
def test_insertion_formulas_refuse_steps_out_of_range(call, expect):
    """The public formulas behind grow(): a NaN or infinite step, or one whose weights pass float64's range, is one
    line; before, they returned NaN or inf arrays (the last with NumPy's RuntimeWarning).  Warnings are errors."""
    import warnings

    import satcore

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=expect):
            call(satcore)


def test_an_exhausted_iterator_is_named_as_one_and_the_split_as_its_own(mlp_probe):
    """A generator read once already (passed to a second call) reads as empty: decide and probe_splits said only 'no
    batches', and probe_splits said 'data', not which of its two splits; each now names the split and asks whether
    the iterator was read to its end.  An empty list keeps the plain line."""
    from satcore import Recipe
    from satcore.adapters.torch import decide, probe_splits
    from zoo.models_torch import digits, per_sample_ce

    model, _ = mlp_probe
    X, y = digits()
    train = [(X[i : i + 32], y[i : i + 32]) for i in range(0, 128, 32)]
    heldout = (batch for batch in train)
    list(heldout)
    exhausted = r" \(an iterator, already read to its end\? pass a list of batches, which can be read again\)"
    with pytest.raises(InputError, match=rf"^decide: the held-out data yielded no batches{exhausted}$"):
        decide(model, train, heldout, per_sample_ce, recipe=Recipe("adam", 1e-3, 40, 16, "block"))
    with pytest.raises(InputError, match=rf"^the held-out data yielded no batches{exhausted}: nothing was probed$"):
        probe_splits(model, train, heldout, per_sample_ce)
    with pytest.raises(InputError, match=r"^the held-out data yielded no batches: nothing was probed$"):
        probe_splits(model, train, [], per_sample_ce)


def test_a_module_named_twice_or_under_its_second_name_is_named_as_such(mlp_probe):
    """decide/probe candidates naming one place twice said 'names must be distinct and not head' (which one?); a
    module registered under a second name (model.alias = model.blocks[0]) was 'not a submodule name', though
    model.alias is one: each is named now, with the name to give."""
    import copy

    from satcore import DecisionPolicy, Recipe
    from satcore.adapters.torch import decide, probe
    from zoo.models_torch import digits, per_sample_ce

    model, _ = mlp_probe
    X, y = digits()
    data = [(X[i : i + 32], y[i : i + 32]) for i in range(0, 64, 32)]
    policy = DecisionPolicy(Recipe("adam", 1e-3, 40, 16, "block"), candidates=["blocks.0", "blocks.0"])
    with pytest.raises(InputError, match=r"^candidate 'blocks\.0' is named twice in \['blocks\.0', 'blocks\.0'\]; "
                                         r"name each place once$"):
        decide(model, data, data, per_sample_ce, policy=policy)
    aliased = copy.deepcopy(model)
    aliased.alias = aliased.blocks[0]
    for names in (["alias"], ["blocks.1", "alias"]):
        with pytest.raises(InputError, match=r"^candidate 'alias' is the module 'blocks\.0' under a second name \(one "
                                             r"module registered twice\); name it 'blocks\.0'$"):
            probe(aliased, data, per_sample_ce, candidates=names)
    with pytest.raises(InputError, match=r"^candidate 'nope' is not a submodule name of ResidualMLP"):
        probe(aliased, data, per_sample_ce, candidates=["nope"])


def test_onnx_candidate_named_twice_is_named_in_the_torch_words(tmp_path):
    """The ONNX probe said 'candidate names must be distinct: [...]' where torch names the repeat; one helper
    (refuse_named_twice) words it for every adapter."""
    pytest.importorskip("onnxruntime")
    from satcore.adapters.onnx import OnnxProbeError, Probe
    from test_onnx_cli import residual_mlp, weights

    model = residual_mlp(tmp_path / "m.onnx", weights())  # its blocks are named after their skips: h0, h1
    with pytest.raises(OnnxProbeError, match=r"^candidate 'h1' is named twice in \['h1', 'h0', 'h1'\]; "
                                             r"name each place once$"):
        Probe(model, candidates=["h1", "h0", "h1"])


def test_tensorflow_candidate_named_twice_is_named_in_the_torch_words():
    """The Keras probe said 'candidates must be distinct: [...]' for a name given twice; it now names it as torch
    and ONNX do. Two names tapping one tensor keep a refusal of their own, in ONNX's words."""
    keras = pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    from satcore import ProbeError
    from satcore.adapters.tensorflow import Candidate, Probe

    x = keras.Input((4,))
    h = keras.layers.Dense(4, name="embed")(x)
    block = keras.layers.Dense(4, activation="tanh", name="block")(h)
    model = keras.Model(x, keras.layers.Dense(3, name="out")(keras.layers.Add(name="add")([h, block])))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    with pytest.raises(ProbeError, match=r"^candidate 'block' is named twice in \['block', 'out', 'block'\]; "
                                         r"name each place once$"):
        Probe(model, loss, candidates=["block", "out", "block"])
    with pytest.raises(ProbeError, match=r"^candidates \['block', 'again'\] name one tensor twice$"):
        Probe(model, loss, candidates=["block", Candidate("again", "block", "input")])


@pytest.mark.parametrize("split, value, expect", [
    ("probe_data", "spent", "probe_data is a one-shot iterator (a generator?): it is read at every evaluation"),
    ("probe_data", None, "probe_data: not an iterable of batches, got NoneType"),
    ("heldout_data", [], "heldout_data holds no batches"),
    ("heldout_data", "spent", "heldout_data is a one-shot iterator"),
    ("train_data", "spent", "train_data is a one-shot iterator"),
])
def test_grow_until_saturated_refuses_data_it_cannot_read_every_round(split, value, expect, mlp_probe):
    """grow_until_saturated reads probe_data (and heldout_data, train_data) every round: a generator already read
    gave 'data yielded no batches' (which data?), one read in round 1 would be empty in round 2, heldout_data=[] was
    taken (the guard then measured nothing), and probe_data=None raised a bare TypeError.  Each is refused before
    any round, in the words of the training-loop callbacks."""
    from satcore import GrowthCriteria, GrowthOptions
    from satcore.adapters.torch import grow_until_saturated
    from zoo.models_torch import digits, per_sample_ce

    model, _ = mlp_probe
    X, y = digits()
    data = [(X[i : i + 32], y[i : i + 32]) for i in range(0, 64, 32)]
    if value == "spent":
        value = (batch for batch in data)
        list(value)
    splits = {"probe_data": data, split: value}
    trained = []
    with pytest.raises(InputError, match=rf"^grow_until_saturated's {re.escape(expect)}"):
        grow_until_saturated(model, lambda m, r: trained.append(r) or m, loss_fn=per_sample_ce,
                             options=GrowthOptions(GrowthCriteria(tolerance=0.01)), **splits)
    assert trained == []
