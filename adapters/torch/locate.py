"""Where to probe: candidate insertion points of a PyTorch model.

A candidate is the residual stream at the INPUT of a residual block: inserting
a zero-output block ``z -> z + V psi(z)`` there is the paper's depth
expansion (Problem Setup).  A Hugging Face model that declares its layer
classes (``_no_split_modules``) gets those; otherwise blocks are found without
importing any model zoo:

* stacks of blocks: an ``nn.ModuleList`` or ``nn.Sequential`` whose last name is one of
  ``h`` (Hugging Face GPT-2, ``transformer.h``), ``layers`` (GPT-NeoX/Pythia
  ``gpt_neox.layers``, Llama-style ``model.layers``, ``nn.TransformerEncoder``),
  ``layer`` (BERT-style ``encoder.layer``), ``block``/``blocks``; every child
  that has submodules of its own is a block;
* torchvision-style ResNet blocks, recognised by structure: ``conv1``/``bn1``/
  ``conv2``/``bn2`` children (BasicBlock; Bottleneck adds ``conv3``/``bn3``).

The ``head`` endpoint is the OUTPUT of the last block, i.e. the stream the
model's head reads (before a final norm if any): inserting there appends a
block at the end.  Candidates are ordered as the modules are registered,
which is their forward order in the supported families (upstream first).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from satcore import ProbeError
from satcore.adapters.base import refuse_named_twice

STACK_NAMES = ("h", "layers", "layer", "block", "blocks")
HEAD = "head"


@dataclass(frozen=True)
class Candidate:
    """One insertion point: the ``position`` (``"input"``/``"output"``) of ``module``, whose
    stream is ``(T, B, d)`` when ``sequence_first``."""

    name: str
    module: str
    position: str = "input"
    sequence_first: bool = False


def is_resnet_block(module: nn.Module) -> bool:
    """torchvision BasicBlock/Bottleneck by structure (no torchvision import)."""
    return all(
        isinstance(getattr(module, c, None), nn.Conv2d) for c in ("conv1", "conv2")
    ) and all(isinstance(getattr(module, b, None), nn.modules.batchnorm._BatchNorm) for b in ("bn1", "bn2"))


def _is_inserted(module: nn.Module) -> bool:
    # a block already grown by satcore counts as one block
    return type(module).__name__ == "InsertedResidual"


def is_sequence_first(module: nn.Module) -> bool:
    """Whether ``module`` reads its stream as ``(T, B, d)`` (``batch_first=False``).

    The layer classes of ``nn.TransformerEncoder``/``Decoder`` keep the flag on
    their attention (``self_attn.batch_first``), not on themselves.
    """
    if _is_inserted(module):
        module = module.block
    if isinstance(module, (nn.TransformerEncoder, nn.TransformerDecoder)):
        module = module.layers[0]
    if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        module = module.self_attn
    return getattr(module, "batch_first", True) is False


def declared_blocks(model: nn.Module) -> list[str]:
    """The blocks a Hugging Face model declares: items of an ``nn.ModuleList`` whose class is one of
    its ``_no_split_modules`` (the units ``accelerate`` never splits across devices, i.e. its layers;
    embeddings listed there are no stack items), upstream first; ``[]`` when it declares none."""
    declared = set(getattr(model, "_no_split_modules", None) or ())
    if not declared:
        return []
    blocks: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or any(name.startswith(b + ".") for b in blocks):
            continue
        blocks.extend(f"{name}.{i}" for i, child in enumerate(module)
                      if type(child).__name__ in declared or _is_inserted(child))
    return blocks


def find_blocks(model: nn.Module) -> list[str]:
    """Module names of the residual blocks of ``model``, upstream first: the blocks it declares
    (:func:`declared_blocks`), else those the name and structure rules recognise."""
    blocks = declared_blocks(model)
    if blocks:
        return blocks
    for name, module in model.named_modules():
        if any(name == b or name.startswith(b + ".") for b in blocks):
            continue  # a block already found, or inside one
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and name.rpartition(".")[2] in STACK_NAMES:
            blocks.extend(
                f"{name}.{i}" for i, child in enumerate(module) if len(list(child.children())) > 0
            )
        elif name and (is_resnet_block(module) or _is_inserted(module)):
            blocks.append(name)
    return blocks


def find_candidates(model: nn.Module, *, head: bool = True) -> tuple[Candidate, ...]:
    """Block inputs of ``model`` (see module docstring), plus the ``head`` endpoint.

    Raises :class:`satcore.ProbeError` naming the model class when no block is recognised.
    """
    blocks = find_blocks(model)
    if not blocks:
        raise ProbeError(
            f"no residual blocks recognised in {type(model).__name__}; pass candidates=[module names]"
        )
    return with_head([_candidate(model, b) for b in blocks], head)


def locate_candidates(model: nn.Module, names=None, *, head: bool = True) -> tuple[Candidate, ...]:
    """The candidates a probe setting names: :func:`find_candidates` where ``names`` is None, else
    :func:`named_candidates`."""
    return find_candidates(model, head=head) if names is None else named_candidates(model, names, head=head)


def named_candidates(model: nn.Module, names, *, head: bool = True) -> tuple[Candidate, ...]:
    """Explicit candidates: the input of each named module (``head``: output of the last one)."""
    modules = dict(model.named_modules())
    names = list(names)
    if not names:
        raise ProbeError("candidates is empty")
    if HEAD in names:  # a candidate the names imply, not a module: refused with what it is
        raise ProbeError(f"candidates name modules; {HEAD!r} (the output of the last one) is added without being "
                         f"named: leave it out of {names}")
    # a module registered under two names (self.alias = self.blocks[0]) is listed under its first only
    first_name = {id(m): n for n, m in modules.items()}
    for n in names:
        named = isinstance(n, str) and n != ""  # "" names the model itself, not a place in it
        if named and n in modules:
            continue
        module = _submodule(model, n) if named else None
        if module is None:
            raise ProbeError(f"candidate {n!r} is not a submodule name of {type(model).__name__}; "
                             + _valid_names(model, modules))
        raise ProbeError(f"candidate {n!r} is the module {first_name[id(module)]!r} under a second name (one module "
                         f"registered twice); name it {first_name[id(module)]!r}")
    refuse_named_twice(names)
    return with_head([_candidate(model, n) for n in names], head)


def _submodule(model: nn.Module, name: str) -> nn.Module | None:
    """The module ``model.get_submodule(name)`` reaches, None where none does."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def decision_places(candidates=None, head: bool | None = None) -> dict:
    """The probe options (``candidates``, ``head``) of a decision that probes and trials exactly the places
    its user named: ``candidates`` ``None``, every block found and the head (unless ``head`` is False); a
    list of module names, those modules and the head only where the list names ``"head"`` (the output of the
    last named module, as the probe defines it) or ``head`` is True.  (A probe alone adds the head to named
    modules unless ``head=False``: its first-order report costs nothing more, a decision's trial does.)"""
    if candidates is None:
        return {"candidates": None, "head": True if head is None else bool(head)}
    names = list(candidates)
    named_head = HEAD in names
    modules = [n for n in names if n != HEAD]
    if named_head and head is False:
        raise ProbeError(f"candidates {names} name {HEAD!r} and head=False leaves it out; give one or the other")
    if not modules and named_head:
        raise ProbeError(f"candidates {names}: {HEAD!r} is the output of the last named module; name at least one "
                         "module")
    if not modules:
        raise ProbeError("candidates is empty")
    return {"candidates": modules, "head": named_head or bool(head)}


def _valid_names(model: nn.Module, modules: dict) -> str:
    """What a misspelt candidate could have been: the recognised blocks, else the top-level submodules."""
    blocks = find_blocks(model)
    if blocks:
        return f"its residual blocks are {blocks}"
    return f"no residual block is recognised; its top-level submodules are {[n for n in modules if n and '.' not in n]}"


def _candidate(model: nn.Module, name: str) -> Candidate:
    return Candidate(name, name, sequence_first=is_sequence_first(model.get_submodule(name)))


def with_head(candidates: list[Candidate], head: bool) -> tuple[Candidate, ...]:
    """``candidates`` plus, if ``head``, the output of the last one (which keeps that block's layout)."""
    if head:
        last = candidates[-1]
        candidates = candidates + [Candidate(HEAD, last.module, "output", last.sequence_first)]
    return tuple(candidates)
