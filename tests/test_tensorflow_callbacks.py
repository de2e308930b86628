"""KerasCallback in a real ``fit``: the epoch logs (History, and a CSVLogger after it) hold the satcore
metrics, equal to a probe of the trained model made afterwards with a per-sample loss."""

import csv

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from sklearn.datasets import load_digits  # noqa: E402

from satcore.adapters.tensorflow import KerasCallback, probe  # noqa: E402
from satcore.adapters.tensorflow.callbacks import per_sample_loss  # noqa: E402


def residual_classifier(width=16):
    x_in = keras.Input((64,))
    h = keras.layers.Dense(width, name="stem")(x_in)
    for i in range(2):
        h = keras.layers.Add(name=f"add{i}")([h, keras.layers.Dense(width, activation="tanh", name=f"branch{i}")(h)])
    return keras.Model(x_in, keras.layers.Dense(10, name="head")(h))


def compiled_classifier():
    """``(model, x, y, probe_data)``: the seeded residual classifier compiled with its loss, the digits and two
    held-out batches of them."""
    keras.utils.set_random_seed(0)
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    model = residual_classifier()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, x, y, [(x[1000:1032], y[1000:1032]), (x[1032:1064], y[1032:1064])]


def test_keras_callback_adds_satcore_metrics_to_epoch_logs(tmp_path):
    model, x, y, probe_data = compiled_classifier()
    callback = KerasCallback(probe_data)  # the compiled loss, made per-sample
    history = model.fit(x[:512], y[:512], batch_size=64, epochs=2, verbose=0,
                        callbacks=[callback, keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))])
    logged = history.history["satcore/growth_value_max"]
    assert len(logged) == 2 and logged[0] != logged[1]
    per_sample = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    final = probe(model, probe_data, per_sample).report()
    assert logged[-1] == pytest.approx(final.growth_value_max, rel=1e-6)
    assert [epoch for epoch, _ in callback.reports] == [0, 1]
    # the probe data is the held-out split, as in the PyTorch callbacks: no "probe split not stated" warning
    assert all(report.split == "heldout" and not any("split" in w for w in report.warnings)
               for _, report in callback.reports)
    with open(tmp_path / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["satcore/growth_value_max"]) == pytest.approx(final.growth_value_max, rel=1e-6)
    # the depth-wide keys only by default (fit(verbose=1) prints every key of the epoch's logs)
    assert "satcore/best_candidate_index" in rows[0] and not any(key.endswith("/growth_value") for key in rows[0])


def test_n_features_gives_the_leading_block_of_the_larger_family():
    keras.utils.set_random_seed(0)
    model = residual_classifier()
    rng = np.random.default_rng(0)
    data = [(rng.random((16, 64)).astype(np.float32), rng.integers(0, 10, 16))]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    full = probe(model, data, loss)
    small = probe(model, data, loss, n_features={"add1": 20})
    assert list(full.statistics) == ["add0", "add1"] and small.statistics["add1"].n_features == 20
    assert small.statistics["add0"] == full.statistics["add0"]
    np.testing.assert_allclose(small.statistics["add1"].sum_gram, full.statistics["add1"].sum_gram[:20, :20], rtol=1e-6)


def test_keras_callback_decides_under_a_policy_at_epoch_end():
    """``policy=`` with ``train_data=``: each probed epoch also runs the Keras ``decide`` (the probe data as the
    held-out split, the callback's places): its scalars join the epoch's logs, the report leads with it, and it is
    the decision ``decide`` gives on the model ``fit`` ends with, to the bit."""
    from satcore import DecisionPolicy, InputError, Recipe, TrialSettings
    from satcore.adapters.tensorflow import decide

    model, x, y, probe_data = compiled_classifier()
    train_data = [(x[:64], y[:64]), (x[64:128], y[64:128])]
    policy = DecisionPolicy(Recipe("sgd", 0.1, 4, 64), trials=TrialSettings(max_trials=2))
    callback = KerasCallback(probe_data, policy=policy, train_data=train_data, log_candidates=True)
    history = model.fit(x[:256], y[:256], batch_size=64, epochs=1, verbose=0, callbacks=[callback])
    (_, report), = callback.reports
    assert str(report).splitlines()[1].startswith("decision: ")
    direct = decide(model, train_data, probe_data, per_sample_loss(model.loss), policy=policy)
    assert report.decision.to_dict() == direct.to_dict()
    for key, value in direct.scalars(places=["add0", "add1"]).items():  # choice_index among the callback's places
        assert history.history[key] == [value], key
    for options, message in (({"policy": policy}, "policy= and train_data="), ({"train_data": train_data}, "go together"),
                             ({"policy": Recipe("sgd", 0.1, 4, 64), "train_data": train_data},
                              "policy must be a satcore.DecisionPolicy"),
                             ({"config": {"family": "mlp"}}, "config must be a satcore.adapters.tensorflow.ProbeConfig")):
        with pytest.raises(InputError, match=message):
            KerasCallback(probe_data, **options)


@pytest.mark.parametrize("verbose", [0, 1, 2])
def test_keras_callback_decision_shows_its_bar_where_fit_shows_its_own(capfd, verbose):
    """A decision takes minutes where an epoch's end takes seconds: under ``fit(verbose=1)`` (Keras's progress bar)
    it shows ``decide``'s tqdm bar on stderr, through its trials to the end; under ``verbose=0`` or ``2`` (no bar)
    it is silent (it was silent always: minutes with nothing on the screen between two epochs)."""
    from satcore import DecisionPolicy, Recipe, TrialSettings

    model, x, y, probe_data = compiled_classifier()
    train_data = [(x[:64], y[:64]), (x[64:128], y[64:128])]
    policy = DecisionPolicy(Recipe("sgd", 0.1, 4, 64), trials=TrialSettings(max_trials=2))
    callback = KerasCallback(probe_data, policy=policy, train_data=train_data)
    model.fit(x[:64], y[:64], batch_size=64, epochs=1, verbose=verbose, callbacks=[callback])
    err = capfd.readouterr().err
    assert (callback.reports[0][1].decision is not None) and (("trials: 100%" in err) == (verbose == 1)), err


@pytest.mark.parametrize("verbose", [0, 1, 2])
def test_keras_callback_probe_shows_its_bar_where_fit_shows_its_own(capfd, verbose):
    """The probe at an epoch's end can take longer than the epoch's validation: under ``fit(verbose=1)`` it shows a
    tqdm bar of its batches on stderr, run to its total; under ``verbose=0`` or ``2`` it is silent."""
    model, x, y, probe_data = compiled_classifier()
    callback = KerasCallback(probe_data)
    model.fit(x[:64], y[:64], batch_size=64, epochs=1, verbose=verbose, callbacks=[callback])
    err = capfd.readouterr().err
    assert len(callback.reports) == 1 and ("probe: 100%" in err and " 2/2 " in err) == (verbose == 1), err


@pytest.mark.parametrize("batches", [2, 7])
def test_keras_callback_warns_at_train_begin_where_its_probe_cannot_reach_improvable(batches):
    """Two residual ``Add``s need 7 probe batches before Holm's alpha/2 can be passed: 2 batches warn when ``fit``
    starts, 7 (of the same 64 samples) do not."""
    import warnings

    model, x, y, _ = compiled_classifier()
    edges = np.linspace(1000, 1064, batches + 1).astype(int)
    callback = KerasCallback([(x[a:b], y[a:b]) for a, b in zip(edges[:-1], edges[1:])])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x[:64], y[:64], batch_size=64, epochs=1, verbose=0, callbacks=[callback])
    said = [str(w.message) for w in caught if str(w.message).startswith("KerasCallback: probe_data holds")]
    assert len(callback.reports) == 1
    assert len(said) == (batches == 2) and all("over 2 candidates needs at least 7" in m for m in said), said


def test_keras_callback_refuses_data_it_cannot_read_at_every_epoch_when_built():
    """Probe data and training batches are read at every probed epoch: a generator (exhausted by the first epoch's
    end) or no batches are refused when the callback is built, as the PyTorch callbacks refuse them; a generator
    used to give the first epoch its numbers and fail at the second."""
    from satcore import DecisionPolicy, InputError, Recipe

    _, x, y, probe_data = compiled_classifier()
    policy = DecisionPolicy(Recipe("sgd", 0.1, 4, 64))
    for data, options, message in (
            (iter(probe_data), {}, "KerasCallback's probe_data is a one-shot iterator"),
            ([], {}, "KerasCallback's probe_data holds no batches"),
            (probe_data, {"policy": policy, "train_data": iter(probe_data)}, "KerasCallback's train_data is a one-shot"),
            (probe_data, {"policy": policy, "train_data": []}, "KerasCallback's train_data holds no batches"),
            # Keras' own validation_data=(x, y) form: one batch, read as batches of its parts after an epoch
            ((x[:64], y[:64]), {}, r"KerasCallback's probe_data is one batch \(a pair \(inputs, targets\) or a "
                                   r"mapping\); pass an iterable of batches, e.g. \[batch\]"),
            (probe_data, {"policy": policy, "train_data": (x[:64], y[:64])}, "KerasCallback's train_data is one batch")):
        with pytest.raises(InputError, match=f"^{message}"):
            KerasCallback(data, **options)
    dataset = tf.data.Dataset.from_tensor_slices((x[:64], y[:64])).batch(32)  # re-iterable: taken
    assert KerasCallback(dataset).probe_data is dataset


@pytest.mark.parametrize("options", [{"config": "absent"}, {"policy": "absent"}])
def test_keras_callback_refuses_a_place_the_model_lacks_before_the_first_step(options):
    """A candidate the model does not have (the probe's, or the decision's) is refused when training starts, before
    the first step; it was found at the first epoch's end, after a whole epoch of training."""
    from satcore import DecisionPolicy, ProbeError, Recipe
    from satcore.adapters.tensorflow import ProbeConfig

    model, x, y, probe_data = compiled_classifier()
    if "config" in options:
        callback = KerasCallback(probe_data, config=ProbeConfig(candidates=["add0", "absent"]))
    else:
        callback = KerasCallback(probe_data, policy=DecisionPolicy(Recipe("sgd", 0.1, 4, 64), candidates=["absent"]),
                                 train_data=probe_data)
    steps = []
    with pytest.raises(ProbeError, match=r"^candidates: 'absent': 'absent' is not a layer name of "):
        model.fit(x[:128], y[:128], batch_size=64, epochs=1, verbose=0,
                  callbacks=[callback, keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: steps.append(batch))])
    assert steps == [] and callback.reports == []
