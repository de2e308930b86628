"""``satcore score / inspect / merge`` through click's runner and the installed console script.

JSON values are compared with the core's array functions, with the explicit
projector (``satcore.projected_growth_value``) and with per-sample loops for
the certification quantities.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import click
from click.testing import CliRunner

import satcore
from satcore.cli.common import StderrProgress
from satcore.cli.main import main

SATCORE = Path(sys.executable).parent / "satcore"


def arrays(seed=0):
    """Three candidates of different shapes; 'layer2.0' carries a realizable signal."""
    rng = np.random.default_rng(seed)
    M = 40
    out = {}
    psi = rng.standard_normal((M, 3, 6))
    out["layer1.0"] = (rng.standard_normal((M, 3, 4)), psi)
    psi = rng.standard_normal((M, 5))
    out["layer2.0"] = (psi @ rng.standard_normal((5, 4)) + 0.1 * rng.standard_normal((M, 4)), psi)
    out["layer2.1"] = (rng.standard_normal((M, 4)).astype(np.float32), rng.standard_normal((M, 30)).astype(np.float32))
    return out


@pytest.fixture()
def dump(tmp_path):
    path = tmp_path / "d.npz"
    satcore.write_dump(path, raw=arrays(), meta={"split": "val", "framework": "numpy"})
    return path


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def per_sample_sigma_sq(q, psi):
    """Unbiased variance of xi_i = vec(Q_i^T Psi_i), by an explicit per-sample loop."""
    q = np.asarray(q, np.float64).reshape(q.shape[0], -1, q.shape[-1])
    psi = np.asarray(psi, np.float64).reshape(psi.shape[0], -1, psi.shape[-1])
    xi = np.stack([(q[i].T @ psi[i]).ravel() for i in range(q.shape[0])])
    return float(np.sum((xi - xi.mean(0)) ** 2) / (xi.shape[0] - 1))


def test_score_json_matches_core_and_explicit_projector(dump):
    out = json.loads(invoke("score", dump, "--json").stdout)
    assert out["schema"] == "satcore-report/2" and out["split"] == "val"
    data = arrays()
    assert [c["name"] for c in out["candidates"]] == list(data)
    for c, (name, (q, psi)) in zip(out["candidates"], data.items()):
        assert c["n_samples"] == q.shape[0] and c["n_hidden"] == q.shape[-1] and c["n_features"] == psi.shape[-1]
        assert c["ag"] == pytest.approx(satcore.ag(q), rel=1e-12)
        assert c["ag_normalized"] == pytest.approx(satcore.ag_normalized(q), rel=1e-12)
        assert c["growth_value"] == pytest.approx(satcore.growth_value(q, psi), rel=1e-12)
        assert c["growth_value"] == pytest.approx(satcore.projected_growth_value(q, psi), rel=1e-9)
        assert c["realizability"] == pytest.approx(satcore.growth_value(q, psi) / satcore.ag(q), rel=1e-12)
        assert c["cross_gradient_norm"] == pytest.approx(np.linalg.norm(satcore.cross_gradient(q, psi)), rel=1e-12)
        assert c["feature_rank"] == satcore.feature_rank(psi)
        assert c["sigma_sq"] == pytest.approx(per_sample_sigma_sq(q, psi), rel=1e-9)
    gv = {n: satcore.growth_value(q, psi) for n, (q, psi) in data.items()}
    assert out["depth"]["growth_value_max"] == pytest.approx(max(gv.values()), rel=1e-12)
    assert out["depth"]["argmax"] == max(gv, key=gv.get) == "layer2.0"
    assert out["depth"]["ag_max"] == pytest.approx(max(satcore.ag(q) for q, _ in data.values()), rel=1e-12)
    assert "test" not in out


def test_score_json_is_the_core_report(dump):
    out = json.loads(invoke("score", dump, "--json", "--error", "0.2").stdout)
    expected = satcore.read_dump(dump).statistics().report(split="val", error=0.2).to_dict()
    assert out.pop("dump") == str(dump)
    assert out == json.loads(json.dumps(expected))


def test_error_level_test_block_matches_prop1(dump):
    out = json.loads(invoke("score", dump, "--json", "--error", "0.1").stdout)
    data = arrays()
    norms = [np.linalg.norm(satcore.cross_gradient(q, psi)) for q, psi in data.values()]
    sigma = [per_sample_sigma_sq(q, psi) for q, psi in data.values()]
    t = np.sqrt(sum(s / 40 for s in sigma) / 0.1)  # Prop. 1 solved for t
    test = out["prop1"]
    assert test["gamma_hat"] == pytest.approx(max(norms), rel=1e-12)
    assert test["t"] == pytest.approx(t, rel=1e-9)
    assert test["error_bound"] == pytest.approx(0.1, rel=1e-9)
    assert test["interval"] == pytest.approx([max(0.0, max(norms) - t), max(norms) + t], rel=1e-9)
    assert test["saturated"] == (max(norms) <= t)


def test_delta_t_verdict_both_ways(dump):
    data = arrays()
    gamma = max(np.linalg.norm(satcore.cross_gradient(q, psi)) for q, psi in data.values())
    high = invoke("score", dump, "--delta", gamma / 2, "--t", gamma).stdout
    assert "prop1 (distribution-free" in invoke("score", dump, "--delta", 0.0, "--t", gamma / 4).stdout
    # the separated test's decision stays in the JSON; the text gives only its three-way reading
    assert "prop1 (distribution-free" in high and "SATURATED" not in high.replace("verdict: ", "")
    as_json = json.loads(invoke("score", dump, "--json", "--delta", 0.0, "--t", gamma / 4).stdout)["prop1"]
    assert as_json["saturated"] is False and as_json["threshold"] == pytest.approx(gamma / 4)
    sigma_sum = sum(per_sample_sigma_sq(q, psi) for q, psi in data.values())
    assert as_json["error_bound"] == pytest.approx(sigma_sum / (40 * (gamma / 4) ** 2), rel=1e-9)


def test_t_with_error_plans_the_probe_size(dump):
    """docs/core.md, Certification: with --t and --error, the probe size n >= sum sigma^2 / (a t^2) is reported,
    and a bound above 1 is called vacuous rather than read as a probability."""
    data = arrays()
    sigma_sum = sum(per_sample_sigma_sq(q, psi) for q, psi in data.values())
    t = 0.05
    test = json.loads(invoke("score", dump, "--json", "--t", t, "--error", 0.1).stdout)["prop1"]
    assert test["t"] == t and test["error_level"] == 0.1
    assert test["required_probe_size"] == int(np.ceil(sigma_sum / (0.1 * t**2)))
    assert test["error_bound"] == pytest.approx(sigma_sum / (40 * t**2), rel=1e-9)
    text = invoke("score", dump, "--t", t, "--error", 0.1).stdout
    assert f"n >= {test['required_probe_size']} (this probe: 40)" in text
    assert "vacuous" in text  # this bound is well above 1 on 40 samples
    assert test["error_bound"] > 1
    # without --error the level is --alpha (0.05 by default), for the size planned and for the reading
    for alpha in (0.05, 0.2):
        test = json.loads(invoke("score", dump, "--json", "--t", t, "--alpha", alpha).stdout)["prop1"]
        assert test["error_level"] == alpha
        assert test["required_probe_size"] == int(np.ceil(sigma_sum / (alpha * t**2)))


def test_the_no_decision_lines_name_the_decide_of_every_adapter_that_has_one():
    """The lines that send the reader of a first-order table to ``decide`` name a ``decide`` that exists, one per
    adapter that has one (torch and Keras; ONNX has none): a Keras user's report used to name only the torch one.
    Found from the adapters' source, not their imports (no framework is loaded)."""
    import importlib.util
    import re

    from satcore._rendering.table import NO_DECISION
    from satcore.cli.sweep import NO_STOP_DECISION

    import satcore.adapters

    deciding = {path.parent.name for path in Path(satcore.adapters.__file__).parent.glob("*/decide.py")
                if re.search(r"^def decide\(", path.read_text(), re.M)}
    assert deciding == {"torch", "tensorflow"}
    for line in (NO_DECISION, NO_STOP_DECISION):
        named = re.findall(r"satcore\.adapters\.(\w+)\.decide\b", line)
        assert sorted(named) == sorted(deciding), line
        assert all(importlib.util.find_spec(f"satcore.adapters.{framework}") is not None for framework in named)


def test_table_rows_in_depth_order_and_maximum_line(dump):
    text = invoke("score", dump).stdout
    lines = text.splitlines()
    # a dump carries no trials: the line under the header says that no insertion decision is made, before the table
    assert lines[1].startswith("insertion decision: none from statistics alone") and lines[2].startswith("candidate")
    names = [ln.split()[0] for ln in lines[3:6]]
    assert names == ["layer1.0", "layer2.0", "layer2.1"]
    gv = satcore.growth_value(*arrays()["layer2.0"])
    assert f"largest growth value (the raw estimate, not a recommendation): V {gv:.4g} at layer2.0" in text
    assert "verdict: " in text and "prop1 (distribution-free" in text


def test_probe_split_override_warns_on_training_set(dump):
    out = json.loads(invoke("score", dump, "--json", "--probe-split", "train").stdout)
    assert out["split"] == "train"
    assert any("training set" in w for w in out["warnings"])
    assert "warning:" in invoke("score", dump, "--probe-split", "train").stdout


def test_merge_of_shards_equals_union(tmp_path):
    data = arrays(5)
    cuts = (0, 13, 40)
    shards = []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        path = tmp_path / f"shard{i}.npz"
        satcore.write_dump(path, raw={n: (q[a:b], p[a:b]) for n, (q, p) in data.items()}, meta={"split": "val"})
        shards.append(path)
    merged = tmp_path / "merged.npz"
    text = invoke("merge", *shards, "-o", merged, "--quiet").stdout
    assert "2 dump(s)" in text
    got = json.loads(invoke("score", merged, "--json").stdout)
    assert got["split"] == "val"
    for c, (name, (q, psi)) in zip(got["candidates"], data.items()):
        want = satcore.score(q, psi, name=name)
        for field in ("ag", "growth_value", "cross_gradient_norm", "sigma_sq", "realizability"):
            assert c[field] == pytest.approx(getattr(want, field), rel=1e-12), (name, field)
        assert c["n_samples"] == 40
    assert satcore.read_dump(merged).meta["merged_from"] == ["shard0.npz", "shard1.npz"]


def test_merge_refuses_different_candidates(tmp_path, dump):
    other = tmp_path / "other.npz"
    q, psi = arrays()["layer1.0"]
    satcore.write_dump(other, raw={"layer9": (q, psi)})
    result = CliRunner().invoke(main, ["merge", str(dump), str(other), "-o", str(tmp_path / "m.npz")])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert "candidate lists differ" in result.stderr
    wider = tmp_path / "wider.npz"
    satcore.write_dump(wider, raw={n: (q, np.concatenate([p, p], -1)) for n, (q, p) in arrays().items()})
    result = CliRunner().invoke(main, ["merge", str(dump), str(wider), "-o", str(tmp_path / "m.npz")])
    assert result.exit_code == 2 and "candidate 'layer1.0': cannot merge statistics with (N, r, T)" in result.stderr


def test_inspect_summarises(dump):
    text = invoke("inspect", dump).stdout
    assert "satcore-dump/1; 3 candidate(s)" in text
    assert 'meta framework: "numpy"' in text
    assert "(40, 3, 4) float64" in text and "(40, 30) float32" in text
    assert "all values finite" in text
    assert "data read" not in invoke("inspect", dump, "--headers-only").stdout


def test_score_plot_writes_png(dump, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")  # the plot extra
    png = tmp_path / "score.png"
    invoke("score", dump, "--plot", png, "--quiet")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a plot whose write fails (a full disk) fails the command, after the scores were printed; a folder that is
    # missing is refused before them (test_hostile_outputs)
    from satcore._io.atomic import OutputError

    def full_disk(path, write, *, inputs=()):
        raise OutputError(f"{path}: cannot write (No space left on device)")

    monkeypatch.setattr("satcore.cli.plot.atomic_write", full_disk)
    result = CliRunner().invoke(main, ["score", str(dump), "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and "largest growth value" in result.stdout
    assert "No space left on device" in result.stderr and not (tmp_path / "x.png").exists()


def test_installed_console_script(dump, tmp_path):
    def run(*a):
        return subprocess.run([str(SATCORE), *map(str, a)], capture_output=True, text=True, timeout=120)

    proc = run("score", dump, "--json", "--error", "0.1")
    assert proc.returncode == 0 and proc.stderr == ""  # no progress: stderr is not a terminal
    assert json.loads(proc.stdout) == json.loads(invoke("score", dump, "--json", "--error", "0.1").stdout)
    assert run("inspect", dump).returncode == 0
    assert run("merge", dump, "-o", tmp_path / "m.npz").returncode == 0
    assert json.loads(run("score", tmp_path / "m.npz", "--json").stdout)["candidates"] == json.loads(proc.stdout)["candidates"]
    assert run("--help").returncode == 0


@pytest.mark.parametrize("module", ["satcore", "satcore.cli.main"])
def test_module_entry_point_runs_the_command(dump, module):
    # `python -m satcore` (and `satcore.cli.main`) is the console script without it on PATH; the second once exited
    # 0 doing nothing, and a newcomer looked for the first
    proc = subprocess.run([sys.executable, "-m", module, "score", str(dump), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(invoke("score", dump, "--json").stdout)
    usage = subprocess.run([sys.executable, "-m", module, "score", "--bogus"], capture_output=True, text=True,
                           timeout=120)
    assert (usage.returncode, usage.stderr) == (2, "satcore: error: No such option '--bogus'. (see 'satcore score "
                                                   "--help')\n")  # named as the console script is, one line


def test_cli_import_does_not_load_matplotlib_or_frameworks():
    # scipy.stats too: its import is two thirds of a bare CLI run's time, and the core needs only scipy.special
    modules = ('matplotlib', 'torch', 'tensorflow', 'onnxruntime', 'scipy.stats')
    code = f"import sys, satcore.cli.main; print(sorted(m for m in {modules} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "[]", proc.stderr


def test_progress_line(capsys):
    progress = StderrProgress("reading x", delay_s=0.0)
    progress(250, 1000)
    progress(1000, 1000)
    progress.close()
    err = capsys.readouterr().err
    assert "\rreading x:  25.0% of 1.0 kB" in err and err.endswith("100.0% of 1.0 kB\n")


def test_bare_form_through_the_cli(tmp_path):
    data = arrays(3)
    path = tmp_path / "bare.npz"
    np.savez(path, **{f"{kind}/{name}": arr for name, pair in reversed(data.items()) for kind, arr in zip(("q", "psi"), pair)})
    out = json.loads(invoke("score", path, "--json").stdout)
    assert [c["name"] for c in out["candidates"]] == list(reversed(data))  # key order, not sorted
    assert out["split"] is None
    for c in out["candidates"]:
        assert c["growth_value"] == pytest.approx(satcore.growth_value(*data[c["name"]]), rel=1e-12)


@pytest.mark.parametrize("args, words", [
    # without --train nothing is predicted: the step's options would be dropped without a word
    (["--lr", "0.05"], "--lr applies only with --train"),
    (["--optimizer", "adam", "--steps", "30"], "--optimizer, --steps apply only with --train"),
    # the matched block is sized by --rho: the refusal names the flag, not the Python API's criteria
    (["--train", "{dump}", "--optimizer", "matched"], "--optimizer matched needs --rho"),
    (["--train", "{dump}", "--optimizer", "matched", "--rho", "0.01", "--lr", "0.1"],
     "--optimizer matched is sized by --rho alone"),
    (["--train", "{dump}"], "--train needs --lr"),
])
def test_score_refuses_step_options_it_would_not_price_as_asked(dump, args, words):
    """``score``'s step options (``--optimizer``, ``--lr``, ``--steps``) act only with ``--train``, and each
    step needs its own size: a combination that would be ignored or priced otherwise is one line naming the
    flags, exit 2."""
    result = CliRunner().invoke(main, ["score", str(dump), *(a.format(dump=dump) for a in args)])
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_score_refuses_the_held_out_dump_as_its_own_training_split(dump, tmp_path):
    """``--train DUMP`` on DUMP itself (or a link to it) would fit the step and measure its held-out gain on the
    same samples, an in-sample number printed as held-out: one line naming --train, exit 2."""
    link = tmp_path / "link.npz"
    link.symlink_to(dump)
    for train in (dump, link):
        result = CliRunner().invoke(main, ["score", str(dump), "--train", str(train), "--lr", "0.1"])
        assert result.exit_code == 2, result.output
        assert "is DUMP itself" in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args, words", [(["--json", "--format", "csv"], "--json and --format csv disagree"),
                                         (["--lr", "0.1"], "--lr applies only with --train")])
def test_score_usage_errors_come_before_reading_the_dump(tmp_path, args, words):
    """A contradiction among the flags is known before DUMP is read: on a dump that takes minutes to stream it
    must not cost them (here DUMP does not exist, so a check after reading would name the file instead)."""
    result = CliRunner().invoke(main, ["score", str(tmp_path / "absent.npz"), *args])
    assert result.exit_code == 2, result.output
    assert words in result.output and "absent.npz" not in result.output


def test_a_full_standard_output_is_named_in_the_one_line():
    """``satcore score DUMP > /dev/full``: the write fails with an OSError that carries no file name; the line
    names the stream instead of a bare '[Errno 28] No space left on device'."""
    import errno
    import io

    from satcore.cli.main import _message

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    for err, stream in ((False, "standard output"), (True, "standard error")):
        with pytest.raises(OSError) as info:
            click.echo("a table", file=Full(), err=err)
        assert _message(info.value) == f"{stream}: No space left on device"
    assert _message(OSError(errno.ENOSPC, "No space left on device")) == "[Errno 28] No space left on device"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_real_full_or_closed_standard_output(dump):
    """In a real process: ``> /dev/full`` is one line naming standard output, exit 2; a pipe already closed by its
    reader (``| head`` having exited) ends silently with status 1, no traceback (click's own EPIPE handling)."""
    command = [sys.executable, "-m", "satcore", "score", str(dump), "--json"]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (2, "satcore: error: standard output: No space left on device\n")
    read_end, write_end = os.pipe()
    os.close(read_end)  # before the process starts: its first write meets a closed pipe whatever the timing
    try:
        proc = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (1, "")
