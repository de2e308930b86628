"""docs/growth.md runs as written: its Python snippets, in order, in one namespace, on a tiny GPT-2; and the
arguments it leaves to the reader are named as the parameters they fill (the page called ``probe_data``
``probe_split``, a name the loop does not have)."""

import ast
import inspect
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXT = (Path(__file__).parent.parent / "docs" / "growth.md").read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", TEXT, re.S)
INSERT, LOOP, LOG = (next(s for s in SNIPPETS if marker in s)
                     for marker in ("insert_block(", "grow_until_saturated(", "read_growth_log("))


def test_growth_doc_names_the_loops_arguments_as_its_parameters():
    """Every variable the loop's call takes positionally and the page does not define (``model``, ``train``,
    ``probe_data``) is the parameter's own name: the prose speaks of them by it."""
    from satcore.adapters.torch import grow_until_saturated

    tree = ast.parse(LOOP)
    defined = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for alias in node.names}
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "grow_until_saturated")
    parameters = list(inspect.signature(grow_until_saturated).parameters)
    given = [(arg.id, parameters[i]) for i, arg in enumerate(call.args) if arg.id not in defined]
    assert given == [("model", "model"), ("train", "train"), ("probe_data", "probe_data")]


def test_growth_doc_snippets_run(monkeypatch, tmp_path):
    """The loop's snippet grows (or stops) a one-block GPT-2 on 16 one-sample batches (the page's
    ``first_look_batches=16``: one look), and the log snippet reads back the rounds the loop returned."""
    monkeypatch.chdir(tmp_path)
    assert len(SNIPPETS) == 3
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8,
                                     bos_token_id=0, eos_token_id=0)
    generator = torch.Generator().manual_seed(0)

    def batches(n):
        return [(ids, ids) for ids in (torch.randint(0, 16, (1, 4), generator=generator) for _ in range(n))]

    def train(model, round):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in batches(2):
            optimizer.zero_grad()
            model(input_ids=x, labels=y).loss.backward()
            optimizer.step()
        return model

    namespace = {"model": transformers.GPT2LMHeadModel(config), "train": train, "probe_data": batches(16),
                 "heldout_batches": batches(4)}
    exec(compile(LOOP, "growth.md", "exec"), namespace)
    result = namespace["result"]
    exec(compile(LOG, "growth.md", "exec"), namespace)
    logged = [(r.round, r.depth, r.inserted_at, r.rolled_back, r.stop_reason) for r in namespace["log"].rounds]
    assert logged == [(r.round, r.depth, r.inserted_at, r.rolled_back, r.stop_reason) for r in result.rounds]
    assert logged and logged[-1][-1] == result.stop_reason


def test_growth_doc_trains_the_inserted_block_not_the_one_it_shifted():
    """The page's insert snippet on a ResNet whose ``layer1`` holds two blocks: ``block`` is the new block (it
    leaves the function unchanged: its terminal convolution is zero), the old ``layer1.1`` is ``layer1.2`` with its
    weights, only ``block``'s parameters train and the copy is in eval mode."""
    from satcore.adapters.torch import insert_block
    from zoo.models_torch import DigitsResNet

    torch.manual_seed(0)
    model = DigitsResNet().eval()
    namespace = {"model": model, "insert_block": insert_block}
    exec(compile(INSERT, "growth.md", "exec"), namespace)
    grown, block = namespace["grown"], namespace["block"]
    old = model.layer1[1].state_dict()
    assert any(not torch.equal(old[k], v) for k, v in block.state_dict().items())  # not the shifted old block
    assert all(torch.equal(old[k], v) for k, v in grown.layer1[2].state_dict().items())
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(grown(x), model(x))
    assert {id(p) for p in grown.parameters() if p.requires_grad} == {id(p) for p in block.parameters()}
    assert not grown.training
