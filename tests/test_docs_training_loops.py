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
    assert len(snippets) == 4
    namespace = {}
    exec(compile("\n".join(snippets), "training-loops.md", "exec"), namespace)
    assert namespace["grouped"].report().best_candidate in namespace["grouped"].statistics
    logged = namespace["trainer"].state.log_history[-2]  # the decide= snippet's trainer
    assert any(k.startswith("satcore/") for k in logged) and logged["satcore/decision/insert"] in (0.0, 1.0)
    assert str(namespace["report"]).splitlines()[1].startswith("decision: ")
    err = capfd.readouterr().err
    assert "bos_token_id must be" not in err and "eos_token_id must be" not in err, err
