"""The callbacks' ``dump_dir``: in real Trainer, Lightning and Keras runs each probed evaluation's dump, read by
``satcore score``, gives the growth values of the callback's own report from the same sums; the folder's refusals
happen when the callback is built, a file of the user's is never replaced, and only the main process writes."""

import json
import os
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

import satcore
from satcore._io.schemas import json_schema
from satcore._shared.errors import InputError
from satcore.cli.main import main

jsonschema = pytest.importorskip("jsonschema")

EPS = np.finfo(np.float64).eps


def scored(path) -> dict:
    """``satcore score PATH --json``, parsed."""
    result = CliRunner().invoke(main, ["score", str(path), "--json", "-q"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{"):])


def assert_dump_is_the_report(path, report):
    """The dump at ``path`` holds the statistics behind ``report`` (a callback's): ``satcore score`` gives its
    candidates, growth values and ``ag`` to float64 round-off of one computation from the same sums (they were
    equal to the bit in every run here)."""
    out = scored(path)
    assert [c["name"] for c in out["candidates"]] == [c.name for c in report.candidates]
    for got, want in zip(out["candidates"], report.candidates):
        assert got["n_samples"] == want.n_samples
        assert got["growth_value"] == pytest.approx(want.growth_value, rel=4 * EPS, abs=0)
        assert got["ag"] == pytest.approx(want.ag, rel=4 * EPS, abs=0)
    assert out["depth"]["growth_value_max"] == pytest.approx(report.growth_value_max, rel=4 * EPS, abs=0)
    assert out["split"] == report.split == "heldout"
    meta = satcore.read_dump(path).meta
    jsonschema.Draft202012Validator(json_schema("dump-meta")).validate(meta)  # its callback record typed too
    assert set(meta["callback"]) >= {"by", "config", "model_fingerprint"}


# -- Hugging Face Trainer ------------------------------------------------------------------------------------------


def test_trainer_callback_writes_a_dump_per_evaluation_that_satcore_score_reads(tmp_path):
    pytest.importorskip("accelerate")
    from test_torch_callbacks import collated, trainer_with
    from test_torch_hf import SENTENCES

    from satcore.adapters.torch import HFCallback
    from satcore.adapters.torch.checkpoint import model_fingerprint

    folder = tmp_path / "dumps" / "new"  # made at the first dump, parents too
    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "notes.txt").write_text("the user's")  # not at a dump's name: no refusal
    callback = HFCallback([collated(SENTENCES[:3]), collated(SENTENCES[3:])], dump_dir=folder)
    model, trainer = trainer_with(tmp_path, callback, save_strategy="no")
    trainer.train()
    assert [step for step, _ in callback.reports] == [2, 4]
    assert sorted(os.listdir(folder)) == ["satcore-step-000002.npz", "satcore-step-000004.npz"]
    assert callback.dumps.written == [str(folder / n) for n in sorted(os.listdir(folder))]
    for step, report in callback.reports:
        assert_dump_is_the_report(folder / f"satcore-step-{step:06d}.npz", report)
    meta = satcore.read_dump(folder / "satcore-step-000004.npz").meta
    assert meta["callback"]["by"] == "HFCallback" and meta["callback"]["step"] == 4
    # the last evaluation is at the last step: the weights it probed are the trained model's
    assert meta["callback"]["model_fingerprint"] == model_fingerprint(model)
    first = satcore.read_dump(folder / "satcore-step-000002.npz").meta["callback"]["model_fingerprint"]
    assert first != meta["callback"]["model_fingerprint"]  # it trained in between
    assert meta["callback"]["config"] == {**meta["callback"]["config"], "split": "heldout", "seed": 0,
                                          "family": "auto", "variance": False, "checkpoint": None}
    assert meta["framework"] == "torch" and meta["split"] == "heldout" and meta["family"]

    # trainer.evaluate() at the same step probes again: it replaces the dump this callback wrote at that step
    trainer.evaluate()
    assert [step for step, _ in callback.reports] == [2, 4, 4]
    assert len(callback.dumps.written) == 2
    assert_dump_is_the_report(folder / "satcore-step-000004.npz", callback.reports[-1][1])


def test_trainer_callback_never_replaces_a_file_it_did_not_write(tmp_path):
    """A file at a dump's name when the callback is built is refused then, naming it; one that appears during
    training is kept, and that evaluation's dump skipped with a warning."""
    pytest.importorskip("accelerate")
    from test_torch_callbacks import collated, trainer_with
    from test_torch_hf import SENTENCES

    from satcore.adapters.torch import HFCallback

    probe_data = [collated(SENTENCES[:3]), collated(SENTENCES[3:])]
    (tmp_path / "d").mkdir()
    theirs = tmp_path / "d" / "satcore-step-000004.npz"
    theirs.write_bytes(b"the user's")
    with pytest.raises(InputError, match=r"HFCallback: dump_dir=.*/d holds satcore-step-000004\.npz, at the names"):
        HFCallback(probe_data, dump_dir=tmp_path / "d")

    callback = HFCallback(probe_data, dump_dir=tmp_path / "e")
    _, trainer = trainer_with(tmp_path, callback, save_strategy="no")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "satcore-step-000004.npz").write_bytes(b"the user's")  # after the callback was built
    with pytest.warns(UserWarning, match=r"satcore-step-000004\.npz appeared during training and is not a dump"):
        trainer.train()
    assert (tmp_path / "e" / "satcore-step-000004.npz").read_bytes() == b"the user's"
    assert sorted(os.listdir(tmp_path / "e")) == ["satcore-step-000002.npz", "satcore-step-000004.npz"]
    assert len(callback.reports) == 2 and callback.dumps.written == [str(tmp_path / "e" / "satcore-step-000002.npz")]


def test_trainer_callback_writes_dumps_on_the_world_main_process_only(tmp_path):
    """Under ``torch.distributed`` every rank probes (the sums are all-reduced) and the one the Trainer saves from,
    ``state.is_world_process_zero``, writes the dump: another rank adds the report and writes nothing."""
    from test_torch_callbacks import collated
    from test_torch_hf import SENTENCES, causal_lm

    from satcore.adapters.torch import HFCallback

    model = causal_lm().float()
    for world_zero, files in ((False, []), (True, ["satcore-step-000003.npz"])):
        callback = HFCallback([collated(SENTENCES[:3]), collated(SENTENCES[3:])], dump_dir=tmp_path / "d")
        state = SimpleNamespace(global_step=3, epoch=1.0, is_world_process_zero=world_zero)
        callback._measure(SimpleNamespace(disable_tqdm=True), state, model)
        assert len(callback.reports) == 1 and sorted(os.listdir(tmp_path / "d") if files else []) == files


# -- Lightning -----------------------------------------------------------------------------------------------------


def test_lightning_callback_writes_a_dump_per_validation_named_by_epoch_and_step(tmp_path):
    pytest.importorskip("lightning.pytorch")
    from test_torch_callbacks import lightning_fit
    from zoo import models_torch as mt

    from satcore.adapters.torch import LightningCallback, ProbeConfig
    from satcore.adapters.torch.checkpoint import model_fingerprint

    callback = LightningCallback(mt.digits_batches(8, 2), mt.per_sample_ce, config=ProbeConfig(head=False),
                                 dump_dir=tmp_path / "dumps")
    module, _, fit, _ = lightning_fit(tmp_path, callback, max_epochs=2)
    fit()
    assert [step for step, _ in callback.reports] == [2, 4]
    names = ["satcore-epoch-0000-step-000002.npz", "satcore-epoch-0001-step-000004.npz"]
    assert sorted(os.listdir(tmp_path / "dumps")) == names
    for name, (_, report) in zip(names, callback.reports):
        assert_dump_is_the_report(tmp_path / "dumps" / name, report)
    meta = satcore.read_dump(tmp_path / "dumps" / names[-1]).meta["callback"]
    assert (meta["by"], meta["epoch"], meta["step"]) == ("LightningCallback", 1, 4)
    assert meta["model_fingerprint"] == model_fingerprint(module) and meta["config"]["head"] is False


# -- Keras ---------------------------------------------------------------------------------------------------------


def test_keras_callback_writes_a_dump_per_epoch_that_satcore_score_reads(tmp_path):
    pytest.importorskip("tensorflow")
    from test_tensorflow_callbacks import compiled_classifier

    from satcore.adapters.tensorflow import KerasCallback
    from satcore.adapters.tensorflow.callbacks import keras_fingerprint

    model, x, y, probe_data = compiled_classifier()
    callback = KerasCallback(probe_data, dump_dir=tmp_path / "dumps")
    model.fit(x[:512], y[:512], batch_size=64, epochs=2, verbose=0, callbacks=[callback])
    assert [epoch for epoch, _ in callback.reports] == [0, 1]
    names = ["satcore-epoch-0001.npz", "satcore-epoch-0002.npz"]  # as fit shows the epochs, from 1
    assert sorted(os.listdir(tmp_path / "dumps")) == names
    for name, (_, report) in zip(names, callback.reports):
        assert_dump_is_the_report(tmp_path / "dumps" / name, report)
    meta = satcore.read_dump(tmp_path / "dumps" / names[-1]).meta
    assert (meta["callback"]["by"], meta["callback"]["epoch"]) == ("KerasCallback", 2)
    assert meta["callback"]["model_fingerprint"] == keras_fingerprint(model)
    assert meta["callback"]["config"]["strategy"] is None and meta["framework"] == "tensorflow"


def test_keras_dumps_are_written_by_the_chief_alone():
    """TensorFlow's rule on real cluster resolvers: the chief, else worker 0 of a cluster without one; every
    process of a strategy without a cluster (one machine)."""
    tf = pytest.importorskip("tensorflow")
    from satcore.adapters.tensorflow.callbacks import is_chief

    def strategy(cluster, task_type, task_id):
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(cluster),
                                                                          task_type=task_type, task_id=task_id)
        return SimpleNamespace(cluster_resolver=resolver)

    workers = {"worker": ["a:1", "b:2"]}
    assert is_chief(strategy(workers, "worker", 0)) and not is_chief(strategy(workers, "worker", 1))
    with_chief = {"chief": ["c:3"], **workers}
    assert is_chief(strategy(with_chief, "chief", 0)) and not is_chief(strategy(with_chief, "worker", 0))
    assert is_chief(tf.distribute.get_strategy()) and is_chief(tf.distribute.MirroredStrategy(["/cpu:0"]))


# -- refusals when built, all three ----------------------------------------------------------------------------


def build(callback: str, dump_dir):
    if callback == "KerasCallback":
        pytest.importorskip("tensorflow")
        from satcore.adapters.tensorflow import KerasCallback

        return KerasCallback([(np.zeros((2, 4), np.float32), np.zeros(2))], dump_dir=dump_dir)
    from test_torch_callbacks import collated
    from test_torch_hf import SENTENCES

    if callback == "HFCallback":
        pytest.importorskip("accelerate")
        from satcore.adapters.torch import HFCallback

        return HFCallback([collated(SENTENCES[:3])], dump_dir=dump_dir)
    pytest.importorskip("lightning.pytorch")
    from satcore.adapters.torch import LightningCallback

    return LightningCallback([collated(SENTENCES[:3])], dump_dir=dump_dir)


@pytest.mark.parametrize("callback, taken", [("HFCallback", "satcore-step-12.npz"),
                                             ("LightningCallback", "satcore-epoch-0003-step-000040.npz"),
                                             ("KerasCallback", "satcore-epoch-0001.npz")])
def test_callbacks_refuse_a_dump_dir_they_would_overwrite_or_that_is_not_a_folder_when_built(tmp_path, callback,
                                                                                             taken):
    file = tmp_path / "file.npz"
    file.write_bytes(b"x")
    with pytest.raises(InputError, match=rf"^{callback}: dump_dir=.*/file\.npz is a file, not a folder"):
        build(callback, file)
    with pytest.raises(InputError, match=rf"^{callback}: dump_dir=.*/file\.npz/sub is inside .*/file\.npz, which "
                                         r"is a file, not a folder"):
        build(callback, file / "sub")
    with pytest.raises(InputError, match=rf"^{callback}: dump_dir must be a folder's path, got int"):
        build(callback, 3)
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    with pytest.raises(InputError, match=rf"^{callback}: dump_dir=.*/link/d: cannot use .*/link as a folder \(No such"):
        build(callback, tmp_path / "link" / "d")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / taken).write_bytes(b"the user's")
    (tmp_path / "d" / "b.txt").write_bytes(b"")
    with pytest.raises(InputError, match=rf"^{callback}: dump_dir=.*/d holds {taken}, at the names its dumps take"):
        build(callback, tmp_path / "d")
    assert (tmp_path / "d" / taken).read_bytes() == b"the user's"
    os.remove(tmp_path / "d" / taken)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build(callback, tmp_path / "d").dumps.folder == str(tmp_path / "d")  # other files may stay
