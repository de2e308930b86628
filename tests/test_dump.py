"""The satcore-dump/1 reader/writer: streamed chunked reading equals in-memory scoring.

References: the in-memory one-pass statistics (same core, no zip, no chunks),
the explicit projector (``satcore.projected_growth_value``), Lemma 4 with
explicit Jacobians (``satcore.growth_value_jacobian``) and eq. (2) by
``satcore.ag_batch``.
"""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import satcore
from core_problems import explicit_jacobians
from satcore import CandidateStatistics, read_dump, write_dump

DOC = Path(__file__).resolve().parents[1] / "docs" / "dump-format.md"
FLOAT_FIELDS = ("ag", "ag_normalized", "growth_value", "realizability", "cross_gradient_norm", "sigma_sq",
                "noise_floor", "signal_energy_debiased", "growth_value_sq_debiased")


def features(rng, M, T, r, kind):
    """Random features; 'deficient' repeats columns and adds a zero column (rank < r)."""
    if kind == "deficient":
        base = rng.standard_normal((M, T, max(1, r // 2)))
        psi = np.concatenate([base, base[..., :1], np.zeros((M, T, r - base.shape[-1] - 1))], axis=-1)
    else:
        psi = rng.standard_normal((M, T, r))
    return psi


def make_pair(seed, M, T, N, r, kind, dtype):
    rng = np.random.default_rng(seed)
    psi = features(rng, M, T, r, kind)
    q = rng.standard_normal((M, T, N)) + psi @ rng.standard_normal((r, N))  # some realizable signal
    if T == 1:
        q, psi = q[:, 0], psi[:, 0]
    return q.astype(dtype), psi.astype(dtype)


def assert_scores_match(got, want, rel=1e-12):
    # debiased values are differences of sums: their round-off scales with the sums, not the result
    scale = max(want.sigma_sq, want.ag**2)
    for field in FLOAT_FIELDS:
        absolute = rel * scale if "debiased" in field else 0.0
        assert getattr(got, field) == pytest.approx(getattr(want, field), rel=rel, abs=absolute), field
    for field in ("n_samples", "n_hidden", "n_features", "n_positions", "feature_rank", "tangent_complete"):
        assert getattr(got, field) == getattr(want, field), field


SETTINGS = [  # (M, T, N, r, kind)
    (37, 1, 5, 8, "full"),
    (37, 1, 6, 8, "deficient"),
    (23, 4, 3, 5, "full"),
    (23, 3, 4, 7, "deficient"),
    (9, 2, 3, 40, "full"),  # tangent complete: r >= M*T
]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("chunk", [1, 5, None])
def test_streamed_reading_equals_in_memory(tmp_path, setting, dtype, compress, chunk):
    M, T, N, r, kind = setting
    q, psi = make_pair(hash(setting) % 2**31, M, T, N, r, kind, dtype)
    path = tmp_path / "d.npz"
    write_dump(path, raw={"layer1.0": (q, psi)}, compress=compress)
    stats = read_dump(path).statistics(chunk_samples=chunk)
    in_memory = CandidateStatistics.from_samples(q, psi, variance=True)
    for field in ("sum_cross", "sum_gram", "sum_xtx"):
        np.testing.assert_allclose(getattr(stats["layer1.0"], field), getattr(in_memory, field), rtol=1e-12, atol=1e-12)
    got = stats.report()["layer1.0"]
    assert_scores_match(got, satcore.score(q, psi, name="layer1.0"))
    # independent references: explicit projector, and AG by its definition
    assert got.growth_value == pytest.approx(satcore.projected_growth_value(q, psi), rel=1e-9)
    q64 = np.asarray(q, np.float64)
    assert got.ag == pytest.approx(np.sqrt(np.sum(q64**2) / M), rel=1e-12)
    assert got.ag_batch is None  # chunks are not training batches


def test_fortran_ordered_member(tmp_path):
    q, psi = make_pair(3, 30, 1, 4, 6, "full", np.float64)
    path = tmp_path / "f.npz"
    np.savez(path, **{"q/a": np.asfortranarray(q), "psi/a": np.asfortranarray(psi)})
    got = read_dump(path).statistics(chunk_samples=7).report()["a"]
    assert_scores_match(got, satcore.score(q, psi))


@pytest.mark.parametrize("T", [1, 3])
def test_jacobian_candidate_is_lemma4(tmp_path, T):
    rng = np.random.default_rng(T)
    M, N, p = 25, 3, 5
    q = rng.standard_normal((M, T, N)) if T > 1 else rng.standard_normal((M, N))
    J = rng.standard_normal((M, T * N, p))
    psi = rng.standard_normal((M, T, 4)) if T > 1 else rng.standard_normal((M, 4))
    path = tmp_path / "j.npz"
    write_dump(path, jac={"general": (q, J), "standard_as_jac": (q, explicit_jacobians(psi, N))},
               raw={"standard": (q, psi)})
    report = read_dump(path).statistics(chunk_samples=4).report()
    assert report["general"].growth_value == pytest.approx(satcore.growth_value_jacobian(q, J), rel=1e-12)
    # the standard block written as explicit Jacobians J_i = I_N kron psi_i^T gives the same value
    assert report["standard_as_jac"].growth_value == pytest.approx(report["standard"].growth_value, rel=1e-10)
    assert report["general"].ag == pytest.approx(satcore.ag(q), rel=1e-12)
    # sigma^2 of xi_i = J_i^T q_i, computed directly
    xi = np.einsum("mkp,mk->mp", J, np.asarray(q).reshape(M, -1))
    sigma_sq = np.sum((xi - xi.mean(0)) ** 2) / (M - 1)
    assert report["general"].sigma_sq == pytest.approx(sigma_sq, rel=1e-10)


def test_bare_form_key_order_and_dotted_names(tmp_path):
    arrays = {name: make_pair(i, 15, 1, 3, 4, "full", np.float32) for i, name in
              enumerate(["layer2.1", "layer1.0", "transformer.h.0"])}
    members = {}
    for name, (q, psi) in arrays.items():
        members[f"psi/{name}"] = psi  # psi before q: order is by first appearance of the name
        members[f"q/{name}"] = q
    path = tmp_path / "bare.npz"
    np.savez(path, **members)
    dump = read_dump(path)
    assert dump.candidates == ("layer2.1", "layer1.0", "transformer.h.0")
    assert dump.schema is None and dump.meta == {}
    report = dump.statistics().report()
    for name, (q, psi) in arrays.items():
        assert report[name].growth_value == pytest.approx(satcore.growth_value(q, psi), rel=1e-12)


def test_meta_batch_size_gives_eq2(tmp_path):
    q, psi = make_pair(5, 50, 1, 4, 6, "full", np.float64)
    path = tmp_path / "b.npz"
    write_dump(path, raw={"a": (q, psi)}, meta={"batch_size": 8})
    for chunk in (3, 8, 21, None):
        got = read_dump(path).statistics(chunk_samples=chunk).report()["a"]
        assert got.ag_batch == pytest.approx(satcore.ag_batch(q, 8), rel=1e-12)


def test_stats_round_trip_and_mixed_forms(tmp_path):
    qa, pa = make_pair(1, 20, 1, 3, 5, "full", np.float64)
    qb, pb = make_pair(2, 20, 2, 2, 3, "full", np.float64)
    stats = satcore.DepthStatistics(a=CandidateStatistics.from_samples(qa, pa, batch_size=6))
    path = tmp_path / "m.npz"
    write_dump(path, stats, raw={"b": (qb, pb)}, meta={"candidates": ["b", "a"], "split": "val"})
    dump = read_dump(path)
    assert dump.candidates == ("b", "a") and dump.meta["split"] == "val"
    assert dump.form("a") == "stats" and dump.form("b") == "psi"
    back = dump.statistics()
    for field, value in stats["a"].to_arrays().items():
        np.testing.assert_array_equal(back["a"].to_arrays()[field], value)
    assert back.report()["a"].ag_batch == pytest.approx(satcore.ag_batch(qa, 6), rel=1e-12)


def test_merged_shards_equal_union(tmp_path):
    q, psi = make_pair(9, 60, 2, 3, 4, "full", np.float32)
    cuts = [0, 17, 41, 60]
    shards = []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        path = tmp_path / f"shard{i}.npz"
        write_dump(path, raw={"x": (q[a:b], psi[a:b])})
        shards.append(read_dump(path).statistics(chunk_samples=4))
    merged = shards[0].merge(shards[1]).merge(shards[2])
    write_dump(tmp_path / "merged.npz", merged)
    got = read_dump(tmp_path / "merged.npz").statistics().report()["x"]
    assert_scores_match(got, satcore.score(q, psi, name="x"))


def test_memory_is_bounded_by_the_chunk(tmp_path):
    """Peak traced allocation does not grow with the member: 4x the samples, same peak (one chunk)."""
    rng = np.random.default_rng(0)
    N, r = 32, 16
    peaks = {}
    for M in (10_000, 40_000):
        path = tmp_path / f"big{M}.npz"
        write_dump(path, raw={"a": (rng.standard_normal((M, N)), rng.standard_normal((M, r)))}, compress=True)
        tracemalloc.start()
        try:
            read_dump(path).statistics(chunk_samples=1000)
            peaks[M] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    member_bytes = 40_000 * (N + r) * 8
    assert peaks[40_000] < 1.1 * peaks[10_000], peaks
    assert peaks[40_000] < member_bytes / 3, (peaks, member_bytes)


def test_documented_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "docs/dump-format.md has no python example"
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], str(DOC), "exec"), {})
    dump = read_dump(tmp_path / "example_dump.npz")
    assert dump.candidates == ("blocks.0", "blocks.1")
    assert dump.meta["split"] == "val"
    with np.load(tmp_path / "example_dump.npz", allow_pickle=False) as plain:
        q, psi = plain["q/blocks.1"], plain["psi/blocks.1"]
        assert json.loads(plain["meta"].item())["candidates"] == ["blocks.0", "blocks.1"]
    got = dump.statistics().report()["blocks.1"]
    assert_scores_match(got, satcore.score(q, psi, name="blocks.1"))


def test_each_documented_score_command_prints_what_the_doc_says_it_adds(tmp_path, monkeypatch):
    """The commands the worked example names after its code, run as written: each option "adds" something, so its
    output differs from the plain table's; the Prop. 1 one adds the probe size that would decide at its ``t``."""
    from click.testing import CliRunner

    from satcore.cli.main import main

    text = DOC.read_text()
    monkeypatch.chdir(tmp_path)
    exec(compile(re.findall(r"```python\n(.*?)```", text, flags=re.S)[0], str(DOC), "exec"), {})
    options = [found.split() for found in re.findall(r"`satcore score example_dump\.npz([^`]*)`", text)]
    assert [] in options and ["--json"] in options and len(options) == 3
    outputs = {}
    for extra in options:
        result = CliRunner().invoke(main, ["score", "example_dump.npz", *extra])
        assert result.exit_code == 0, result.output
        outputs[" ".join(extra)] = result.output
    plain = outputs.pop("")
    assert all(out != plain for out in outputs.values()), "a documented option changes nothing"
    prop1 = next(out for extra, out in outputs.items() if extra != "--json")
    assert any(line.startswith("prop1 probe size for error <= 0.05 at t = ") for line in prop1.splitlines())


def test_write_dump_refuses_inconsistent_input(tmp_path):
    q, psi = make_pair(1, 5, 1, 2, 3, "full", np.float64)
    with pytest.raises(ValueError, match="given twice"):
        write_dump(tmp_path / "x.npz", raw={"a": (q, psi)}, jac={"a": (q, psi[:, None, :].repeat(2, 1))})
    with pytest.raises(ValueError, match="do not match"):
        write_dump(tmp_path / "x.npz", raw={"a": (q, psi)}, meta={"candidates": ["b"]})
    with pytest.raises(ValueError, match="q/a: dtype object"):
        write_dump(tmp_path / "x.npz", raw={"a": (np.array([[1.0, "x"]], dtype=object), psi[:1])})


def test_write_is_all_or_nothing_and_uses_the_path_as_given(tmp_path):
    """A write that fails part way (here: the file-size limit) leaves the earlier file whole and no
    partial file behind; a path without .npz is written as given, not with .npz appended."""
    import subprocess
    import sys

    q, psi = make_pair(1, 5, 1, 2, 3, "full", np.float64)
    good = tmp_path / "out"
    write_dump(good, raw={"a": (q, psi)})
    assert good.exists() and not (tmp_path / "out.npz").exists()
    before = good.read_bytes()
    script = f"""
import resource, signal, numpy as np
from satcore import write_dump
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) + 4096}, resource.RLIM_INFINITY))
try:
    write_dump({str(good)!r}, raw={{"a": (np.ones((4000, 64)), np.ones((4000, 64)))}})
except OSError as exc:
    print(exc)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    out = run.stdout
    assert run.returncode == 0, run.stderr
    assert out.startswith(f"{good}: cannot write (File too large)"), out
    assert good.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with pytest.raises(OSError, match="is a directory"):
        write_dump(tmp_path, raw={"a": (q, psi)})
