"""Callbacks in real runs: a transformers Trainer (TensorBoard event file read back with tensorboard's
own reader) and a Lightning Trainer, each on a small model; the logged values equal a probe of the
model's final weights made afterwards (so the callback probed the model it was handed, at that step)."""

import glob
import re
import warnings

import pytest
import torch

from satcore import DecisionPolicy, Recipe, TrialSettings
from satcore._shared.errors import InputError, ProbeError
from satcore.adapters.torch import ProbeConfig, probe
from test_torch_hf import SENTENCES, causal_lm, tokenizer

torch.set_num_threads(1)


def collated(texts):
    from transformers import DataCollatorForLanguageModeling

    collate = DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    return collate([{"input_ids": ids} for ids in tokenizer()(texts)["input_ids"]])


def test_trainer_callback_writes_satcore_metrics_to_logs_and_tensorboard(tmp_path, monkeypatch):
    pytest.importorskip("accelerate")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from satcore.adapters.torch import HFCallback

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    model = causal_lm().float().train()
    lines = [" ".join(SENTENCES[i:] + SENTENCES[:i]) for i in range(len(SENTENCES))] * 2
    train = [{"input_ids": ids} for ids in tokenizer()(lines)["input_ids"]]
    probe_data = [collated(SENTENCES[:3]), collated(SENTENCES[3:])]  # padded, labels -100 at the pads
    callback = HFCallback(probe_data, log_candidates=True)  # the per-candidate keys too
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=5,
                             per_device_eval_batch_size=5, eval_strategy="steps", eval_steps=2, logging_steps=2,
                             save_strategy="no", report_to=["tensorboard"], use_cpu=True, disable_tqdm=True,
                             learning_rate=1e-3, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=train[:5],
                      data_collator=DataCollatorForLanguageModeling(tokenizer(), mlm=False), callbacks=[callback])
    trainer.train()
    assert [step for step, _ in callback.reports] == [2, 4]
    evaluations = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert [e["step"] for e in evaluations] == [2, 4]
    assert all("satcore/growth_value_max" in e and "satcore/transformer.h.1/growth_value" in e for e in evaluations)
    final = probe(model, probe_data).report()
    assert evaluations[-1]["satcore/growth_value_max"] == pytest.approx(final.growth_value_max, rel=1e-6)
    assert evaluations[0]["satcore/growth_value_max"] != evaluations[-1]["satcore/growth_value_max"]  # it trained

    files = glob.glob(str(tmp_path / "tb" / "**" / "events.out.tfevents.*"), recursive=True)
    assert files
    events = EventAccumulator(files[0])
    events.Reload()
    tag = "train/satcore/growth_value_max"  # the Trainer's TensorBoard logger puts non-eval_ keys under train/
    assert tag in events.Tags()["scalars"]
    written = events.Scalars(tag)
    assert [w.step for w in written] == [2, 4]
    assert written[-1].value == pytest.approx(final.growth_value_max, rel=1e-6)


def test_lightning_callback_logs_satcore_metrics_at_validation_end(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    import csv

    from zoo import models_torch as mt
    from satcore.adapters.torch import LightningCallback

    class Digits(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = mt.DigitsResNet()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    x, y = mt.digits()
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:256], y[:256]), batch_size=64)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[256:320], y[256:320]), batch_size=64)
    probe_data = mt.digits_batches(8, 2)
    module, callback = Digits(), LightningCallback(probe_data, mt.per_sample_ce, config=ProbeConfig(head=False))
    callback.log_candidates = True  # the per-candidate keys too, as a ModelCheckpoint monitoring one needs
    trainer = pl.Trainer(max_epochs=2, callbacks=[callback], logger=pl.loggers.CSVLogger(str(tmp_path)),
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1, num_sanity_val_steps=1)
    trainer.fit(module, train, val)
    assert [step for step, _ in callback.reports] == [4, 8]  # 4 batches an epoch; not the sanity check
    final = probe(module, probe_data, mt.per_sample_ce, head=False).report()
    assert float(trainer.callback_metrics["satcore/growth_value_max"]) == pytest.approx(final.growth_value_max, rel=1e-6)
    (path,) = glob.glob(str(tmp_path / "**" / "metrics.csv"), recursive=True)
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r.get("satcore/growth_value_max")]
    assert len(rows) == 2 and "satcore/net.layer2.1/growth_value" in rows[0]
    assert float(rows[-1]["satcore/growth_value_max"]) == pytest.approx(final.growth_value_max, rel=1e-6)
    assert float(rows[0]["satcore/growth_value_max"]) != float(rows[1]["satcore/growth_value_max"])


def trainer_with(tmp_path, callback, model=None, **options):
    """A real ``Trainer`` on the small causal LM (or ``model``), evaluating (and saving) every 2 steps."""
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    model = causal_lm().float().train() if model is None else model
    lines = [" ".join(SENTENCES[i:] + SENTENCES[:i]) for i in range(len(SENTENCES))] * 2
    train = [{"input_ids": ids} for ids in tokenizer()(lines)["input_ids"]]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=5,
                             per_device_eval_batch_size=5, eval_strategy="steps", eval_steps=2, logging_steps=2,
                             report_to=[], use_cpu=True, learning_rate=1e-3, seed=0, **{"disable_tqdm": True} | options)
    return model, Trainer(model=model, args=args, train_dataset=train, eval_dataset=train[:5],
                          data_collator=DataCollatorForLanguageModeling(tokenizer(), mlm=False), callbacks=[callback])


def test_trainer_keeps_the_best_model_by_a_satcore_metric(tmp_path):
    """The documented ``metric_for_best_model="satcore/growth_value_max"`` with ``load_best_model_at_end``:
    the Trainer looks the metric up as ``eval_satcore/growth_value_max`` in what ``evaluate()`` returns
    (a KeyError at the first evaluation before), picks the step whose probe had the largest growth value,
    and reloads that checkpoint."""
    pytest.importorskip("accelerate")
    from satcore.adapters.torch import HFCallback

    probe_data = [collated(SENTENCES[:3]), collated(SENTENCES[3:])]
    callback = HFCallback(probe_data)
    model, trainer = trainer_with(tmp_path, callback, save_strategy="steps", save_steps=2,
                                  metric_for_best_model="satcore/growth_value_max", load_best_model_at_end=True)
    trainer.train()
    values = {step: report.growth_value_max for step, report in callback.reports}
    assert sorted(values) == [2, 4] and values[2] != values[4]
    best = max(values, key=values.get)  # greater_is_better: the Trainer's default for a non-loss metric
    assert trainer.state.best_metric == pytest.approx(values[best], rel=1e-12)
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best}")
    # the model the Trainer ends with is the best checkpoint's: probing it again gives that step's value
    reloaded = probe(trainer.model, probe_data).report().growth_value_max
    assert reloaded == pytest.approx(values[best], rel=1e-6)  # float32 model, float64 sums
    metrics = trainer.evaluate()
    assert metrics["eval_satcore/growth_value_max"] == pytest.approx(values[best], rel=1e-6)
    assert not any(k.startswith("satcore/") for k in metrics)  # one name per value: the Trainer's eval_ prefix


@pytest.mark.parametrize("metric", ["satcore/growth_value_mx", "eval_satcore/transformer.h.9/growth_value"])
def test_trainer_refuses_a_satcore_metric_it_will_never_log_before_training(tmp_path, metric):
    pytest.importorskip("accelerate")
    from satcore.adapters.torch import HFCallback
    from satcore._shared.errors import InputError

    callback = HFCallback([collated(SENTENCES[:3])], log_candidates=True)
    model, trainer = trainer_with(tmp_path, callback, save_strategy="no", metric_for_best_model=metric)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(InputError, match=r"is not a key HFCallback logs; it logs \[.*'satcore/growth_value_max', .*"
                                          r"'satcore/transformer\.h\.1/growth_value'"):
        trainer.train()
    assert trainer.state.global_step == 0 and callback.reports == []
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # not one step trained


class Residual(torch.nn.Module):
    """``z + W2 relu(W1 z)``."""

    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(d, d), torch.nn.Linear(d, d)

    def forward(self, z):
        return z + self.fc2(torch.relu(self.fc1(z)))


def lightning_fit(tmp_path, callback, max_epochs=1, progress_bar=False, **trainer_options):
    """A LightningModule holding its residual stack in an ``nn.Sequential`` (``net.blocks``), fitted on digits
    (2 batches an epoch; with Lightning's progress bar where ``progress_bar``: ``True`` its default, or a progress
    bar callback; ``trainer_options`` to the Trainer over the defaults below); returns ``(module, trainer, fit,
    [steps trained])``."""
    pl = pytest.importorskip("lightning.pytorch")
    from zoo import models_torch as mt

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(64, 16)
            self.blocks = torch.nn.Sequential(Residual(16), Residual(16))
            self.fc = torch.nn.Linear(16, 10)

        def forward(self, x):
            return self.fc(self.blocks(self.embed(x.flatten(1))))

    steps = []

    class Digits(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = Net()

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, _):
            steps.append(self.global_step)
            return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

        def validation_step(self, batch, _):
            self.log("val_loss", torch.nn.functional.cross_entropy(self(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    x, y = mt.digits()
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:128], y[:128]), batch_size=64)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[128:192], y[128:192]), batch_size=64)
    module = Digits()
    bar = [] if isinstance(progress_bar, bool) else [progress_bar]
    trainer = pl.Trainer(**{"max_epochs": max_epochs, "callbacks": [callback, *bar], "logger": False,
                            "enable_checkpointing": False, "enable_progress_bar": bool(progress_bar),
                            "enable_model_summary": False, "accelerator": "cpu", "devices": 1,
                            "num_sanity_val_steps": 0} | trainer_options)
    return module, trainer, lambda: trainer.fit(module, train, val), steps


def test_lightning_callback_finds_a_sequential_stack_and_takes_a_module(tmp_path):
    """``module=`` an ``nn.Module`` (it was called as a function: a TypeError inside the model's forward),
    and the residual blocks of an ``nn.Sequential`` named ``blocks`` found (none were)."""
    from zoo import models_torch as mt
    from satcore.adapters.torch import LightningCallback

    probe_data = mt.digits_batches(8, 2)
    callback = LightningCallback(probe_data, mt.per_sample_ce, module=None)
    module, trainer, fit, _ = lightning_fit(tmp_path, callback)
    callback.module = module.net  # the inner nn.Module itself
    fit()
    (epoch, report), = callback.reports
    assert [c.name for c in report.candidates] == ["blocks.0", "blocks.1", "head"]
    assert report.growth_value_max == pytest.approx(
        probe(module.net, probe_data, mt.per_sample_ce).report().growth_value_max, rel=1e-12)


def test_lightning_callback_probes_every_validation_of_its_epochs_keyed_by_step(tmp_path):
    """With ``val_check_interval`` (two validations an epoch) and ``every_n_epochs=2``: a probe at each validation
    of the second epoch, at the steps where Lightning's own ``ModelCheckpoint(every_n_epochs=2)``, monitoring a
    ``satcore/`` key, saves; ``reports`` keyed by those steps (they were keyed by epoch: two ``(1, report)``
    that nothing told apart)."""
    pl = pytest.importorskip("lightning.pytorch")
    from zoo import models_torch as mt
    from satcore.adapters.torch import LightningCallback

    probe_data = mt.digits_batches(8, 2)
    callback = LightningCallback(probe_data, mt.per_sample_ce, every_n_epochs=2)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_epochs=2,
                                               monitor="satcore/growth_value_max", mode="max", save_top_k=-1)
    module, trainer, fit, steps = lightning_fit(tmp_path, callback, max_epochs=2, val_check_interval=0.5,
                                                callbacks=[callback, checkpoints], enable_checkpointing=True)
    fit()
    assert steps == [0, 1, 2, 3]  # two batches an epoch, a validation after each
    saved = sorted(int(p.stem.removeprefix("step=")) for p in (tmp_path / "ckpt").glob("*.ckpt"))
    assert saved == [3, 4]  # the validations of the second epoch (global_step counts the steps done)
    assert [step for step, _ in callback.reports] == saved
    first, last = (report.growth_value_max for _, report in callback.reports)
    assert first != last  # a step trained between the two validations of one epoch
    assert last == pytest.approx(probe(module, probe_data, mt.per_sample_ce).report().growth_value_max, rel=1e-12)
    assert checkpoints.best_model_score == pytest.approx(max(first, last), rel=1e-6)  # logged as float32


@pytest.mark.parametrize("options, message", [
    ({"module": lambda m: "net"}, r"module=\.\.\.\) must be an nn\.Module or a callable returning one; it gave str"),
    ({"config": ProbeConfig(candidates=["block.0"])}, r"candidate 'block\.0' is not a submodule name of Digits; its residual blocks are "
                                  r"\['net\.blocks\.0', 'net\.blocks\.1'\]"),
])
def test_lightning_callback_configuration_is_refused_before_training(tmp_path, options, message):
    from zoo import models_torch as mt
    from satcore.adapters.torch import LightningCallback

    callback = LightningCallback(mt.digits_batches(8, 1), mt.per_sample_ce, **options)
    _, _, fit, steps = lightning_fit(tmp_path, callback)
    with pytest.raises(ValueError, match=message):
        fit()
    assert steps == [] and callback.reports == []  # refused at on_fit_start, not after an epoch


@pytest.mark.parametrize("callback", ["HFCallback", "LightningCallback", "KerasCallback"])
@pytest.mark.parametrize("every, says", [(0, "0"), (-2, "-2"), (1.5, "1.5"), (True, "True")])
def test_callbacks_refuse_a_schedule_that_is_not_a_positive_whole_number_when_built(callback, every, says):
    """How often a callback probes is a whole number >= 1, refused when the callback is built with one
    ``InputError`` naming the callback and its argument: 1.5 and True passed (``(epoch + 1) % 1.5`` then probes on
    other epochs than the user meant), 0 was a ``ValueError`` in the torch callbacks and an ``InputError`` in
    Keras; ``report=`` must be a mapping (a string failed in ``dict()``'s words)."""
    if callback == "HFCallback":
        pytest.importorskip("transformers")
        from satcore.adapters.torch import HFCallback as build
        what = "every"
    elif callback == "LightningCallback":
        pytest.importorskip("lightning.pytorch")
        from satcore.adapters.torch import LightningCallback as build
        what = "every_n_epochs"
    else:
        pytest.importorskip("tensorflow")
        from satcore.adapters.tensorflow import KerasCallback as build
        what = "every_n_epochs"
    batches = [(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))]
    with pytest.raises(InputError) as refused:
        build(batches, **{what: every})
    assert str(refused.value) == f"{callback}: {what} must be a positive integer, got {says}"
    with pytest.raises(InputError, match=f"^{callback}: report must be a mapping of report\\(\\) keywords, .*got str$"):
        build(batches, report="alpha")
    assert build(batches, **{what: 3}, report={"criteria": None}).report_options == {"criteria": None}


def dropout_lm():
    """The small causal LM with dropout on: its training draws random numbers at every step."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=tokenizer().vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False, attn_implementation="eager")
    return GPT2LMHeadModel(config).train()


def test_trainer_callback_decides_at_evaluations_without_changing_the_run(tmp_path, capfd):
    """With ``policy=``, each probed evaluation also runs ``decide`` (the probe data as the held-out split): its
    depth-wide scalars (what it chose, its predicted change) are logged beside the first-order ones, the report
    leads with it, the decision equals ``decide`` on the model the Trainer ends with, and the training run
    (dropout on) logs the same losses as without it.  By default no per-candidate key is logged or printed: the
    Trainer printed all 46 keys of the two blocks and the head at each evaluation (some 2,250 characters, 549
    now); ``reports`` keeps the whole report."""
    pytest.importorskip("accelerate")
    from satcore import InsertionDecision, Recipe
    from satcore.adapters.torch import HFCallback, decide

    probe_data = [collated(SENTENCES[:3]), collated(SENTENCES[3:])]
    train_batches = [collated(SENTENCES[i:i + 2]) for i in range(0, len(SENTENCES), 2)]
    policy = DecisionPolicy(Recipe("adamw", 1e-3, 8, 4), seed=3)
    runs = {}
    for label, callback in (("plain", HFCallback(probe_data)),
                            ("deciding", HFCallback(probe_data, policy=policy, train_data=train_batches))):
        model, trainer = trainer_with(tmp_path / label, callback, model=dropout_lm(), save_strategy="no",
                                      metric_for_best_model="satcore/decision/insert" if label == "deciding" else None)
        trainer.train()
        runs[label] = (model, trainer, callback)
    printed = capfd.readouterr().out  # disable_tqdm: the Trainer's PrinterCallback prints each log entry
    losses = {k: [e["loss"] for e in t.state.log_history if "loss" in e] for k, (_, t, _) in runs.items()}
    assert len(losses["plain"]) == 2 and losses["plain"] == losses["deciding"]  # the same numbers drawn: exact
    model, trainer, callback = runs["deciding"]
    assert [step for step, _ in callback.reports] == [2, 4]
    assert all(isinstance(r.decision, InsertionDecision) for _, r in callback.reports)
    report = callback.reports[-1][1]
    assert str(report).splitlines()[1].startswith("decision: ")  # the report leads with it
    names = [c.name for c in report.candidates]
    assert names == ["transformer.h.0", "transformer.h.1", "head"]
    direct = decide(model, train_batches, probe_data, policy=policy)
    assert report.decision.to_dict() == direct.to_dict()  # the whole decision stays reachable
    logged = [e for e in trainer.state.log_history if "eval_loss" in e][-1]
    # the reference: every key decide's decision and the final probe give, less those naming a candidate
    full = direct.scalars() | probe(model, probe_data).report().scalars()
    depth_wide = {k for k in full if not any(f"/{name}/" in k for name in names)}
    assert {"satcore/growth_value_max", "satcore/best_candidate_index", "satcore/decision/insert"} <= depth_wide
    if direct.choice is None:
        assert "satcore/decision/choice_index" not in logged and "satcore/decision/predicted_heldout_change" not in logged
    else:  # what it chose, as an index into the report's candidates, and the choice's predicted held-out change
        assert logged["satcore/decision/choice_index"] == names.index(direct.choice)
        depth_wide.add("satcore/decision/choice_index")
        assert depth_wide >= {"satcore/decision/predicted_heldout_change", "satcore/decision/close_call"}
    assert {k for k in logged if k.startswith("satcore/")} == depth_wide
    assert direct.scalars()["satcore/decision/cost_block_steps"] <= 8
    for key in depth_wide - {"satcore/decision/choice_index"}:  # the same computation on the same weights
        rel = 1e-9 if key.startswith("satcore/decision/") else 1e-6  # the probe: a float32 model, float64 sums
        assert logged[key] == pytest.approx(full[key], rel=rel, abs=1e-12), key
    evaluations = [line for line in printed.splitlines() if "satcore/decision/insert" in line]
    assert len(evaluations) == 2 and not any(name in printed for name in names[:2]), printed
    assert max(map(len, evaluations)) < 800  # the Trainer's own eval_ keys and the depth-wide ones


RECIPE = Recipe("adam", 1e-3, 8, 4)
BATCHES = [{"input_ids": torch.zeros(1, 3, dtype=torch.long)}]  # never read: every refusal comes first


@pytest.mark.parametrize("probe_data, options, error, message", [
    (BATCHES, {"policy": DecisionPolicy(RECIPE)}, InputError, r"policy= needs train_data= \(the training batches"),
    (BATCHES, {"train_data": BATCHES}, InputError, r"train_data= is what a decision's trials train on; give policy="),
    (BATCHES, {"policy": RECIPE, "train_data": BATCHES}, InputError, "policy must be a satcore.DecisionPolicy"),
    (BATCHES, {"config": {"family": "mlp"}}, InputError, "config must be a satcore.adapters.torch.ProbeConfig"),
    # a Lightning fit with it ran its first epoch and then stopped at the second probe: checkpoint.model differs
    (BATCHES, {"config": ProbeConfig(checkpoint="probe.npz")}, InputError,
     r"config\.checkpoint resumes one probe of one model's weights"),
    (BATCHES, {"policy": DecisionPolicy(RECIPE), "train_data": iter(BATCHES)}, InputError,
     "train_data is a one-shot iterator"),
    (BATCHES, {"policy": DecisionPolicy(RECIPE), "train_data": []}, InputError, "train_data holds no batches"),
    (BATCHES, {"policy": DecisionPolicy(RECIPE.with_steps(10**6)), "train_data": BATCHES}, InputError,
     "SATCORE_MAX_TRIAL_STEPS"),
    (iter(BATCHES), {}, InputError, "probe_data is a one-shot iterator"),
    (BATCHES[0], {}, InputError, r"probe_data is one batch \(a pair \(inputs, targets\) or a mapping\)"),
    ((torch.zeros(2, 3), torch.zeros(2)), {}, InputError, "probe_data is one batch"),
    (BATCHES, {"policy": DecisionPolicy(RECIPE), "train_data": BATCHES[0]}, InputError, "train_data is one batch"),
])
def test_callbacks_refuse_what_they_cannot_run_when_built(probe_data, options, error, message):
    """Refused when the callback is built, not at the first evaluation after training steps (what the policy's
    fields cannot be is refused when the policy is built: tests/test_decision_policy.py)."""
    from satcore.adapters.torch import HFCallback

    with pytest.raises(error, match=message):
        HFCallback(probe_data, **options)
    pytest.importorskip("lightning.pytorch")
    from satcore.adapters.torch import LightningCallback

    with pytest.raises(error, match=message):
        LightningCallback(probe_data, **options)


def test_the_lightning_callback_refuses_a_log_candidates_that_is_not_true_or_false_before_the_first_step():
    """Its ``log_candidates`` is a class attribute (the keyword would be its ninth parameter): one set on the
    instance is checked at ``on_fit_start``, as the keyword of the other two callbacks is when they are built."""
    pytest.importorskip("lightning.pytorch")
    from satcore.adapters.torch import LightningCallback

    callback = LightningCallback(BATCHES)
    assert callback.log_candidates is False  # the depth-wide keys only, unless asked
    callback.log_candidates = "yes"
    with pytest.raises(InputError, match="^LightningCallback: log_candidates must be True or False, got 'yes'$"):
        callback.on_fit_start(None, None)


@pytest.mark.parametrize("callback", ["HFCallback", "KerasCallback"])
def test_callbacks_refuse_a_log_candidates_that_is_not_true_or_false(callback):
    if callback == "HFCallback":
        from satcore.adapters.torch import HFCallback as build
    else:
        pytest.importorskip("tensorflow")
        from satcore.adapters.tensorflow import KerasCallback as build
    with pytest.raises(InputError, match=f"^{callback}: log_candidates must be True or False, got 'yes'$"):
        build(BATCHES, log_candidates="yes")
    assert build(BATCHES).log_candidates is False  # the depth-wide keys only, unless asked


def report_with_a_decision():
    """A report of two candidates (``add0``, ``add1``; 16 folds, so with the tests' keys) whose decision verified
    ``add1`` and chose it, and only screened ``add0``."""
    import numpy as np

    from satcore import CandidateStatistics, DepthStatistics
    from satcore._decisions.trials import CandidateDecision, TrialCurve, choose

    rng = np.random.default_rng(0)
    statistics = DepthStatistics([(name, CandidateStatistics.from_samples(
        rng.standard_normal((32, 2)), rng.standard_normal((32, 2)), batch_size=2)) for name in ("add0", "add1")])
    trial = TrialCurve((2, 4, 8), (-0.02, -0.04, -0.05), (-0.03, -0.06, -0.08), 0.01)
    decision = choose([CandidateDecision("add1", -0.05, -0.08, (-0.09, -0.01), 0.97, -0.02, trial),
                       CandidateDecision.screen_only("add0", -0.01, -0.02)],
                      RECIPE, 2.0, 1.8, 8, TrialSettings().calibration)
    return statistics.report(), decision


# what every callback logs of report_with_a_decision() by default: the report's and the decision's depth-wide keys
DEPTH_WIDE_KEYS = {f"satcore/{key}" for key in (
    "growth_value_max", "ag_max", "argmax_index", "best_candidate_index", "improvable", "saturated", "n_improvable",
    "decision/insert", "decision/cost_block_steps", "decision/close_call", "decision/choice_index",
    "decision/predicted_heldout_change")}


@pytest.mark.parametrize("log_candidates", [False, True])
def test_trainer_lightning_and_keras_callbacks_log_the_same_keys_of_one_decision(monkeypatch, log_candidates):
    """``HFCallback``, ``LightningCallback`` and ``KerasCallback`` handed one report and decision log one key set:
    the 12 depth-wide keys by default, the choice's index among them, and with ``log_candidates=True`` every
    candidate's too.  Keras's ``fit(verbose=1)`` prints every key of the epoch's logs; the Keras callback logged
    every candidate's keys (six a candidate, six more of a verified candidate's decision) and no ``choice_index``,
    and the Lightning callback every candidate's keys whatever was asked (it had no ``log_candidates``; a class
    attribute there)."""
    import sys
    from dataclasses import replace
    from types import SimpleNamespace

    pytest.importorskip("tensorflow")
    import satcore.adapters.torch.trainer_callback as trainer_callback
    from satcore.adapters.tensorflow import KerasCallback

    report, decision = report_with_a_decision()
    monkeypatch.setattr(trainer_callback, "callback_report", lambda *args, **kwargs: replace(report, decision=decision))
    trainer = trainer_callback.HFCallback(BATCHES, log_candidates=log_candidates)
    trainer_logs = {"eval_loss": 1.0}
    trainer.on_log(SimpleNamespace(disable_tqdm=True), SimpleNamespace(global_step=2, is_world_process_zero=True,
                                                                       log_history=[]), None, logs=trainer_logs)

    monkeypatch.setattr(sys.modules["satcore.adapters.tensorflow.callbacks"], "probe",
                        lambda *args, **kwargs: SimpleNamespace(report=lambda **options: report))
    monkeypatch.setattr(sys.modules["satcore.adapters.tensorflow.decide"], "decide", lambda *args, **kwargs: decision)
    keras_callback = KerasCallback(BATCHES, lambda y, p: y, policy=DecisionPolicy(RECIPE), train_data=BATCHES,
                                   log_candidates=log_candidates)
    keras_callback.set_params({"verbose": 0})
    keras_logs = {"loss": 1.0}
    keras_callback.on_epoch_end(0, keras_logs)

    pytest.importorskip("lightning.pytorch")
    import satcore.adapters.torch.lightning_callback as lightning_callback

    monkeypatch.setattr(lightning_callback, "callback_report", lambda *args, **kwargs: replace(report,
                                                                                               decision=decision))
    lightning_logs = {}
    module = SimpleNamespace(log_dict=lambda logs, sync_dist: lightning_logs.update(logs))
    lightning = lightning_callback.LightningCallback(BATCHES)
    lightning.log_candidates = log_candidates
    lightning.on_validation_epoch_end(
        SimpleNamespace(sanity_checking=False, current_epoch=0, global_step=2, progress_bar_callback=None), module)

    trainer_keys, keras_keys = set(trainer_logs) - {"eval_loss"}, set(keras_logs) - {"loss"}
    assert keras_keys == trainer_keys == set(lightning_logs)
    assert keras_logs["satcore/decision/choice_index"] == trainer_logs["satcore/decision/choice_index"] == 1.0
    if log_candidates:
        assert {"satcore/add0/growth_value", "satcore/add1/realizability", "satcore/decision/add0/not_verified",
                "satcore/decision/add1/p_decrease"} <= keras_keys
        assert keras_keys > DEPTH_WIDE_KEYS
    else:
        assert keras_keys == DEPTH_WIDE_KEYS


def test_callback_decisions_share_the_callbacks_places_unless_the_policy_sets_them():
    from satcore.adapters.torch.callback_common import callback_settings
    from satcore.adapters.torch.decide import decision_probe_options

    config = ProbeConfig(candidates=["transformer.h.1"], family="native", head=False, variance=True)
    _, decision = callback_settings("HFCallback", BATCHES, config, DecisionPolicy(RECIPE), BATCHES)
    shared = decision_probe_options(decision.policy, decision.defaults)
    assert (shared["candidates"], shared["config"].family, shared["head"]) == (["transformer.h.1"], "native", False)
    assert shared["config"].variance is False  # a probe setting of the callback's own, not the decision's
    policy = DecisionPolicy(RECIPE, candidates=["transformer.h.0", "head"], probe=ProbeConfig(family="mlp"))
    _, decision = callback_settings("HFCallback", BATCHES, config, policy, BATCHES)
    own = decision_probe_options(decision.policy, decision.defaults)
    assert (own["candidates"], own["config"].family, own["head"]) == (["transformer.h.0"], "mlp", True)


@pytest.mark.parametrize("callback_options, metric, message", [
    ({"every": 2}, "satcore/growth_value_max", r"every=2\) logs it at one evaluation in 2.*use every=1"),
    ({}, "satcore/decision/insert", r"not a key HFCallback logs \(decision keys are logged with HFCallback\(policy"),
    ({}, "satcore/transformer.h.1/growth_value",
     r"not a key HFCallback logs \(per-candidate keys are logged with HFCallback\(log_candidates=True\)\)"),
    ({"policy": DecisionPolicy(RECIPE, candidates=["transformer.h.7"]), "train_data": BATCHES}, "eval_loss",
     r"candidate 'transformer\.h\.7' is not a submodule name"),
])
def test_trainer_refuses_at_train_begin_what_would_fail_at_an_evaluation(tmp_path, callback_options, metric,
                                                                        message):
    pytest.importorskip("accelerate")
    from satcore.adapters.torch import HFCallback

    callback = HFCallback([collated(SENTENCES[:3])], **callback_options)
    model, trainer = trainer_with(tmp_path, callback, save_strategy="no", metric_for_best_model=metric)
    with pytest.raises((InputError, ProbeError), match=message):
        trainer.train()
    assert trainer.state.global_step == 0 and callback.reports == []


@pytest.mark.parametrize("batches", [2, 7])
def test_trainer_callback_warns_at_train_begin_where_its_probe_cannot_reach_improvable(tmp_path, batches):
    """Folds are made of batches: a GPT-2's 3 places (2 blocks and the head) need 7 probe batches before Holm's
    alpha/3 can be passed, so 2 batches (what a first try gives: a MiniLM run logged ``satcore/improvable`` 0 at
    every evaluation, the reason only in ``callback.reports``) warn when training starts, naming the number; 7 do
    not."""
    pytest.importorskip("accelerate")
    from satcore.adapters.torch import HFCallback

    probe_data = [collated(SENTENCES[i % 5:i % 5 + 1]) for i in range(batches)]
    callback = HFCallback(probe_data)
    _, trainer = trainer_with(tmp_path, callback, save_strategy="no")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    said = [str(w.message) for w in caught if str(w.message).startswith("HFCallback: probe_data holds")]
    assert len(callback.reports) == 2
    assert said == (["HFCallback: probe_data holds 2 batch(es); the fold test over 3 candidates needs at least 7 "
                     "(its folds are made of batches, not samples) to call any candidate improvable, so "
                     "satcore/improvable stays 0: split it into 7 or more batches"] if batches == 2 else []), said


def test_lightning_callback_decides_at_validation_end(tmp_path):
    """``policy=`` in Lightning (validation runs under ``inference_mode``; the trials train outside it): the logged
    decision equals ``decide`` on the module the fit ends with, and the report leads with it."""
    from zoo import models_torch as mt
    from satcore.adapters.torch import LightningCallback, decide

    probe_data, train_batches = mt.digits_batches(8, 2), mt.digits_batches(8, 4, start=400)
    policy = DecisionPolicy(Recipe("adam", 1e-2, 8, 16))
    callback = LightningCallback(probe_data, mt.per_sample_ce, config=ProbeConfig(candidates=["net.blocks.1"]),
                                 policy=policy, train_data=train_batches)
    module, trainer, fit, _ = lightning_fit(tmp_path, callback)
    fit()
    (epoch, report), = callback.reports
    assert str(report).splitlines()[1].startswith("decision: ")
    # the decision is of the callback's places (its candidates=), the ones its first-order keys are of
    assert list(report.decision.candidates) == [c.name for c in report.candidates] == ["net.blocks.1", "head"]
    direct = decide(module, train_batches, probe_data, mt.per_sample_ce,  # the head is trialled only where named
                    policy=DecisionPolicy(policy.recipe, candidates=["net.blocks.1", "head"]))
    assert report.decision.to_dict()["choice"] == direct.choice
    # the depth-wide keys by default (log_candidates False), as HFCallback's
    assert not any(key.startswith("satcore/decision/net.") for key in trainer.callback_metrics)
    for key, value in direct.scalars(per_candidate=False).items():  # Lightning keeps float32 tensors: rel 1e-6
        assert float(trainer.callback_metrics[key]) == pytest.approx(value, rel=1e-6, abs=1e-9), key


def bars_run_to_the_end(err: str) -> int:
    """How many ``decide`` bars ``err`` holds (each prints its empty start once; not the count of ``100%``, which
    tqdm may print more than once a bar and rounds 769/772 to), checking that where there are any, a bar ran its
    trials to its total (``N/N``)."""
    started = err.count("decide: 0batch")
    ended = {m.start() for m in re.finditer(r"trials: 100%\|[^|]*\| (\d+)/\1 ", err)}
    assert bool(started) == bool(ended), err
    return started


def deciding_lightning_callback():
    """A LightningCallback deciding at ``net.blocks.1`` of :func:`lightning_fit`'s module, 4 steps of Adam."""
    from zoo import models_torch as mt
    from satcore.adapters.torch import LightningCallback

    return LightningCallback(mt.digits_batches(8, 2), mt.per_sample_ce, config=ProbeConfig(candidates=["net.blocks.1"]),
                             policy=DecisionPolicy(Recipe("adam", 1e-2, 4, 16)), train_data=mt.digits_batches(8, 4, start=400))


@pytest.mark.parametrize("shown", [False, True])
def test_callback_decisions_show_their_bar_where_the_training_loop_shows_its_own(tmp_path, capfd, shown):
    """A decision takes minutes where an evaluation takes seconds: where the Trainer shows its tqdm bars
    (``disable_tqdm=False``) or Lightning its progress bar, each decision shows ``decide``'s bar on stderr, through
    its trials to the end; where they are off it is silent (it was silent always: minutes with nothing on the
    screen between two logged steps)."""
    pytest.importorskip("accelerate")
    from satcore.adapters.torch import HFCallback

    probe_data = [collated(SENTENCES[:3]), collated(SENTENCES[3:])]
    train_batches = [collated(SENTENCES[i:i + 2]) for i in range(0, len(SENTENCES), 2)]
    policy = DecisionPolicy(Recipe("adamw", 1e-3, 4, 4))
    deciding = HFCallback(probe_data, policy=policy, train_data=train_batches)
    _, trainer = trainer_with(tmp_path / "hf", deciding, save_strategy="no", disable_tqdm=not shown)
    trainer.train()
    err = capfd.readouterr().err
    assert len(deciding.reports) == 2 and bars_run_to_the_end(err) == (2 if shown else 0), err
    deciding = deciding_lightning_callback()
    _, _, fit, _ = lightning_fit(tmp_path / "lightning", deciding, progress_bar=shown)
    fit()
    err = capfd.readouterr().err
    assert len(deciding.reports) == 1 and bars_run_to_the_end(err) == (1 if shown else 0), err


@pytest.mark.parametrize("shown", [False, True])
def test_trainer_callback_probes_show_their_bar_where_the_trainer_shows_its_own(tmp_path, capfd, shown):
    """The probe of an evaluation split can take several times the evaluation itself (a MiniLM classifier's 4
    batches of 16: about 40 s after an 11 s evaluation on a busy CPU): with ``disable_tqdm=False`` each probe shows
    its bar on stderr, run to its total, and with the Trainer's bars off it is silent (it was silent always)."""
    pytest.importorskip("accelerate")
    from satcore.adapters.torch import HFCallback

    probing = HFCallback([collated(SENTENCES[:3]), collated(SENTENCES[3:])])
    _, trainer = trainer_with(tmp_path, probing, save_strategy="no", disable_tqdm=not shown)
    trainer.train()
    err = capfd.readouterr().err
    samples = len(SENTENCES)
    ended = re.findall(rf"probe: 100%\|[^|]*\| {samples}/{samples} ", err)
    assert len(probing.reports) == 2 and err.count("probe: 0sample") == (2 if shown else 0), err
    assert bool(ended) == shown, err


@pytest.mark.parametrize("local_zero, world_zero", [(True, False), (True, True), (False, False)])
def test_trainer_decisions_show_their_bar_on_the_process_that_shows_the_trainers(monkeypatch, local_zero, world_zero):
    """The Trainer's ``ProgressCallback`` draws its bars on the world's main process only: a decision shows its bar
    there, not on another node's local main process (it did, on every node's), with ``disable_tqdm`` false."""
    from types import SimpleNamespace

    import satcore.adapters.torch.trainer_callback as trainer_callback

    asked = []
    monkeypatch.setattr(trainer_callback, "callback_report", lambda *args, progress, **kwargs: asked.append(progress))
    monkeypatch.setattr(trainer_callback, "callback_scalars", lambda *args: {})
    deciding = trainer_callback.HFCallback([collated(SENTENCES[:3])], policy=DecisionPolicy(Recipe("adamw", 1e-3, 4, 4)),
                                           train_data=[collated(SENTENCES[:2])])
    state = SimpleNamespace(global_step=1, is_local_process_zero=local_zero, is_world_process_zero=world_zero)
    deciding._measure(SimpleNamespace(disable_tqdm=False), state, None)
    assert asked == [world_zero]


def test_lightning_decisions_stay_quiet_under_a_progress_bar_turned_off_by_its_refresh_rate(tmp_path, capfd):
    """``TQDMProgressBar(refresh_rate=0)`` is a Lightning progress bar that shows nothing (``is_enabled`` false): the
    decision is silent under it, as under ``enable_progress_bar=False`` (it showed its bar: the callback asked only
    whether the Trainer had a progress bar callback)."""
    pl = pytest.importorskip("lightning.pytorch")

    deciding = deciding_lightning_callback()
    _, trainer, fit, _ = lightning_fit(tmp_path, deciding, progress_bar=pl.callbacks.TQDMProgressBar(0))
    fit()
    assert trainer.progress_bar_callback is not None and not trainer.progress_bar_callback.is_enabled
    err = capfd.readouterr().err
    assert len(deciding.reports) == 1 and bars_run_to_the_end(err) == 0, err


def test_callbacks_take_data_loaders_without_reading_them_when_built():
    """A DataLoader (over a map-style or an iterable dataset, which has no length) passes the re-iterable check, and
    building the callback starts none of its workers (it is not iterated)."""
    from satcore.adapters.torch import HFCallback

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            raise AssertionError("read when the callback was built")

    mapped = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 2)), batch_size=2)
    streamed = torch.utils.data.DataLoader(Stream(), batch_size=2)
    callback = HFCallback(mapped, policy=DecisionPolicy(RECIPE), train_data=streamed)
    assert callback.decision.train is streamed and callback.probe_data is mapped
