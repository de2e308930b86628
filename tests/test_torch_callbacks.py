"""Callbacks in real runs: a transformers Trainer (TensorBoard event file read back with tensorboard's
own reader) and a Lightning Trainer, each on a small model; the logged values equal a probe of the
model's final weights made afterwards (so the callback probed the model it was handed, at that step)."""

import glob

import pytest
import torch

from satcore.adapters.torch import probe
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
    callback = HFCallback(probe_data)
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

    import models_torch as mt
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
    module, callback = Digits(), LightningCallback(probe_data, mt.per_sample_ce, head=False)
    trainer = pl.Trainer(max_epochs=2, callbacks=[callback], logger=pl.loggers.CSVLogger(str(tmp_path)),
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1, num_sanity_val_steps=1)
    trainer.fit(module, train, val)
    assert [epoch for epoch, _ in callback.reports] == [0, 1]  # not the sanity check
    final = probe(module, probe_data, mt.per_sample_ce, head=False).report()
    assert float(trainer.callback_metrics["satcore/growth_value_max"]) == pytest.approx(final.growth_value_max, rel=1e-6)
    (path,) = glob.glob(str(tmp_path / "**" / "metrics.csv"), recursive=True)
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if r.get("satcore/growth_value_max")]
    assert len(rows) == 2 and "satcore/net.layer2.1/growth_value" in rows[0]
    assert float(rows[-1]["satcore/growth_value_max"]) == pytest.approx(final.growth_value_max, rel=1e-6)
    assert float(rows[0]["satcore/growth_value_max"]) != float(rows[1]["satcore/growth_value_max"])
