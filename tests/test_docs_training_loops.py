"""docs/training-loops.md runs as written: its Python snippets, in order, in one namespace."""

import re
from pathlib import Path

import pytest


def test_training_loops_doc_snippets_run(monkeypatch, tmp_path, capfd):
    """The snippets run in order, without warnings of their own making: the GPT-2 config names the tokenizer's special tokens (its
    default bos/eos id 50256 is outside the tokenizer's vocabulary, which transformers warned about twice)."""
    pytest.importorskip("accelerate")
    pytest.importorskip("pandas")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    text = (Path(__file__).parent.parent / "docs" / "training-loops.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(snippets) == 5
    namespace = {}
    exec(compile("\n".join(snippets), "training-loops.md", "exec"), namespace)
    assert namespace["grouped"].report().best_candidate in namespace["grouped"].statistics
    logged = namespace["trainer"].state.log_history[-2]  # the decide= snippet's trainer
    assert any(k.startswith("satcore/") for k in logged) and logged["satcore/decision/insert"] in (0.0, 1.0)
    assert str(namespace["report"]).splitlines()[1].startswith("decision: ")
    # the dump_dir= snippet's dump scores to its callback's report
    assert sorted(p.name for p in (tmp_path / "satcore-dumps").iterdir()) == ["satcore-step-000002.npz"]
    assert namespace["dump"].statistics().report().growth_value_max == namespace["dumped_report"].growth_value_max
    # nine probe batches: the fold test has the folds it needs, so the offline score can call a candidate
    assert namespace["dump"].statistics().report().tests[0].n_folds == 9
    err = capfd.readouterr().err
    assert "bos_token_id must be" not in err and "eos_token_id must be" not in err, err


def test_training_loops_doc_lists_every_probe_setting():
    """The doc's list of the PyTorch ``ProbeConfig`` settings is its fields, in order (``curvature`` was missing),
    and the TensorFlow ``ProbeConfig`` is its first seven and ``strategy`` (the doc called the two the same)."""
    import dataclasses

    from satcore.adapters.torch import ProbeConfig

    text = " ".join((Path(__file__).parent.parent / "docs" / "training-loops.md").read_text().split())
    listed = re.search(r"frozen `ProbeConfig` \(([^)]*)\)", text).group(1)
    torch_fields = [f.name for f in dataclasses.fields(ProbeConfig)]
    assert re.findall(r"`(\w+)`", listed) == torch_fields
    pytest.importorskip("tensorflow")
    from satcore.adapters.tensorflow import ProbeConfig as KerasProbeConfig

    assert "`ProbeConfig` takes the first seven and `strategy`" in text
    assert [f.name for f in dataclasses.fields(KerasProbeConfig)] == [*torch_fields[:7], "strategy"]
