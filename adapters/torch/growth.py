"""Grow a PyTorch model until the evidence says stop: the core loop (:mod:`satcore._growth.loop`) on torch.

Each round decides where a block goes (by default the first-order verdicts of a probe
on ``probe_data``, a split the model does not train on; or a pluggable ``decide``),
inserts a zero-output block there, calls the user's ``train(model, round)``, and with
``heldout_data`` guards the held-out loss: a harm beyond noise rolls the block back and
stops (``heldout_knee``), a gain below the guard's tolerance stops.  docs/growth.md
describes the rounds, the stop reasons, the enlarged probe and the log.

Which block.  ``family="native"`` (the default) inserts a block of the model's own kind
(:func:`~.native.insert_block`; GPT-2, GPT-NeoX, Llama-style, pre-norm encoders,
torchvision-style ResNets) and probes exactly its tangent space.  Any other family
(``"auto"``, a kind such as ``"mlp"`` or ``"conv"``, or an ``nn.Module`` feature map)
grows any model the probe can read, a user's own ResNet or an ``nn.Sequential`` of
residual blocks (``candidates=[names]``) included: the block is the family's
zero-output residual ``z + V psi(z)`` with ``V = 0`` (:func:`~.grow.insert_branch`),
drawn at the round's seed, whose first-order value the probe measured.

Weights.  With ``log_path`` each kept round's ``state_dict`` goes beside the log
(``<log>.round<k>.pt``) through satcore's atomic writer (no partial file, a planted
link at that name is replaced, not followed).  On resume the file is checked before a
byte is unpickled: a regular file, a zip of uncompressed members whose sizes add up to
no more than the model's own tensors need, then ``torch.load(weights_only=True)``
(no code), then every key and shape against the model.
"""

from __future__ import annotations

import os
import stat
import sys
import warnings
import zipfile
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from satcore.adapter_api import atomic_write
from satcore.adapter_api import display_name
from satcore.adapters.batches import split_batch
from satcore import GrowthLogError, InputError, ProbeError
from satcore import DecisionPolicy, FirstOrderDecide, GrowthOptions, GrowthResult, GrowthRound, run_growth
from satcore.adapter_api import AdapterSteps, moved_keywords, round_summary
from satcore.adapters.base import growth_decision, require_round_data, warn_if_heldout_is_probe

from .features import rebuild_feature_map
from .grow import InsertedResidual, insert_branch
from .hf import model_loss
from .locate import HEAD, find_blocks, find_candidates, named_candidates
from .native import FAMILY_INSTEAD, insert_block, zero_map_meets_batchnorm
from .probe import Probe, ProbeConfig, call_model

WEIGHTS_SLACK_BYTES = 2**20  # the pickle, the zip directory and 64-byte record alignment of a torch.save file


def per_sample_losses(model: nn.Module, data, loss_fn) -> np.ndarray:
    """Per-sample losses of ``model`` over batches (``(inputs, targets)`` or mappings with ``labels``,
    :mod:`satcore.adapters.batches`; ``loss_fn=None``: the model's own per-sample loss), in eval mode,
    no gradients."""
    was_training = model.training
    model.eval()
    out = []
    fn = model_loss(model) if loss_fn is None else loss_fn
    with torch.no_grad():
        for batch in data:
            inputs, targets = split_batch(batch, targets_to_model=True)
            out.append(fn(call_model(model, inputs), targets).double().reshape(-1).cpu().numpy())
    model.train(was_training)
    return np.concatenate(out) if out else np.zeros(0)


def mean_loss(model: nn.Module, data, loss_fn) -> float:
    """Mean per-sample loss of ``model`` over ``(inputs, targets)`` batches, in eval mode, no gradients."""
    return float(per_sample_losses(model, data, loss_fn).mean())


def save_weights(model: nn.Module, path: str) -> None:
    """``model.state_dict()`` to ``path``, whole or not at all (satcore's atomic writer)."""
    state = model.state_dict()
    atomic_write(path, lambda stream: torch.save(state, stream))


def _expected_bytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))


def load_weights(model: nn.Module, path: str) -> nn.Module:
    """Load the weights file ``path`` into ``model`` after the checks of the module docstring."""
    shown = display_name(path)
    own = model.state_dict()
    limit = _expected_bytes(own) + 64 * len(own) + WEIGHTS_SLACK_BYTES
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise GrowthLogError(f"{shown}: the weights of a logged round are missing; cannot resume") from None
    if not stat.S_ISREG(info.st_mode):
        raise GrowthLogError(f"{shown}: not a regular file; refusing to read it as weights")
    if info.st_size > limit:
        raise GrowthLogError(f"{shown}: {info.st_size} bytes, more than this model's weights take ({limit}); "
                             "not this run's weights")
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise GrowthLogError(f"{shown}: not a torch weights file ({exc})") from None
    packed = [m.filename for m in members if m.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise GrowthLogError(f"{shown}: member {display_name(packed[0])!r} is compressed; torch.save writes none")
    declared = sum(m.file_size for m in members)
    if declared > limit:
        raise GrowthLogError(f"{shown}: members declare {declared} bytes, more than this model's weights take "
                             f"({limit})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- whatever the unpickler refuses is a damaged file
        raise GrowthLogError(f"{shown}: cannot be read as weights ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(state, dict):
        raise GrowthLogError(f"{shown}: holds a {type(state).__name__}, not a state_dict")
    for key in list(own) + [k for k in state if k not in own]:  # the model's order: its first key named
        if key not in state or key not in own:
            side = "missing from the file" if key not in state else "not in the model"
            raise GrowthLogError(f"{shown}: key {display_name(key)!r} {side}; not this run's weights")
        value = state[key]
        if not isinstance(value, torch.Tensor) or value.shape != own[key].shape:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise GrowthLogError(f"{shown}: key {display_name(key)!r} has shape {shape}, the model's "
                                 f"{tuple(own[key].shape)}")
    model.load_state_dict(state)
    return model


def _family_label(family):
    if isinstance(family, nn.Module):
        return f"module:{type(family).__name__}"
    if isinstance(family, dict):
        return {k: _family_label(v) for k, v in family.items()}
    return family


def _has_module(family) -> bool:
    return isinstance(family, nn.Module) or (isinstance(family, dict) and any(map(_has_module, family.values())))


class TorchGrowthSteps(AdapterSteps):
    """The torch side of a round (:class:`satcore._growth.loop.GrowthSteps`)."""

    per_sample_losses = staticmethod(per_sample_losses)
    save_weights = staticmethod(save_weights)
    load_weights = staticmethod(load_weights)
    weights_suffix = ".pt"

    def __init__(self, train, loss_fn, data: dict, probe: ProbeConfig, zero: str = "terminal"):
        self.train_fn, self.loss_fn, self.data = train, loss_fn, data
        self.probe, self.family, self.zero = probe, probe.family, zero

    @property
    def native(self) -> bool:
        return isinstance(self.family, str) and self.family == "native"

    def start_probe(self, model, seed: int) -> Probe:
        return Probe(model, self.loss_fn, replace(self.probe, seed=seed, split="probe"))

    def _candidates(self, model):
        names, head = self.probe.candidates, self.probe.head
        return find_candidates(model, head=head) if names is None else named_candidates(model, names, head=head)

    def depth(self, model) -> int:
        if self.native:
            return len(find_blocks(model))
        base = [c for c in self._candidates(model) if c.name != HEAD]
        return len(base) + sum(isinstance(m, InsertedResidual) for m in model.modules())

    def insert(self, model, at: str, seed: int):
        if self.native:
            if self.zero == "terminal" and zero_map_meets_batchnorm(model, at):
                warnings.warn(f"grow_until_saturated: the block inserted at {at} has its terminal conv zeroed before a "
                              "BatchNorm; a train(model, round) that runs it in train mode normalises that zero map and "
                              "the first steps can raise the loss far (then the guard rolls the block back: "
                              "'heldout_knee'). Train it with its BatchNorms in eval mode for the first steps, or pass "
                              "GrowthOptions(zero='norm') (docs/growth.md)", UserWarning, stacklevel=2)
            return insert_block(model, at, seed=seed, zero=self.zero), None
        # the feature map the round's probe measured at ``at``: built on one batch, as the probe builds it
        state = self.start_probe(model, seed)
        state.update(next(iter(self.data["probe"])))
        candidate = next(c for c in state.found if c.name == at)
        features = state.families[at]
        return insert_branch(model, candidate, features), {"family": features.spec}

    def replay(self, model, entry: GrowthRound):
        if self.native:
            return insert_block(model, entry.inserted_at, seed=entry.seed, zero=self.zero)
        spec = (entry.inserted_block or {}).get("family")
        if not isinstance(spec, dict) or spec.get("kind") not in ("mlp", "conv", "linear", "bias"):
            raise GrowthLogError(f"round {entry.round}: the logged block has no built-in family to rebuild it from")
        candidate = next((c for c in self._candidates(model) if c.name == entry.inserted_at), None)
        if candidate is None:
            raise GrowthLogError(f"round {entry.round}: candidate {display_name(entry.inserted_at)!r} is not in "
                                 "this model")
        reference = next(model.parameters())
        return insert_branch(model, candidate, rebuild_feature_map(spec, reference.dtype, reference.device))

    def settings(self) -> dict:
        candidates = self.probe.candidates
        return {"framework": "torch", "family": _family_label(self.family), "zero": self.zero,
                "candidates": None if candidates is None else list(candidates)}


@moved_keywords("grow_until_saturated")
def grow_until_saturated(model: nn.Module, train, probe_data, loss_fn, *, heldout_data=None, train_data=None,
                         options: GrowthOptions | None = None, policy=None) -> GrowthResult:
    """Rounds of decide -> insert -> train -> guard until the evidence says stop (module docstring).

    Parameters
    ----------
    model : nn.Module
        The trained model; not modified (each insertion makes a new model).
    train : callable
        ``train(model, round) -> model``: trains the grown model for the round's budget.  A resumed
        run repeats the uninterrupted one only if it is deterministic (seeded by ``round``).
    probe_data : iterable of (inputs, targets)
        The probe split (independent of training: the tests assume it).
    loss_fn : callable
        Per-sample loss ``loss_fn(outputs, targets) -> (B,)`` (as for :func:`~.probe.probe`).
    heldout_data, train_data : iterables of (inputs, targets), optional
        Where the held-out and training losses are measured each round (without ``train_data``
        the "training" loss logged is the probe split's).  ``heldout_data`` turns the guard on; holding
        ``probe_data``'s own batches, it warns (the guard would read what the decision chose on).
    options : satcore.GrowthOptions
        The run's own settings (:class:`satcore._growth.loop.GrowthOptions`): ``criteria``, the first-order
        decision (:class:`~satcore._growth.loop.GrowthCriteria`: a gain of at most ``tolerance`` (loss
        units) by a block of relative size ``rho`` does not matter; level ``alpha``), needed unless
        ``policy`` decides the rounds; ``budget`` (``max_depth``, ``max_rounds``); ``guard``
        (:class:`~satcore._growth.loop.HeldoutGuard`; ``None``: measure, never stop on it); ``seed``
        (round ``k`` decides and inserts with seed ``seed * 1000 + k``); ``first_look_batches`` (start each
        round's probe with this many batches of ``probe_data`` and enlarge it while inconclusive,
        docs/growth.md; ``probe_data`` then needs a ``len()``); ``probe`` (a :class:`~.probe.ProbeConfig`:
        ``family``, ``"native"`` by default (the model's own block) or a family for the generic zero-output
        residual, ``candidates``, ``mask``, ``batch_dtype``, ...); ``zero`` (passed to
        :func:`~.native.insert_block`, native family); ``log_path`` (JSON-lines log,
        :mod:`satcore._growth.log`; the weights of each round go beside it; an existing log is resumed, or
        returned if its run finished under the same settings); ``progress`` (a progress bar on stderr of
        what moves within a round: the first-order probe's samples, a ``DecisionPolicy``'s batches of work (its
        decide's model evaluation, probe and trial steps), or for a callable ``policy`` the rounds; and one line
        per round).
    policy : satcore.DecisionPolicy or callable, optional
        How each round decides.  ``None``: the first-order probe (``options.criteria``).  A
        :class:`satcore.DecisionPolicy`: :func:`~.decide.decide` under it, at the round's seed (the first-order
        screen verified by short trials of its recipe; needs ``train_data``, the split the trials train on, and
        takes ``probe_data`` as its held-out split; its places, where it names none, are ``options.probe``'s
        candidates, its probe options, where it gives none, ``options.probe``'s).  A callable
        ``decide(model, seed)`` -> a decision with ``choice``, ``stop_reason`` and ``to_dict()``.
    """
    options = (GrowthOptions() if options is None else options).deciding(first_order=policy is None)
    probe = ProbeConfig(family="native") if options.probe is None else options.probe
    if not isinstance(probe, ProbeConfig):
        raise InputError(f"growth options: probe must be a satcore.adapters.torch.ProbeConfig, got "
                         f"{type(probe).__name__}")
    if options.log_path is not None and _has_module(probe.family):
        raise GrowthLogError(f"{display_name(os.fspath(options.log_path))}: an nn.Module family cannot be rebuilt "
                             "when the run resumes; use a built-in family or no log_path")
    require_round_data(probe_data, heldout_data, train_data)
    warn_if_heldout_is_probe(policy, probe_data, heldout_data)
    data = {"probe": probe_data, "train": train_data if train_data is not None else probe_data,
            "heldout": heldout_data}
    steps = TorchGrowthSteps(train, loss_fn, data, probe, options.zero)
    # the bar counts what moves within a round: the first-order probe's samples, a policy's decide's batches of
    # work (its model evaluation, probe and trial steps); a callable decide has no hook, so rounds
    unit = "sample" if policy is None else "batch" if isinstance(policy, DecisionPolicy) else "round"
    bar = _ProgressBar(unit) if options.progress else None
    from .decide import decide as decide_fn

    decide = growth_decision(policy, decide_fn, (train_data, probe_data), loss_fn, probe,
                             progress=False if bar is None else bar.update)
    if decide is None:
        decide = FirstOrderDecide(steps.start_probe, probe_data, options.criteria, options.first_look_batches,
                                  None if bar is None else bar.update)
    try:
        return run_growth(model, steps, decide, options, log_path=options.log_path,
                          on_round=None if bar is None else bar.round_done)
    except ProbeError as exc:  # the native family's refusal, with the place a growth run takes its family
        if FAMILY_INSTEAD not in str(exc):
            raise
        raise ProbeError(str(exc).replace(FAMILY_INSTEAD, GROWTH_FAMILY_INSTEAD)) from None
    finally:
        if bar is not None:
            bar.close()


GROWTH_FAMILY_INSTEAD = "options=GrowthOptions(probe=ProbeConfig(family='auto')), a kind or an nn.Module"


class _ProgressBar:
    """A tqdm bar counting ``unit``s: probed samples (``"sample"``), a decision's batches of work (``"batch"``) or
    finished rounds (``"round"``), and one line per round."""

    def __init__(self, unit: str):
        from tqdm.auto import tqdm

        self.unit = unit
        self.bar = tqdm(unit=unit, desc="probe" if unit == "sample" else "growth")

    def update(self, samples: int) -> None:
        self.bar.update(samples)

    def round_done(self, entry: GrowthRound) -> None:
        if self.unit == "round":
            self.bar.update(1)
        self.bar.write(round_summary(entry), file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


__all__ = ["GrowthResult", "GrowthRound", "TorchGrowthSteps", "grow_until_saturated", "load_weights", "mean_loss",
           "per_sample_losses", "save_weights"]
