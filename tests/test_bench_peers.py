"""bench/bench_peers.py: every contender's measured call starts from the same state and builds what it uses.

Problem settings: the bench's two workloads at its quick sizes.  Cases: every contender's runner.
Reference: the blocks :func:`find_blocks` finds, one feature map (one ``make_family`` draw) each.
"""

import importlib.util

import pytest
import torch

import satcore.adapters.torch.features as features_module
from bench import bench_peers

# BackPACK's hooks on V, whose input needs no gradient (the bench ignores it too)
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def hooks_on(model) -> int:
    """Forward, pre-forward and backward hooks registered on any module of ``model``."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(m._backward_pre_hooks) for m in model.modules())


@pytest.fixture(params=["gpt2", "resnet8"])
def counted_contenders(request, monkeypatch):
    """The workload's setting and runners, and the list every feature-map draw appends its width to."""
    draws = []

    def counting_make_family(kind, width, **options):
        draws.append(width)
        return make_family(kind, width, **options)

    make_family = features_module.make_family
    monkeypatch.setattr(features_module, "make_family", counting_make_family)
    setting, runs = bench_peers.contenders(request.param, "quick")
    return setting, runs, draws


def test_the_shared_setting_holds_nothing_of_any_tool(counted_contenders):
    setting, runs, draws = counted_contenders
    assert draws == []  # no feature map built before the measured calls
    assert hooks_on(setting["model"]) == 0
    assert not any(p.requires_grad for p in setting["model"].parameters())
    assert set(setting["layouts"]) == set(setting["blocks"])
    assert all(like.numel() <= like.shape[1] for like in setting["layouts"].values())  # widths only, no data


# the peers' packages, installed where the bench runs (not by the test install): their runners are checked there
PEER_PACKAGES = {"backpack": "backpack", "gromo": "gromo"}


def installed(contender: str) -> bool:
    """Whether ``contender``'s package imports here (satcore's always does)."""
    package = next((m for prefix, m in PEER_PACKAGES.items() if contender.startswith(prefix)), None)
    return package is None or importlib.util.find_spec(package) is not None


def test_every_contender_builds_its_feature_maps_inside_its_call_and_leaves_the_model_as_found(counted_contenders):
    setting, runs, draws = counted_contenders
    model, blocks = setting["model"], setting["blocks"]
    weights = {name: p.clone() for name, p in model.named_parameters()}
    widths = sorted(setting["layouts"][name].shape[1] for name in blocks)
    checked = [name for name in runs if installed(name)]
    assert {"satcore", "satcore_scored"} <= set(checked)
    for name in checked:
        run = runs[name]
        draws.clear()
        run()
        assert sorted(draws) == widths, name  # one seeded feature map per block, drawn in the measured call
        assert hooks_on(model) == 0, name
        assert all(torch.equal(p, weights[n]) and not p.requires_grad for n, p in model.named_parameters()), name


def test_one_workload_run_keeps_the_other_workloads_rows(tmp_path, monkeypatch):
    """``--workload gpt2`` reruns GPT-2's rows only: the details it starts from are the recorded peers
    section's (ResNet-8's kept as they are), none where no results or no peers section exist yet."""
    import json

    path = tmp_path / "results.json"
    monkeypatch.setattr(bench_peers, "results_path", lambda values=None: path)
    assert bench_peers.recorded_workloads(quick=False) == {}
    path.write_text(json.dumps({"sections": {"other": {}}}))
    assert bench_peers.recorded_workloads(quick=False) == {}
    resnet8 = {"seconds": {"satcore": 0.6}, "blocks": ["layer1"]}
    path.write_text(json.dumps({"sections": {"peers": {"workloads": {"resnet8": resnet8}}}}))
    assert bench_peers.recorded_workloads(quick=False) == {"resnet8": resnet8}
