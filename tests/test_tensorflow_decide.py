"""``satcore.adapters.tensorflow.decide`` decides as the torch ``decide`` does on the same model and data.

One tiny residual MLP is built in PyTorch (seeded) and in Keras 3 with the same weights copied in; both
frameworks probe the same digits batches, screen with the same feature maps and run the core's decision
loop, each training its own zero-output block with the same recipe.  Each minibatch is the whole training
split (``batch_size`` = its samples), so both frameworks' trials take the same full-batch steps whatever
order their generators draw.  The independent reference of each framework's numbers is the other
framework: the Keras block computes its update in float64, the torch one in float32, so they agree to
float32 round-off, propagated through the trial's steps (the tolerance below); the choice, the stop reason,
the cost and which candidates were verified or eliminated are equal.
"""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
keras = pytest.importorskip("keras")
pytest.importorskip("tensorflow")

from zoo.models_keras import keras_mlp  # noqa: E402
from zoo.models_torch import ResidualMLP, digits, per_sample_ce  # noqa: E402

from satcore import DecisionPolicy, InputError, ProbeError, Recipe, TrialSettings  # noqa: E402
from satcore.adapters.tensorflow import decide as keras_decide  # noqa: E402
from satcore.adapters.tensorflow.decide import RecipeOptimizer  # noqa: E402
from satcore.adapters.torch import ProbeConfig as TorchProbeConfig  # noqa: E402
from satcore.adapters.torch import decide as torch_decide  # noqa: E402

WIDTH, DEPTH = 8, 2
TORCH_NAMES = [f"blocks.{i}" for i in range(DEPTH)]
KERAS_NAMES = [f"b{i}_add" for i in range(DEPTH)]
EPS32 = float(np.finfo(np.float32).eps)


def _models():
    torch.manual_seed(0)
    net = ResidualMLP(WIDTH, DEPTH).eval()
    return net, keras_mlp(net)


def _batches(start, n, batch):
    X, y = digits()
    X, y = X[start : start + n].reshape(n, 64), y[start : start + n]
    return [(X[i : i + batch], y[i : i + batch]) for i in range(0, n, batch)]


def _as_numpy(batches):
    return [(x.numpy(), y.numpy()) for x, y in batches]


def _keras_ce():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


@pytest.mark.parametrize("optimizer, lr, schedule", [("sgd", 0.5, "even"), ("adam", 3e-2, "halving")])
def test_keras_decide_equals_torch_decide_on_the_same_weights_and_data(optimizer, lr, schedule):
    net, model = _models()
    train, heldout = _batches(0, 64, 32), _batches(1200, 64, 32)
    recipe = Recipe(optimizer, lr, 16, 64)  # every minibatch the whole training split
    mine = torch_decide(net, train, heldout, per_sample_ce, policy=DecisionPolicy(recipe, trials=TrialSettings(max_trials=DEPTH, schedule=schedule), candidates=TORCH_NAMES, seed=1))
    theirs = keras_decide(model, _as_numpy(train), _as_numpy(heldout), _keras_ce(), policy=DecisionPolicy(recipe, trials=TrialSettings(max_trials=DEPTH, schedule=schedule), seed=1))
    assert list(theirs.candidates) == [KERAS_NAMES[TORCH_NAMES.index(n)] for n in mine.candidates]
    assert theirs.stop_reason == mine.stop_reason and theirs.cost_block_steps == mine.cost_block_steps
    # the unexpanded model's losses: one float32 forward pass each
    loss_scale = max(1.0, mine.heldout_loss)
    assert theirs.heldout_loss == pytest.approx(mine.heldout_loss, rel=0, abs=4 * EPS32 * loss_scale)
    assert theirs.training_loss == pytest.approx(mine.training_loss, rel=0, abs=4 * EPS32 * loss_scale)
    # the stop tolerance: the shipped share of the gap between the two
    tolerance = mine.calibration.generalization_gap_fraction * 8 * EPS32 * loss_scale
    assert theirs.stop_tolerance == pytest.approx(mine.stop_tolerance, rel=0, abs=tolerance)
    # the evaluation and each step add the float32 round-off of one forward and backward pass (a few eps32
    # relative to the loss) to the trained block, which carries it to the losses: linear in the steps taken
    steps = mine.cost_block_steps
    curve_tol = 4 * EPS32 * loss_scale * (1 + steps)
    calibration = mine.calibration
    for torch_name, keras_name in zip(TORCH_NAMES, KERAS_NAMES):
        a, b = mine.candidates[torch_name], theirs.candidates[keras_name]
        assert (a.verified, a.eliminated) == (b.verified, b.eliminated)
        assert a.trial.steps == b.trial.steps
        np.testing.assert_allclose(b.trial.heldout_change, a.trial.heldout_change, rtol=0, atol=curve_tol)
        np.testing.assert_allclose(b.trial.training_change, a.trial.training_change, rtol=0, atol=curve_tol)
        # the prediction is d(T) + beta [d(T) - d(T/2)] log2(S/T): each of its three terms within curve_tol
        doublings = max(0.0, math.log2(recipe.steps / a.trial.steps[-1]))
        predicted_tol = curve_tol * (1 + 2 * abs(calibration.trend_weight) * doublings)
        assert b.predicted_heldout_change == pytest.approx(a.predicted_heldout_change, rel=0, abs=predicted_tol)
        assert abs(a.trial.heldout_change[-1]) > 100 * curve_tol  # the trial moved the loss: not a comparison of 0s
    chosen = {mine.choice, None if theirs.choice is None else TORCH_NAMES[KERAS_NAMES.index(theirs.choice)]}
    assert len(chosen) == 1, (mine.choice, theirs.choice)
    predictions = sorted(c.predicted_heldout_change for c in mine.candidates.values())
    assert predictions[1] - predictions[0] > 2 * curve_tol  # the choice is not a tie within round-off


@pytest.mark.parametrize("heldout_samples, stop_reason", [(16, "heldout_too_small"), (512, "gain_below_tolerance")])
def test_keras_decide_says_as_torch_does_how_much_held_out_data_resolves_a_stop(heldout_samples, stop_reason):
    """The stop of tests/test_decide.py's resolution test (SGD at lr 0.5, 16 full-batch steps, a practical tolerance
    of 0.09 of the held-out loss), in both frameworks: on 16 held-out samples the held-out data cannot resolve it,
    on 512 it does; the same stop reason, the half-width within the trials' float32 round-off (as above) times
    1.96, and the same held-out samples needed (a ceiling of ``n (h / |d + eps|)^2``, 51 here, far from an
    integer's round-off)."""
    net, model = _models()
    train, heldout = _batches(0, 64, 32), _batches(1200, heldout_samples, min(heldout_samples, 64))
    trials = TrialSettings(max_trials=DEPTH, tolerance=0.09)
    recipe = Recipe("sgd", 0.5, 16, 64)
    mine = torch_decide(net, train, heldout, per_sample_ce,
                        policy=DecisionPolicy(recipe, trials=trials, candidates=TORCH_NAMES, seed=1))
    theirs = keras_decide(model, _as_numpy(train), _as_numpy(heldout), _keras_ce(),
                          policy=DecisionPolicy(recipe, trials=trials, seed=1))
    assert mine.stop_reason == theirs.stop_reason == stop_reason
    assert theirs.heldout_samples_needed == mine.heldout_samples_needed
    # the trial the stop rests on, kept on the decision: the same block in both
    assert theirs.heldout_binding_candidate == KERAS_NAMES[TORCH_NAMES.index(mine.heldout_binding_candidate)]
    assert (mine.heldout_samples_needed is None) == (stop_reason != "heldout_too_small")
    tol = 1.96 * 4 * EPS32 * max(1.0, mine.heldout_loss) * (1 + mine.cost_block_steps)
    assert theirs.heldout_resolution == pytest.approx(mine.heldout_resolution, rel=0, abs=tol)


def test_the_recipe_optimizer_steps_as_torch_optim_does():
    """:class:`RecipeOptimizer` against ``torch.optim`` in float64 on the same parameter and gradients: SGD and Adam
    with an L2 penalty, AdamW with decoupled decay, five steps each, equal to float64 round-off."""
    rng = np.random.default_rng(0)
    start, grads = rng.normal(size=(3, 4)), rng.normal(size=(5, 3, 4)) * np.logspace(-6, 0, 4)
    for name, optimizer in (("sgd", torch.optim.SGD), ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)):
        recipe = Recipe(name, 1e-2, 5, 1, weight_decay=0.1)
        p = torch.tensor(start, requires_grad=True)
        reference = optimizer([p], lr=recipe.lr, weight_decay=recipe.weight_decay)
        mine, value = RecipeOptimizer(recipe), start
        for g in grads:
            p.grad = torch.tensor(g)
            reference.step()
            value = mine.step(value, g)
            np.testing.assert_allclose(value, p.detach().numpy(), rtol=64 * np.finfo(float).eps, atol=0)


@pytest.mark.parametrize("optimizer, dtype, lr, weight_decay, refused_step", [
    ("adam", "float32", 1e38, 0.0, "1e+39"),  # Adam's first step is 10 lr: past float32's 3.4e38
    ("adamw", "float16", 1e4, 0.0, "100000"),  # past float16's 65504
    ("sgd", "float32", 1e-3, 1e39, "1e+39"),  # the weight decay itself
    ("adam", "float64", 1e308, 0.0, "inf"),  # the Keras block's own dtype: 10 lr is past float64's 1.8e308
    ("adam", "float64", 1e300, 0.0, None),  # float64 holds 1e301: the trials report the divergence
    ("sgd", "float32", 1e30, 0.0, None),
])
def test_the_recipe_optimizer_refuses_an_lr_past_the_parameters_range_as_torch_does(optimizer, dtype, lr,
                                                                                    weight_decay, refused_step):
    """NumPy turns a step scalar past the parameter's dtype into inf (one RuntimeWarning) where torch stops with
    its overflow error: both refuse the recipe before the first step, in the same words, naming the lr."""
    from satcore.adapters.torch.decide import recipe_optimizer

    recipe = Recipe(optimizer, lr=lr, steps=1, batch_size=1, weight_decay=weight_decay)
    p = np.ones(3, dtype)
    with np.errstate(all="raise"):  # an accepted step computes without overflow
        if refused_step is None:
            assert np.isfinite(RecipeOptimizer(recipe).step(p, p)).all()
            return
        with pytest.raises(InputError) as keras_refusal:
            RecipeOptimizer(recipe).step(p, p)
    assert str(keras_refusal.value) == (f"recipe: lr {lr:g} (weight_decay {weight_decay:g}) makes optimizer steps of up "
                                        f"to {refused_step}, past the {dtype} parameters' range "
                                        f"{np.finfo(dtype).max:g}; lower the lr (--lr)")
    with pytest.raises(InputError) as torch_refusal:
        recipe_optimizer(recipe, [torch.nn.Parameter(torch.ones(3, dtype=getattr(torch, dtype)))])
    assert str(torch_refusal.value) == str(keras_refusal.value)


@pytest.mark.parametrize("framework, lr, refusal", [
    # the Keras block is float64, which holds Adam's first step of 1e301: the trial reports the divergence
    ("keras", 1e300, "the trial at 'b1_add' diverged: its held-out loss is not finite after 1 adam steps at lr "
                     "1e+300; lower the recipe's lr"),
    ("torch", 1e300, "recipe: lr 1e+300 (weight_decay 0) makes optimizer steps of up to 1e+301, past the float32 "
                     "parameters' range 3.40282e+38; lower the lr (--lr)"),
    # past float64: refused before the screen, whose step would be infinite
    ("keras", 1e308, "recipe: lr 1e+308 (weight_decay 0) makes optimizer steps of up to inf, past the float64 "
                     "parameters' range 1.79769e+308; lower the lr (--lr)"),
])
def test_decide_at_a_huge_lr_refuses_in_one_line_after_a_screen_without_overflow(framework, lr, refusal):
    """The screen prices the recipe's step (near 1e300) before any trial: its held-out interval and step norm
    overflowed, so NumPy's RuntimeWarnings printed before the refusal.  Now the refusal is all that is said."""
    import warnings

    net, model = _models()
    train, heldout = _batches(0, 64, 32), _batches(1200, 64, 32)
    policy = DecisionPolicy(Recipe("adam", lr, 4, 64), trials=TrialSettings(max_trials=1),
                            candidates=TORCH_NAMES if framework == "torch" else None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the call instead of printing
        with pytest.raises(InputError) as refused:
            if framework == "keras":
                keras_decide(model, _as_numpy(train), _as_numpy(heldout), _keras_ce(), policy=policy)
            else:
                torch_decide(net, train, heldout, per_sample_ce, policy=policy)
    assert str(refused.value) == refusal


def test_keras_decide_records_the_family_its_trials_trained_as_resolved_per_candidate():
    """A family per candidate: ``linear`` named at the first residual ``Add``, ``"auto"`` left at the second,
    which resolves by its stream's rank (``mlp`` for vectors; the reference reads the rank off the Keras graph,
    the ``Add`` layer's inputs).  The decision records each trial's resolved family and the requested
    ``"per candidate"``, in its JSON and its printed line, as the torch ``decide`` does."""
    from satcore.adapters.tensorflow import ProbeConfig

    _, model = _models()
    train, heldout = _as_numpy(_batches(0, 64, 32)), _as_numpy(_batches(1200, 64, 32))
    ranks = {name: len(model.get_layer(name).input[0].shape) for name in KERAS_NAMES}
    families = {KERAS_NAMES[0]: "linear", KERAS_NAMES[1]: "conv" if ranks[KERAS_NAMES[1]] == 4 else "mlp"}
    assert families[KERAS_NAMES[1]] == "mlp"
    policy = DecisionPolicy(Recipe("sgd", 0.5, 4, 64), trials=TrialSettings(max_trials=DEPTH),
                            probe=ProbeConfig(family={KERAS_NAMES[0]: "linear"}))
    d = keras_decide(model, train, heldout, _keras_ce(), policy=policy)
    assert {n: c.trial_family for n, c in d.candidates.items()} == families
    back = d.to_dict()
    assert back["requested_family"] == d.requested_family == "per candidate"
    assert {n: c["trial_family"] for n, c in back["candidates"].items()} == families
    trained = "; ".join(f"{families[n]} branch at {n}" for n in d.candidates)  # the screen's order
    assert str(d).splitlines()[1] == f"trials trained: {trained} (family per candidate)"


def test_keras_decide_reads_the_compiled_loss_per_sample():
    """``loss_fn=None`` takes the compiled model's loss with ``reduction=None``: the decision of the explicit
    per-sample loss, to the bit (the same arithmetic)."""
    _, model = _models()
    train, heldout = _as_numpy(_batches(0, 64, 32)), _as_numpy(_batches(1200, 64, 32))
    recipe, trials = Recipe("sgd", 0.5, 4, 64), TrialSettings(max_trials=1)
    explicit = keras_decide(model, train, heldout, _keras_ce(), policy=DecisionPolicy(recipe, trials=trials))
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    compiled = keras_decide(model, train, heldout, policy=DecisionPolicy(recipe, trials=trials))
    assert compiled.to_dict() == explicit.to_dict()


def test_keras_decide_refuses_what_it_cannot_decide_on():
    """A recipe training the whole block (Keras' feature map is fixed), a batch mean, one batch instead of a list,
    no loss on an uncompiled model, trial settings that are not ``TrialSettings`` and a misspelt keyword are
    refused before any trial, naming the argument."""
    _, model = _models()
    train, heldout = _as_numpy(_batches(0, 64, 32)), _as_numpy(_batches(1200, 64, 32))
    with pytest.raises(InputError, match="pass loss_fn"):
        keras_decide(model, train, heldout, recipe=Recipe("sgd", 0.1, 4, 32))
    with pytest.raises(InputError, match="policy: trials must be a satcore.TrialSettings"):
        DecisionPolicy(Recipe("sgd", 0.1, 4, 32), trials={"max_trials": 2})
    with pytest.raises(InputError, match="policy: probe must be a satcore.adapters.tensorflow.ProbeConfig"):
        keras_decide(model, train, heldout, _keras_ce(),
                     policy=DecisionPolicy(Recipe("sgd", 0.1, 4, 32), probe=TorchProbeConfig()))
    with pytest.raises(InputError, match="max_statistics_bytes probes the candidates in passes"):
        keras_decide(model, train, heldout, _keras_ce(),
                     policy=DecisionPolicy(Recipe("sgd", 0.1, 4, 32), max_statistics_bytes=10**6))
    with pytest.raises(InputError, match="trainable='terminal'"):
        keras_decide(model, train, heldout, _keras_ce(), recipe=Recipe("sgd", 0.1, 4, 32, "block"))
    with pytest.raises(InputError, match="0-d loss"):
        keras_decide(model, train, heldout, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     recipe=Recipe("sgd", 0.1, 4, 32))
    with pytest.raises(InputError, match="the held-out data is one batch"):
        keras_decide(model, train, heldout[0], _keras_ce(), recipe=Recipe("sgd", 0.1, 4, 32))
    with pytest.raises(TypeError, match=r"^decide\(\) no longer takes max_trials=: pass policy=DecisionPolicy\(recipe, "
                                        r"trials=TrialSettings\(max_trials=2\)\); see docs/api.md#options$"):
        keras_decide(model, train, heldout, _keras_ce(), recipe=Recipe("sgd", 0.1, 4, 32), max_trials=2)
    with pytest.raises(TypeError, match=r"decide\(\) got an unexpected keyword argument 'max_trails'"):
        keras_decide(model, train, heldout, _keras_ce(), recipe=Recipe("sgd", 0.1, 4, 32), max_trails=2)


@pytest.mark.parametrize("framework", ["torch", "keras"])
@pytest.mark.parametrize("split, given, expect", [
    ("train", "endless", "decide: the training data: more than 65,536 batches (an endless iterator?); pass a finite "
                         "list of batches"),
    ("heldout", None, "decide: the held-out data: not an iterable of batches, got NoneType"),
])
def test_decide_reads_a_split_in_bounded_work_or_refuses_it(framework, split, given, expect):
    """Keras' decide read a split with list(data): an endless iterator was read until memory ran out (torch's stopped
    at MAX_DATA_BATCHES), and None was a bare TypeError; both decides now read through one bounded reader."""
    net, model = _models()
    data = {"train": _batches(0, 64, 32), "heldout": _batches(1200, 64, 32)}
    if framework == "keras":
        data = {name: _as_numpy(batches) for name, batches in data.items()}
    data[split] = itertools.repeat(data[split][0]) if given == "endless" else given
    with pytest.raises(InputError) as refused:
        if framework == "torch":
            torch_decide(net, data["train"], data["heldout"], per_sample_ce, recipe=Recipe("sgd", 0.1, 4, 32))
        else:
            keras_decide(model, data["train"], data["heldout"], _keras_ce(), recipe=Recipe("sgd", 0.1, 4, 32))
    assert str(refused.value) == expect


@pytest.mark.parametrize("inputs, reason", [
    (np.array([object()] * 32), "(Failed to convert a NumPy array to a Tensor (Unsupported object type object).)"),
    (None, "(Attempt to convert a value (None) with an unsupported type (<class 'NoneType'>) to a Tensor.)"),
    (np.float32(1.0), "slice index 0 of dimension 0 out of bounds"),  # a scalar: no sample axis
])
def test_keras_decide_refuses_inputs_tensorflow_cannot_take_as_a_batch(inputs, reason):
    """Counting a batch's samples converted its inputs to a tensor outside any refusal: an object array, None or a
    scalar escaped as TensorFlow's ValueError or InvalidArgumentError; now one InputError naming split and batch."""
    _, model = _models()
    train, heldout = _as_numpy(_batches(0, 64, 32)), _as_numpy(_batches(1200, 64, 32))
    train[1] = (inputs, train[1][1])
    with pytest.raises(InputError) as refused:
        keras_decide(model, train, heldout, _keras_ce(), recipe=Recipe("sgd", 0.1, 4, 32))
    message = str(refused.value)
    assert message.startswith("decide: training data: batch 1: inputs TensorFlow cannot take as a batch (")
    assert reason in message and "\n" not in message


BAD_BATCHES = {  # the split, the bad batch's index and how it is spoilt; each run of the model or its loss fails
    "inputs of another width": ("train", 1, lambda x, y: (x[:, :5], y)),
    "fewer targets than inputs": ("heldout", 0, lambda x, y: (x, y[:-1])),
}


@pytest.mark.parametrize("framework", ["torch", "keras"])
@pytest.mark.parametrize("case", list(BAD_BATCHES))
def test_decide_refuses_a_batch_the_model_cannot_take_naming_the_split_and_batch(framework, case):
    """A batch whose inputs or targets the model or loss cannot take is one ``ProbeError`` line naming the split and
    the batch, with the framework's own first line, before any probe or trial (both decides used to raise the
    framework's exception from evaluating the unexpanded model's losses), as the probe refuses it."""
    split, index, spoil = BAD_BATCHES[case]
    net, model = _models()
    data = {"train": _batches(0, 64, 32), "heldout": _batches(1200, 64, 32)}
    data[split][index] = spoil(*data[split][index])
    recipe = Recipe("sgd", 0.1, 4, 32)
    shown = {"train": "the training data", "heldout": "the held-out data"}[split]
    calls = []

    def counting(loss):
        def counted(*args):
            calls.append(1)
            return loss(*args)
        return counted

    if framework == "torch":
        run = lambda: torch_decide(net, data["train"], data["heldout"], counting(per_sample_ce), recipe=recipe)  # noqa: E731
    else:
        data = {name: _as_numpy(batches) for name, batches in data.items()}
        run = lambda: keras_decide(model, data["train"], data["heldout"], counting(_keras_ce()), recipe=recipe)  # noqa: E731
    with pytest.raises(ProbeError) as refused:
        run()
    message = str(refused.value)
    assert message.startswith(f"decide: {shown}: batch {index}: the model or loss_fn cannot take it (")
    assert "\n" not in message
    # refused while reading the unexpanded losses: the held-out split first, then the training split, no probe
    assert len(calls) <= (2 if split == "heldout" else 2 + index)


@pytest.mark.parametrize("entry", ["decide", "grow_until_saturated", "KerasCallback(policy=...)"])
def test_a_model_grow_cannot_rebuild_is_refused_before_any_probe(entry):
    """A Sequential model (whose graph grow cannot rebuild) is refused by the Keras decision's entry points before
    any probe or training step, with one line naming the entry point and how to make the model functional:
    decide used to probe both splits first and fail in grow, after a probe refusal that said 'pass candidates'."""
    from satcore import GrowthCriteria, GrowthOptions
    from satcore.adapters.tensorflow import KerasCallback, ProbeConfig, grow_until_saturated

    _, functional = _models()
    sequential = keras.Sequential(functional.layers)  # the same layers, as a Sequential
    train, heldout = _as_numpy(_batches(0, 64, 32)), _as_numpy(_batches(1200, 64, 32))
    calls = []

    def counted(y, p):
        calls.append(1)
        return _keras_ce()(y, p)

    recipe = Recipe("sgd", 0.1, 4, 32)
    with pytest.raises(InputError) as refused:
        if entry == "decide":
            keras_decide(sequential, train, heldout, counted, policy=DecisionPolicy(recipe, candidates=["dense"]))
        elif entry == "grow_until_saturated":
            grow_until_saturated(sequential, lambda model, k: model, heldout, counted,
                                 options=GrowthOptions(GrowthCriteria(tolerance=1e-3)))
        else:
            sequential.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            x, y = train[0]
            sequential.fit(x, y, epochs=1, verbose=0, callbacks=[
                KerasCallback(heldout, counted, policy=DecisionPolicy(recipe), train_data=train,
                              config=ProbeConfig(candidates=["dense"]))])
    assert str(refused.value) == (f"{entry}: grow needs a functional Keras model; Sequential is not one (a subclassed "
                                  "model's graph cannot be rebuilt; a Sequential's can: keras.Model(model.inputs, "
                                  "model.outputs))")
    assert calls == []  # no probe, no epoch's end


# 2 training and 2 held-out batches (E = 4): the model's evaluation 4 and the probe's 4, then trials of the 2
# candidates on the recipe's 16 steps.  Even: 8 steps each, read at 2, 4, 8: 2 (8 + 3 * 4) = 40.  Halving: 4 steps
# each, read at 1, 2, 3, 4 (3 is one of 12's checkpoints); the finalist on to 4 + (16 - 8) = 12, read at 6 and 12:
# 16 steps, (2 * 4 + 2) * 4 = 40 batches read.
@pytest.mark.parametrize("schedule, total", [("even", 4 + 4 + 40), ("halving", 4 + 4 + 16 + 40)])
def test_keras_decide_counts_its_batches_of_work_and_decides_the_same(schedule, total):
    _, model = _models()
    train, heldout = _as_numpy(_batches(0, 64, 32)), _as_numpy(_batches(1200, 64, 32))
    policy = DecisionPolicy(Recipe("sgd", 0.5, 16, 64), trials=TrialSettings(max_trials=DEPTH, schedule=schedule),
                            seed=1)
    increments = []
    counted = keras_decide(model, train, heldout, _keras_ce(), policy=policy, progress=increments.append)
    silent = keras_decide(model, train, heldout, _keras_ce(), policy=policy)
    assert counted.cost_block_steps == 16 and all(c.verified for c in counted.candidates.values())
    assert set(increments) == {1} and len(increments) == total
    assert counted.to_dict() == silent.to_dict() and counted.choice == silent.choice
    with pytest.raises(InputError, match="decide: progress must be True, False or a callable"):
        keras_decide(model, train, heldout, _keras_ce(), policy=policy, progress="yes")


def test_keras_decides_bar_shows_each_phases_total_from_when_it_is_named(capsys):
    """``progress=True``: the model's evaluation and the probe each read both splits once (E = 4 batches): their
    bar shows ``k/4`` then ``k/8`` from when the phase is named (once "probe: 6batch", no total until the trials)."""
    _, model = _models()
    train, heldout = _as_numpy(_batches(0, 64, 32)), _as_numpy(_batches(1200, 64, 32))
    policy = DecisionPolicy(Recipe("sgd", 0.5, 4, 64), trials=TrialSettings(max_trials=DEPTH), seed=1)
    capsys.readouterr()
    keras_decide(model, train, heldout, _keras_ce(), policy=policy, progress=True)
    segments = [part for part in capsys.readouterr().err.replace("\n", "\r").split("\r") if ":" in part]
    for phase, phase_total in [("model", 4), ("probe", 8)]:
        shown = [part for part in segments if part.startswith(f"{phase}:")]
        assert shown and all(re.search(rf"\| \d+/{phase_total} \[", part) for part in shown), shown



    """What docs/adapters.md says a user must match for the two decisions to agree: left to find the places, the torch
    ``decide`` screens and trials every block and the ``head``, the Keras one every residual ``Add`` (no head), so the
    recipe's steps are split among one more trial in torch and the trials' lengths differ; naming torch's blocks
    (``candidates=``) gives Keras's places, ``blocks.i`` as ``b{i}_add``."""
    net, model = _models()
    train, heldout = _batches(0, 64, 32), _batches(1200, 64, 32)
    policy = DecisionPolicy(Recipe("adam", 3e-2, 12, 64), trials=TrialSettings(max_trials=DEPTH + 1), seed=1)
    mine = torch_decide(net, train, heldout, per_sample_ce, policy=policy)
    theirs = keras_decide(model, _as_numpy(train), _as_numpy(heldout), _keras_ce(), policy=policy)
    assert sorted(mine.candidates) == sorted(TORCH_NAMES + ["head"]) and sorted(theirs.candidates) == KERAS_NAMES
    assert mine.candidates["blocks.0"].trial.steps[-1] == 12 // (DEPTH + 1)
    assert theirs.candidates["b0_add"].trial.steps[-1] == 12 // DEPTH
