"""Hostile and careless arguments to ``satcore expand`` and the Python ``decide`` / ``grow`` entry points, a round
after those of ``test_hostile_checkpoints.py``: each must end in exit status 2 (``InputError`` in Python) with ONE
line naming the argument or file and what is wrong, no traceback, nothing written.
"""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from satcore import InputError
from satcore.cli.main import main
from test_hostile_inputs import assert_one_line


def refused(result, *expect):
    assert result.exit_code == 2, (result.output, result.exception)
    assert_one_line(result.stderr, expect)


@pytest.mark.parametrize("kind", ["missing", "file", "fifo"])
def test_a_model_dir_that_is_no_folder_is_named_for_what_it_is(kind, tmp_path):
    """MODEL_DIR that does not exist, or is a file or a FIFO: before, each read 'not a directory', which sent the
    user looking for a folder where there was nothing, or a file they had given by mistake."""
    pytest.importorskip("torch")
    model = tmp_path / "model"
    if kind == "file":
        model.write_text("{}")
    elif kind == "fifo":
        os.mkfifo(model)
    data = tmp_path / "corpus.txt"
    data.write_text("hello world\n")
    out = tmp_path / "o"
    expect = {"missing": "does not exist (a Hugging Face model folder is expected)",
              "file": "is a file, not a Hugging Face model folder",
              "fifo": "is a FIFO, not a Hugging Face model folder"}[kind]
    refused(CliRunner().invoke(main, ["expand", str(model), "--data", str(data), "--blocks", "1", "-o", str(out)]),
            f"{model}: {expect}")
    assert not out.exists()
    from satcore.adapters.torch.checkpoint_dir import load_causal_lm

    with pytest.raises(InputError, match=f"^{model}: {expect.split(' (')[0]}"):
        load_causal_lm(model)


@pytest.fixture(scope="module")
def mlp_probe():
    """A small residual MLP on digits and its probe result (blocks.0, blocks.1, head)."""
    torch = pytest.importorskip("torch")
    from satcore.adapters.torch import probe
    from zoo.models_torch import ResidualMLP, digits, per_sample_ce

    X, y = digits()
    torch.manual_seed(0)
    model = ResidualMLP()
    return model, probe(model, [(X[i : i + 32], y[i : i + 32]) for i in range(0, 128, 32)], per_sample_ce)


def test_grow_at_a_candidate_the_probe_lacks_is_an_input_error(mlp_probe):
    """grow(model, result, 'nope'): before, a bare ValueError, which a caller catching satcore's InputError (as the
    command line does) did not catch; now an InputError naming the argument, as the TensorFlow adapter's."""
    from satcore.adapters.torch import grow

    model, result = mlp_probe
    with pytest.raises(InputError, match=r"^at: unknown candidate 'nope'; the probe has \['blocks\.0', 'blocks\.1', "
                                         r"'head'\]$"):
        grow(model, result, "nope", rho=0.1)
