"""Checkpoint/resume: a probe interrupted mid-way and resumed from its checkpoint
gives exactly the uninterrupted statistics; progress bar; .save() dumps."""

import json

import numpy as np
import pytest
import torch

from zoo import models_torch as mt
from satcore.adapters.torch import probe, sequence_loss

torch.set_num_threads(1)


class Interrupted(Exception):
    pass


def interrupt_after(batches, k):
    """Yield ``k`` batches, then fail as a killed job would."""
    yield from batches[:k]
    raise Interrupted


def assert_same(a, b):
    assert list(a.statistics) == list(b.statistics)
    for name in a.statistics:
        x, y = a.statistics[name].to_arrays(), b.statistics[name].to_arrays()
        assert x.keys() == y.keys()
        for f in x:
            np.testing.assert_array_equal(x[f], y[f], err_msg=f"{name}/{f}")
        assert a.diagnostics[name] == b.diagnostics[name]


@pytest.mark.parametrize("every", [1, 2])
def test_interrupted_then_resumed_equals_uninterrupted(tmp_path, every):
    model = mt.gpt2()
    batches = mt.text_batches(16, 2, 5)
    options = dict(variance=True, position_subsample=6, seed=3, checkpoint_every=every)
    whole = probe(model, batches, sequence_loss, **{k: v for k, v in options.items() if k != "checkpoint_every"})
    path = tmp_path / "probe.ckpt.npz"
    with pytest.raises(Interrupted):
        probe(model, interrupt_after(batches, 3), sequence_loss, checkpoint=path, **options)
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
    assert meta["checkpoint"]["batches_done"] == (3 if every == 1 else 2)
    resumed = probe(model, batches, sequence_loss, checkpoint=path, **options)
    assert_same(resumed, whole)
    # a finished checkpoint resumes to the same result without new batches, feature maps included
    again = probe(model, batches, sequence_loss, checkpoint=path, **options)
    assert_same(again, whole)
    z = torch.randn(2, 5, 32)
    with torch.no_grad():
        assert all(torch.equal(again.families[n](z), whole.families[n](z)) for n in whole.families)
    assert {n: f.spec for n, f in again.families.items()} == {n: f.spec for n, f in whole.families.items()}


def test_checkpoint_of_other_settings_is_refused(tmp_path):
    model = mt.digits_resnet()
    path = tmp_path / "c.npz"
    probe(model, mt.digits_batches(4, 2), mt.per_sample_ce, checkpoint=path)
    with pytest.raises(ValueError, match="checkpoint was written by a probe with settings"):
        probe(model, mt.digits_batches(4, 2), mt.per_sample_ce, checkpoint=path, seed=1)


def test_progress_bar_counts_samples(capsys):
    model = mt.digits_resnet()
    probe(model, mt.digits_batches(4, 3), mt.per_sample_ce, progress=True)
    err = capsys.readouterr().err
    assert "12/12" in err and "sample/s" in err


def test_progress_bar_of_batches_with_a_length_has_a_total_that_ends_at_the_samples_read(capsys):
    """A list of batches shows a total from its length and its first batch's size (a newcomer's probe bar showed a
    bare count); a shorter last batch brings the total down to the samples read; a generator shows a count only."""
    model = mt.digits_resnet()
    batches = mt.digits_batches(4, 3)
    x, y = mt.digits_batches(2, 1)[0]
    probe(model, [*batches, (x, y)], mt.per_sample_ce, progress=True)
    err = capsys.readouterr().err
    assert err.rstrip().rsplit("\r", 1)[-1].startswith("probe: 100%|") and "| 14/14 [" in err
    probe(model, iter(batches), mt.per_sample_ce, progress=True)
    err = capsys.readouterr().err
    assert "12sample" in err.replace(" ", "") and "/" not in err.split("[")[0]


def test_save_writes_a_satcore_dump(tmp_path):
    from satcore._io.dump import read_dump

    model = mt.digits_resnet()
    result = probe(model, mt.digits_batches(4, 2), mt.per_sample_ce, split="heldout", variance=True)
    path = tmp_path / "probe.npz"
    result.save(path)
    dump = read_dump(path)
    assert dump.meta["candidates"] == list(result.statistics)
    assert dump.meta["framework"] == "torch" and dump.meta["split"] == "heldout"
    assert dump.meta["family"]["layer1.0"]["kind"] == "conv"
    stats = dump.statistics()
    assert stats.report().to_dict()["candidates"] == result.report().to_dict()["candidates"]


def test_checkpoint_is_a_readable_dump_of_the_partial_probe(tmp_path):
    from satcore._io.dump import read_dump

    model = mt.digits_resnet()
    batches = mt.digits_batches(4, 3)
    path = tmp_path / "c.npz"
    with pytest.raises(Interrupted):
        probe(model, interrupt_after(batches, 2), mt.per_sample_ce, checkpoint=path)
    partial = probe(model, batches[:2], mt.per_sample_ce)
    stats = read_dump(path).statistics()
    assert stats.report().to_dict() == partial.report().to_dict()


def test_float32_batch_sums_save_a_valid_dump(tmp_path):
    """Float32 per-batch Grams are symmetric only to round-off; the saved dump must still validate."""
    import satcore
    from zoo.models_torch import digits_batches, digits_resnet, per_sample_ce
    from satcore.adapters.torch import probe

    result = probe(digits_resnet(), digits_batches(50, 2), per_sample_ce, batch_dtype=torch.float32, variance=True)
    result.save(tmp_path / "f32.npz")
    back = satcore.read_dump(tmp_path / "f32.npz").statistics()
    for name, stats in result.statistics.items():
        np.testing.assert_array_equal(back[name].sum_gram, stats.sum_gram)


def test_a_checkpoint_written_before_the_stream_sums_were_statistics_resumes(tmp_path):
    """Older checkpoints held the stream sums as ``meta.checkpoint.streams`` (JSON numbers), not as
    ``stats/<name>/sum_z_sq``: such a file resumes to exactly the uninterrupted statistics."""
    import satcore
    from satcore._io.dump import read_dump

    model = mt.gpt2()
    batches = mt.text_batches(16, 2, 4)
    whole = probe(model, batches, sequence_loss, seed=3)
    path = tmp_path / "probe.ckpt.npz"
    with pytest.raises(Interrupted):
        probe(model, interrupt_after(batches, 2), sequence_loss, checkpoint=path, seed=3)
    dump = read_dump(path)
    stream_fields = ("sum_z_sq", "n_stream_vectors", "sum_update_sq")
    streams, stats = {}, {}
    for name, s in dump.statistics().items():
        arrays = s.to_arrays()
        streams[name] = {"n_samples": float(s.n_samples), "n_vectors": float(s.n_stream_vectors),
                         "sum_z_sq": s.sum_z_sq, "sum_update_sq": s.sum_update_sq or 0.0,
                         "has_update": float(s.block_update)}
        stats[name] = satcore.CandidateStatistics.from_arrays({k: v for k, v in arrays.items()
                                                               if k not in stream_fields})
    meta = {**dump.meta, "checkpoint": {**dump.meta["checkpoint"], "streams": streams}}
    path.unlink()
    satcore.write_dump(path, satcore.DepthStatistics(stats), meta=meta)
    assert "sum_z_sq" not in read_dump(path).statistics()[next(iter(stats))].to_arrays()
    resumed = probe(model, batches, sequence_loss, checkpoint=path, seed=3)
    assert_same(resumed, whole)
    assert "head" in whole.diagnostics and whole.diagnostics["head"].relative_update is None
    assert all(d.relative_update > 0 for n, d in whole.diagnostics.items() if n != "head")
