"""The stream sums as statistics: ``sum_i ||z_i||^2`` (with its position vectors and the block
update's sum) added, merged, stored and read back like every other sum, ``||z||_S`` read from them,
and the ``meta.diagnostics`` fallback of dumps written before they existed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import satcore
from satcore.cli.main import main
from satcore._statistics.candidate import CandidateStatistics


def _batches(rng, n_batches=6, M=10, T=3, N=4, r=5):
    return [(rng.standard_normal((M, T, N)), rng.standard_normal((M, T, r)), rng.standard_normal((M, T, N)) * 3)
            for _ in range(n_batches)]


def _probe(batches, **kw):
    s = CandidateStatistics(4, 5, 3, stream=True, **kw)
    for q, psi, z in batches:
        s.update(q, psi, z=z)
    return s


def test_stream_sums_are_the_stream_norms_and_merge_as_one_pass():
    rng = np.random.default_rng(0)
    batches = _batches(rng)
    z = np.concatenate([b[2] for b in batches])
    whole = _probe(batches)
    assert whole.sum_z_sq == pytest.approx(float(np.sum(z**2)), rel=1e-13)
    assert whole.n_stream_vectors == z.shape[0] * z.shape[1]
    # ||z||_S = sqrt(mean_i ||z_i||_F^2), explicitly per sample
    assert whole.stream_rms() == pytest.approx(np.sqrt(np.mean([np.sum(zi**2) for zi in z])), rel=1e-13)
    d = whole.stream_diagnostics("b")
    assert d.stream_rms_per_position == pytest.approx(np.sqrt(np.mean(np.sum(z**2, axis=-1))), rel=1e-13)
    assert d.relative_update is None
    merged = _probe(batches[:2]).merge(_probe(batches[2:]))
    assert merged.stream and merged.n_stream_vectors == whole.n_stream_vectors
    assert merged.stream_rms() == pytest.approx(whole.stream_rms(), rel=1e-13)
    back = CandidateStatistics.from_arrays(merged.to_arrays())
    assert back == merged and back.stream_rms() == merged.stream_rms()


def test_without_stream_sums_on_either_side_a_merge_keeps_none():
    rng = np.random.default_rng(1)
    batches = _batches(rng, 2)
    plain = CandidateStatistics(4, 5, 3)
    plain.update(*batches[0][:2])
    merged = _probe(batches[1:]).merge(plain)
    assert not merged.stream and merged.stream_rms() is None and "sum_z_sq" not in merged.to_arrays()
    with pytest.raises(ValueError, match="stream sums"):
        _probe(batches[1:]).accumulate(plain)  # in place: self keeps them, so the other must have them


@pytest.mark.parametrize("drop, message", [("n_stream_vectors", "come together"), ("sum_z_sq", "come together")])
def test_half_of_the_stream_sums_is_refused(drop, message):
    arrays = _probe(_batches(np.random.default_rng(2), 2)).to_arrays()
    del arrays[drop]
    with pytest.raises(ValueError, match=message):
        CandidateStatistics.from_arrays(arrays)


def test_stream_rms_prefers_the_sums_and_falls_back_on_meta():
    rng = np.random.default_rng(3)
    with_sums = _probe(_batches(rng, 2))
    without = CandidateStatistics(4, 5, 3)
    without.update(*_batches(rng, 1)[0][:2])
    depth = satcore.DepthStatistics({"a": with_sums, "b": without, "c": without})
    meta = {"diagnostics": {"a": {"stream_rms": 99.0}, "b": {"stream_rms": 2.5}}}
    assert depth.stream_rms(meta) == {"a": pytest.approx(with_sums.stream_rms(), rel=0), "b": 2.5}
    assert depth.stream_rms() == {"a": with_sums.stream_rms()}


def _shard(rng, shift, n_batches, M=16):
    """Two candidates whose streams differ in scale between the shards (so a shard's norm is not the union's)."""
    out = {}
    for k, name in enumerate(("b0", "b1")):
        s = CandidateStatistics(3, 5, 1, stream=True)
        for _ in range(n_batches):
            psi = rng.standard_normal((M, 1, 5))
            q = rng.standard_normal((M, 1, 3)) + shift * psi[:, :, :3]
            s.update(q, psi, z=rng.standard_normal((M, 1, 3)) * (1 + k + 2 * shift))
        out[name] = s
    return satcore.DepthStatistics(out)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_merge_then_rho_scores_with_the_merged_stream_norm(tmp_path):
    """``satcore merge A B -o AB && satcore score AB --tolerance 1e-3 --rho 0.01``: the tolerance in
    growth-value units is ``1e-3 / (0.01 ||z||_S)`` with the union's ``||z||_S``."""
    rng = np.random.default_rng(4)
    a, b = _shard(rng, 0.0, 8), _shard(rng, 0.5, 8)
    paths = []
    for name, depth in (("A", a), ("B", b)):
        # as the adapters write them: each shard's meta records its own norm
        meta = {"split": "heldout", "diagnostics": {n: {"stream_rms": s.stream_rms()} for n, s in depth.items()}}
        paths.append(tmp_path / f"{name}.npz")
        satcore.write_dump(paths[-1], depth, meta=meta)
    merged = tmp_path / "AB.npz"
    assert invoke("merge", *paths, "-o", merged).exit_code == 0
    result = invoke("score", merged, "--json", "--tolerance", 1e-3, "--rho", 0.01)
    assert result.exit_code == 0, result.output
    union = a.merge(b)
    for cand, (name, stats) in zip(json.loads(result.output)["candidates"], union.items()):
        z_rms = np.sqrt((a[name].sum_z_sq + b[name].sum_z_sq) / (a[name].n_samples + b[name].n_samples))
        assert abs(z_rms / a[name].stream_rms() - 1) > 0.1  # the shard's own norm would be a different tolerance
        assert cand["test"]["tolerance"] == pytest.approx(1e-3 / (0.01 * z_rms), rel=1e-12)


def test_score_train_needs_the_stream_norm_only_for_the_matched_step(tmp_path):
    """``score --train T H`` with no stream RMS in either meta: sgd never reads it; matched reads the
    held-out statistics' sums; without any, matched is one line, exit 2."""
    rng = np.random.default_rng(5)
    train, held = tmp_path / "T.npz", tmp_path / "H.npz"
    satcore.write_dump(train, _shard(rng, 0.5, 8), meta={"split": "train"})
    satcore.write_dump(held, _shard(rng, 0.5, 8), meta={"split": "heldout"})
    sgd = invoke("score", held, "--train", train, "--lr", 0.1, "--json")
    assert sgd.exit_code == 0, sgd.output
    matched = invoke("score", held, "--train", train, "--optimizer", "matched", "--rho", 0.01, "--json")
    assert matched.exit_code == 0, matched.output
    plain = {n: CandidateStatistics.from_arrays({k: v for k, v in s.to_arrays().items()
                                                 if k not in ("sum_z_sq", "n_stream_vectors")})
             for n, s in satcore.read_dump(held).statistics().items()}
    bare = tmp_path / "H_bare.npz"
    satcore.write_dump(bare, satcore.DepthStatistics(plain), meta={"split": "heldout"})
    assert invoke("score", bare, "--train", train, "--lr", 0.1).exit_code == 0
    refused = invoke("score", bare, "--train", train, "--optimizer", "matched", "--rho", 0.01)
    assert refused.exit_code == 2 and "stream RMS" in refused.output and "Traceback" not in refused.output


def test_statistics_report_reads_its_own_stream_norms_as_the_command_line_does(tmp_path):
    """``read_dump(path).statistics().report(rho=...)`` in Python and ``satcore score path --rho`` read the same
    ``||z||_S``, the statistics' own stream sums: a tolerance in loss units and the matched block's predicted
    gains need no ``stream_rms=`` when the sums are there (they were refused as "needs the stream RMS")."""
    rng = np.random.default_rng(9)
    held, train = _shard(rng, 0.5, 8), _shard(rng, 0.5, 8)
    own = held.stream_rms()
    assert set(own) == {"b0", "b1"}
    implicit = held.report(split="heldout", tolerance=1e-3, rho=0.01)
    assert implicit.to_dict() == held.report(split="heldout", tolerance=1e-3, rho=0.01, stream_rms=own).to_dict()
    for t in implicit.tests:
        assert t.tolerance == pytest.approx(1e-3 / (0.01 * own[t.name]), rel=1e-12)
    matched = held.report(split="heldout", train=train, optimizer="matched", rho=0.01)
    assert matched.predictions == held.report(split="heldout", train=train, optimizer="matched", rho=0.01,
                                              stream_rms=own).predictions
    path = tmp_path / "H.npz"
    satcore.write_dump(path, held, meta={"split": "heldout"})
    cli = json.loads(invoke("score", path, "--tolerance", 1e-3, "--rho", 0.01, "--json").output)
    assert [c["test"]["tolerance"] for c in cli["candidates"]] == pytest.approx([t.tolerance for t in implicit.tests],
                                                                                rel=1e-12)
