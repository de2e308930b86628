"""Native insertion: a new block of the model's OWN kind, with zero output, and its tangent family.

:func:`insert_block` returns a deep copy of the model with a fresh block of
the model's own class inserted into the model's own container before a
candidate (a name :func:`~.locate.find_candidates` gives: a block, or
``"head"`` for the end of the stack).  The fresh block is built as the model
builds its blocks, drawn from ``seed``, and its TERMINAL maps (the last linear
maps of its residual branches) are zeroed, weights and biases, so it adds
exactly ``0`` to the stream: ``z + h(z) = z``.  Zeroing the terminal map,
not an earlier one, keeps the features that feed it nonzero (the paper's
zero-output block ``h(z) = V psi(z)`` with ``V = 0``).

Supported stacks and what is zeroed:

* Hugging Face pre-norm decoders, in their ``nn.ModuleList``:
  GPT-2 (``GPT2Block``: ``attn.c_proj``, ``mlp.c_proj``), GPT-NeoX/Pythia
  (``attention.dense``, ``mlp.dense_4h_to_h``; parallel residual or not),
  Llama-style (``self_attn.o_proj``, ``mlp.down_proj``).  The block is
  ``type(block)(config, layer_idx=k)`` initialised by the model's own
  ``_init_weights`` (what ``post_init`` applies); ``config.num_hidden_layers``
  (GPT-2's ``n_layer``) and ``config.layer_types`` are updated and every later
  block's ``layer_idx`` (the index caches key by) is shifted by one, so
  ``save_pretrained``/``from_pretrained`` and generation with a cache work.
  GPT-2 with ``scale_attn_by_inverse_layer_idx`` is refused: renumbering
  would rescale every later block's attention.
* ``nn.TransformerEncoder`` with ``norm_first=True`` layers: a copy of a
  layer re-initialised by its own ``reset_parameters``; ``self_attn.out_proj``
  and ``linear2`` zeroed; ``num_layers`` updated.
* torchvision-style ResNet stages (``nn.Sequential`` of BasicBlock/Bottleneck,
  recognised by structure): a copy of a block of the stage without
  ``downsample`` and with stride 1, re-initialised as torchvision's ResNet
  does (convolutions Kaiming-normal, ``fan_out``; norms gain 1, bias 0, fresh
  running statistics); the TERMINAL CONVOLUTION (``conv2``, Bottleneck
  ``conv3``) is zeroed, not the last BatchNorm's gain.  Why: with the
  convolution zeroed and the BatchNorm after it fresh (eval mode: the affine
  map ``y / sqrt(1 + eps)`` plus bias ``beta = 0``), the block's first-order
  tangent space is the standard family ``I (x) [s psi, 1]``: any linear map of
  the convolution's input patches ``psi`` (``9 C_mid`` features for a 3x3
  conv) plus a per-channel bias, ``s = 1/sqrt(1 + eps)``.  Zeroing the gain
  ``gamma`` instead (torchvision's ``zero_init_residual``) leaves only
  ``gamma`` and ``beta`` with nonzero derivatives (every other parameter
  reaches the output through ``gamma = 0``): a per-channel affine map of the
  normalised conv output, ``2 C`` directions per block, which is not of the
  form ``I (x) psi`` at all.  The price of the choice: in TRAIN mode the last
  BatchNorm normalises a constant-zero input, whose batch variance is 0, so
  its first update is amplified by ``1/sqrt(eps)`` and renormalised; train
  such a model with the inserted block's BatchNorms in eval mode for the first
  steps, or insert with ``zero="norm"`` (the gain zeroed), or expect a jump.  A torchvision block ends in ``relu(z + h(z))``:
  the insertion is exact because ``z`` is itself a ReLU output (``z >= 0``)
  inside such stacks.  A block whose input changes shape (``downsample``)
  cannot take a block before it in its stage; the new block then goes at the
  END of the previous stage, whose stream it is.

Not supported, with a one-line refusal: post-norm stacks (BERT-style
``BertLayer``, ``nn.TransformerEncoderLayer(norm_first=False)``): their block
output is ``LN(z + h(z))``, which is ``LN(z) != z`` at ``h = 0`` for a trained
model, so no block of their own kind is function-preserving.

The ``native`` family (:func:`native_feature_map`, ``probe(...,
family="native", seed=...)``) is the tangent space of the block
:func:`insert_block` would insert with the same seed: the features are the
INPUTS of its zeroed terminal maps, with a 1 appended for each zeroed bias,
measured by running the fresh block on the candidate's stream ``z`` with the
candidate's other call arguments (masks, rotary embeddings).  For a GPT-2
block, ``psi = [a, 1, m, 1]`` with ``a`` the attention context entering
``attn.c_proj`` (``d``) and ``m = act(c_fc(LN_2(z)))`` entering ``mlp.c_proj``
(``4d``): at the zero point the MLP reads ``z + attn(z) = z`` exactly, and
its derivative through the attention output is ``W_mlp = 0``, so the first
order of the block in its terminal parameters is exactly these inputs;
``r = 5d + 2`` (the two bias columns coincide and add one direction).  The
growth value is then the Lemma 4 value ``g^T G^+ g`` of the inserted block's
zero terminal weights and biases (paper, Theorem 2).  For a torchvision
block the features are ``[s unfold(a), 1]``, the tangent of the residual
branch ``h``; the final ReLU of ``relu(z + h)`` has derivative
``1[z > 0]`` where autograd evaluates it, a per-channel mask that is not of
the form ``I (x) psi``: the native value of a post-activation block is that of
its branch, and equals autograd on the grown model only where ``z > 0``
(pre-activation blocks, ``z + h(z)``, have no such mask).  On the digits
ResNet (float64, 6 samples) the branch value was 0.311 against 0.302 for the
masked autograd value before ``layer1.1`` (35% of the stream's entries are
exactly 0) and 0.162 against 0.135 at ``head`` (44%).  At an exact zero the
block's one-sided first-order change is ``relu(dh)``, a cone, so neither
number is a linear first-order statement there.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from satcore import InputError, ProbeError
from satcore.adapter_api import MAX_SEED, FamilySpec, register_builder, register_family, whole_number

from .capture import with_stream
from .features import FeatureMap
from .locate import HEAD, find_blocks, is_resnet_block

# (attention output, MLP output) of the supported Hugging Face pre-norm blocks
HF_TERMINALS = (
    ("attn.c_proj", "mlp.c_proj"),  # GPT-2
    ("attention.dense", "mlp.dense_4h_to_h"),  # GPT-NeoX / Pythia
    ("self_attn.o_proj", "mlp.down_proj"),  # Llama, Mistral, Qwen2, ...
)
POST_NORM = ("attention.output.LayerNorm",)  # BERT-style BertLayer


@dataclass(frozen=True)
class Site:
    """Where a new block goes: ``container[index]`` (a ``ModuleList``/``Sequential``),
    built like the block named ``reference``; ``kind`` is ``hf``, ``encoder`` or ``resnet``."""

    container: str
    index: int
    reference: str
    kind: str


# what a probe takes instead of ``family="native"`` (grow_until_saturated names its own place for it)
FAMILY_INSTEAD = "family='auto', a kind or an nn.Module"

def _parent(name: str) -> tuple[str, str]:
    parent, _, child = name.rpartition(".")
    return parent, child


def _changes_shape(block: nn.Module) -> bool:
    convs = [getattr(block, c) for c in ("conv1", "conv2", "conv3") if isinstance(getattr(block, c, None), nn.Conv2d)]
    return (getattr(block, "downsample", None) is not None or any(tuple(c.stride) != (1, 1) for c in convs)
            or convs[0].in_channels != convs[-1].out_channels)


def _kind(model: nn.Module, block: nn.Module, name: str) -> str:
    if is_resnet_block(block):
        return "resnet"
    if isinstance(block, nn.TransformerEncoderLayer):
        if not block.norm_first:
            raise ProbeError(f"{name}: nn.TransformerEncoderLayer(norm_first=False) is post-norm, its output "
                             "LN(z + h(z)) is LN(z) != z at h = 0: no layer of its kind inserts exactly")
        return "encoder"
    if any(_has(block, p) for p in POST_NORM):
        raise ProbeError(f"{name}: {type(block).__name__} is post-norm (LayerNorm after the residual sum), its "
                         "output LN(z + h(z)) is LN(z) != z at h = 0: no block of its kind inserts exactly")
    if hasattr(model, "config") and _hf_terminals(block) is not None:
        return "hf"
    raise ProbeError(f"{name}: no native insertion for {type(block).__name__}; supported: GPT-2, GPT-NeoX, "
                     "Llama-style, nn.TransformerEncoderLayer(norm_first=True), torchvision-style ResNet blocks; "
                     f"grow a family's zero-output residual instead: {FAMILY_INSTEAD}")


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
        return True
    except AttributeError:
        return False


def _hf_terminals(block: nn.Module):
    return next((pair for pair in HF_TERMINALS if all(_has(block, p) for p in pair)), None)


def insertion_site(model: nn.Module, at: str) -> Site:
    """The container, index and reference block of a new block before candidate ``at``."""
    blocks = find_blocks(model)
    if not blocks:  # before the name check: no name can be right, the family is what to change
        raise ProbeError(f"no residual blocks recognised in {type(model).__name__}, so no block of its own kind "
                         f"(family='native'); grow a family's zero-output residual instead: {FAMILY_INSTEAD}, with "
                         "candidates=[module names]")
    if at != HEAD and at not in blocks:
        raise ProbeError(f"unknown candidate {at!r}; the blocks of {type(model).__name__} are {blocks} (or {HEAD!r})")
    position = len(blocks) if at == HEAD else blocks.index(at)
    name = blocks[min(position, len(blocks) - 1)]
    block = model.get_submodule(name)
    kind = _kind(model, block, name)
    if at != HEAD and not (kind == "resnet" and _changes_shape(block)):
        container, child = _parent(name)
        return Site(container, int(child), name, kind)
    # the end of a stack (head), or a stage whose first block reshapes: after the previous block
    previous = blocks[position - 1] if at != HEAD else name
    if at != HEAD and position == 0:
        raise ProbeError(f"{at}: its block changes the stream's shape and no block precedes it; no block of the "
                         "model's kind has the width of its input")
    container, child = _parent(previous)
    return Site(container, int(child) + 1, previous, _kind(model, model.get_submodule(previous), previous))


def _terminal_paths(block: nn.Module, kind: str) -> tuple[str, ...]:
    """Dotted paths, inside ``block``, of the maps whose weights and biases are zeroed."""
    if kind == "hf":
        return _hf_terminals(block)
    if kind == "encoder":
        return ("self_attn.out_proj", "linear2")
    return ("conv3",) if isinstance(getattr(block, "conv3", None), nn.Conv2d) else ("conv2",)


def _post_order(module: nn.Module):
    """Children before parents, the order ``PreTrainedModel.initialize_weights`` applies ``_init_weights``."""
    for child in module.children():
        yield from _post_order(child)
    yield module


def _grow_config(config, site: Site, source: int | None = None) -> None:
    """One more layer in a Hugging Face config: ``num_hidden_layers`` and ``layer_types`` (the new
    layer takes the type of block ``source``, default the reference block's)."""
    config.num_hidden_layers = config.num_hidden_layers + 1  # GPT-2's attribute_map makes this n_layer
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        reference = int(_parent(site.reference)[1]) if source is None else source
        config.layer_types = list(layer_types[:site.index]) + [layer_types[reference]] + list(layer_types[site.index:])


def _check_hf(model: nn.Module) -> None:
    if getattr(model.config, "scale_attn_by_inverse_layer_idx", False):
        raise ProbeError("config scale_attn_by_inverse_layer_idx=true (GPT-2): a new block renumbers the layers, "
                         "which would rescale the attention of every block after it; no block inserts exactly")


def _copy_without_hooks(module: nn.Module) -> nn.Module:
    """``deepcopy(module)`` without the hooks registered on it (a probe's taps would fire in the copy)."""
    block = copy.deepcopy(module)
    for m in block.modules():
        for hooks in (m._forward_pre_hooks, m._forward_hooks, m._backward_pre_hooks, m._backward_hooks):
            hooks.clear()
    return block


def _resnet_copy(reference: nn.Module, channels: int) -> nn.Module:
    """A copy of ``reference`` that keeps a ``channels``-channel stream's shape (stride 1, no downsample)."""
    block = _copy_without_hooks(reference)
    block.downsample = None
    if hasattr(block, "stride"):
        block.stride = 1
    for name in ("conv1", "conv2", "conv3"):
        conv = getattr(block, name, None)
        if isinstance(conv, nn.Conv2d):
            conv.stride = (1, 1)
    first = block.conv1
    if first.in_channels != channels:
        block.conv1 = nn.Conv2d(channels, first.out_channels, first.kernel_size, 1, first.padding, first.dilation,
                                first.groups, first.bias is not None, dtype=first.weight.dtype,
                                device=first.weight.device)
    last = block.get_submodule(_terminal_paths(block, "resnet")[0])
    if last.out_channels != channels:
        raise ProbeError(f"a block like {type(reference).__name__} outputs {last.out_channels} channels, "
                         f"the stream has {channels}")
    return block


def _torchvision_init(block: nn.Module) -> None:
    """torchvision ``ResNet.__init__``: Kaiming-normal (fan_out, relu) convolutions, norms (1, 0)."""
    for module in block.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm)):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.reset_running_stats()


def _stream_channels(model: nn.Module, site: Site) -> int:
    reference = model.get_submodule(site.reference)
    return reference.get_submodule(_terminal_paths(reference, "resnet")[0]).out_channels


def fresh_block(model: nn.Module, site: Site, seed: int, config=None, zero: str = "terminal") -> nn.Module:
    """The block :func:`insert_block` inserts at ``site``: built and initialised as the model does,
    drawn from ``torch.manual_seed(seed)`` (the global RNG is restored after), terminal maps
    zeroed, in the dtype and on the device of the reference block, in eval mode.

    ``config``: the Hugging Face config the block is built from, already counting the new layer
    (:func:`_grow_config`).  ``zero="norm"`` (ResNet blocks only) zeroes the gain of the
    BatchNorm after the terminal conv instead of the conv.
    """
    reference = model.get_submodule(site.reference)
    parameter = next(reference.parameters())
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        if site.kind == "hf":
            # built on the CPU in the model's dtype, so a seed draws the same block on every device
            block = type(reference)(config, layer_idx=site.index).to(parameter.dtype)
            for module in _post_order(block):
                model._init_weights(module)
        elif site.kind == "encoder":
            block = _copy_without_hooks(reference).cpu()
            for module in _post_order(block):
                reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
                if reset is not None and module is not block:
                    reset()
        else:
            block = _resnet_copy(reference, _stream_channels(model, site)).cpu()
            _torchvision_init(block)
        paths = _terminal_paths(block, site.kind)
        if zero == "norm":
            paths = ("bn" + paths[0][-1],)  # bn2 after conv2, bn3 after conv3; its bias is 0 already
        for path in paths:
            terminal = block.get_submodule(path)
            terminal.weight.zero_()
            if terminal.bias is not None:
                terminal.bias.zero_()
    return block.to(parameter.device).eval()


def _zeroed_copy(reference: nn.Module, site: Site) -> nn.Module:
    """A copy of the decoder block ``reference`` for position ``site.index``: terminal maps zeroed,
    its layer index (the cache's key) set to the new position."""
    block = _copy_without_hooks(reference)
    with torch.no_grad():
        for path in _terminal_paths(block, "hf"):
            terminal = block.get_submodule(path)
            terminal.weight.zero_()
            if terminal.bias is not None:
                terminal.bias.zero_()
    for module in block.modules():
        if isinstance(getattr(module, "layer_idx", None), int):
            module.layer_idx = site.index
    return block


def insert_block(model: nn.Module, at: str, *, seed: int = 0, zero: str = "terminal",
                 copy_of: str | None = None) -> nn.Module:
    """A deep copy of ``model`` with a zero-output block of its own kind inserted before candidate ``at``.

    ``at`` is a block name of :func:`~.locate.find_blocks` (the new block goes before it) or
    ``"head"`` (after the last block).  ``model`` is not modified.  See the module docstring for
    what is zeroed per family and what is kept consistent.  The copy's outputs equal the
    original's bit for bit: the new block adds an exact ``0.0`` to the stream (its terminal
    maps have zero weights and biases), and every other module computes what it did.

    ``seed`` draws the fresh block's weights; ``probe(..., family="native", seed=seed)``
    measures the tangent space of the same block.  The new block is in the mode ``model`` is in
    (``train()``/``eval()``).

    ``zero``: ``"terminal"`` (the terminal maps, the block the native family describes) or, for
    torchvision-style ResNet blocks only, ``"norm"``: the gain of the BatchNorm after the terminal
    conv is zeroed instead (torchvision's ``zero_init_residual``), whose block trains smoothly
    in train-mode BatchNorm but whose first-order tangent is only the per-channel affine map
    of that BatchNorm (module docstring).  Measured on the digits ResNet (``layer1.1``, one Adam
    step at lr 1e-3 in train mode): the mean loss went 0.014 -> 0.628 with the conv zeroed,
    0.014 -> 0.006 with the gain zeroed.

    ``copy_of``: a block name of a Hugging Face decoder; the new block is then a copy of that
    block with its terminal maps zeroed (LLaMA-Pro's block expansion) instead of a fresh draw, and
    the config's ``layer_types`` gives it that block's type (sliding window or full attention).
    """
    if zero not in ("terminal", "norm"):
        raise InputError(f"zero must be 'terminal' or 'norm', got {zero!r}")
    seed = whole_number(seed, "insert_block: seed", 0, MAX_SEED)  # the range of satcore's seeds (a policy's)
    grown = copy.deepcopy(model)
    site = insertion_site(grown, at)
    config = None
    source = None
    if copy_of is not None:
        if site.kind != "hf" or copy_of not in find_blocks(grown):
            raise ProbeError(f"copy_of={copy_of!r}: a block of a Hugging Face decoder is needed, the blocks of "
                             f"{type(model).__name__} are {find_blocks(grown)}")
        source = int(_parent(copy_of)[1])
    if site.kind == "hf":
        _check_hf(grown)
        config = grown.config
        _grow_config(config, site, source)
    if zero == "norm" and not _norm_after_terminal(grown, site):
        raise ProbeError(f"zero='norm' needs a ResNet block with a BatchNorm after its terminal conv; {at} has none")
    if copy_of is None:
        block = fresh_block(grown, site, seed, config, zero).train(model.training)
    else:
        block = _zeroed_copy(grown.get_submodule(copy_of), site).train(model.training)
    container = grown.get_submodule(site.container)
    container.insert(site.index, block)
    if site.kind == "hf":
        for later in list(container)[site.index + 1:]:
            for module in later.modules():
                if isinstance(getattr(module, "layer_idx", None), int):
                    module.layer_idx += 1
    elif site.kind == "encoder":
        grown.get_submodule(_parent(site.container)[0]).num_layers = len(container)
    return grown


def _norm_after_terminal(model: nn.Module, site: Site) -> bool:
    """Whether the block inserted at ``site`` is a ResNet block with a BatchNorm after its terminal conv."""
    if site.kind != "resnet":
        return False
    block = model.get_submodule(site.reference)
    return isinstance(getattr(block, "bn" + _terminal_paths(block, "resnet")[0][-1], None),
                      nn.modules.batchnorm._BatchNorm)


def zero_map_meets_batchnorm(model: nn.Module, at: str) -> bool:
    """Whether ``insert_block(model, at)`` (``zero="terminal"``) inserts a zeroed conv that a BatchNorm normalises:
    trained in train mode, that BatchNorm's first update is amplified by ``1/sqrt(eps)`` (module docstring)."""
    return _norm_after_terminal(model, insertion_site(model, at))


def _in_features(module: nn.Module) -> int:
    if isinstance(module, nn.Conv2d):
        return module.in_channels * module.kernel_size[0] * module.kernel_size[1]
    return getattr(module, "in_features", None) or module.weight.shape[0]  # HF Conv1D: weight (in, out)


def _without_cache(value):
    """``None`` for a Hugging Face cache object: the fresh block must not write into the model's cache."""
    kind = type(value)
    return None if kind.__module__.startswith("transformers") and "Cache" in kind.__name__ else value


def _norm_follows(block: nn.Module, conv: nn.Module, bn, z: torch.Tensor) -> bool:
    """Whether ``bn`` normalises ``conv``'s output when ``block`` runs on ``z`` (post-activation order)."""
    if not isinstance(bn, nn.modules.batchnorm._BatchNorm):
        return False
    seen = {}
    hooks = [conv.register_forward_hook(lambda module, a, out: seen.__setitem__("conv", out)),
             bn.register_forward_pre_hook(lambda module, a: seen.__setitem__("norm", a[0]))]
    try:
        with torch.no_grad():
            block(z)
    finally:
        for hook in hooks:
            hook.remove()
    return seen.get("norm") is seen.get("conv")


class NativeFeatures(FeatureMap):
    """Inputs of the zeroed terminal maps of a fresh block, ``(M, T, r)``, with a 1 per zeroed bias.

    ``context`` holds the other arguments of the candidate block's call in the current batch
    (``(args, kwargs)``, set by the probe): the fresh block runs on ``z`` with them, caches
    removed.  ``sequence_first`` blocks read ``z`` as ``(T, B, d)``.
    """

    kind, reads_context = "native", True

    def __getstate__(self):
        # the last batch's call arguments are tensors of its graph: neither copied nor pickled
        return {**super().__getstate__(), "context": None}

    def __init__(self, block: nn.Module, site: Site, sequence_first: bool, z: torch.Tensor, spec: dict):
        paths = _terminal_paths(block, site.kind)
        terminals = [block.get_submodule(p) for p in paths]
        norm = None
        if site.kind == "resnet":
            bn = "bn" + paths[0][-1]  # bn2 with conv2, bn3 with conv3
            if _norm_follows(block, terminals[0], getattr(block, bn, None), z[:1]):
                norm = bn  # post-activation (torchvision): the BatchNorm's bias is the terminal map's bias
            biases = [norm is not None or terminals[0].bias is not None]
        else:
            biases = [t.bias is not None for t in terminals]
        n_features = sum(_in_features(t) + b for t, b in zip(terminals, biases))
        width = z.shape[1] if z.dim() == 4 else z.shape[-1]
        super().__init__(width, n_features, {**spec, "width": width, "n_features": n_features})
        self.block, self.site, self.sequence_first = block, site, sequence_first
        self.paths, self.biases, self.norm_path = paths, biases, norm
        self.context = None
        if site.kind == "encoder":
            # the attention context: the layer's attention with an identity output projection
            self.attention = copy.deepcopy(block.self_attn)
            with torch.no_grad():
                self.attention.out_proj.weight.copy_(torch.eye(width))
                if self.attention.out_proj.bias is not None:
                    self.attention.out_proj.bias.zero_()

    def _call(self, stream):
        args, kwargs = self.context if self.context is not None else ((stream,), {})
        args, kwargs = with_stream(args, kwargs, stream)
        args = tuple(_without_cache(a) for a in args)
        kwargs = {k: _without_cache(v) for k, v in kwargs.items()}
        if "use_cache" in kwargs:
            kwargs["use_cache"] = False
        return args, kwargs

    def _terminal_inputs(self, stream):
        """What enters each terminal map when the fresh block runs on ``stream`` (layer layout)."""
        args, kwargs = self._call(stream)
        if self.site.kind == "encoder":
            call = inspect.signature(type(self.block).forward).bind(self.block, *args, **kwargs).arguments
            x = self.block.norm1(stream)
            context = self.attention(x, x, x, attn_mask=call.get("src_mask"), need_weights=False,
                                     key_padding_mask=call.get("src_key_padding_mask"),
                                     is_causal=call.get("is_causal", False))[0]
            return [context, self.block.activation(self.block.linear1(self.block.norm2(stream)))]
        inputs = {}
        hooks = [self.block.get_submodule(p).register_forward_pre_hook(
            lambda module, a, p=p: inputs.__setitem__(p, a[0])) for p in self.paths]
        try:
            self.block(*args, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
        return [inputs[p] for p in self.paths]

    def forward(self, z):
        stream = z.transpose(0, 1) if self.sequence_first else z
        values = self._terminal_inputs(stream)
        parts = []
        for value, bias in zip(values, self.biases):
            if self.site.kind == "resnet":
                conv = self.block.get_submodule(self.paths[0])
                value = F.unfold(value, conv.kernel_size, conv.dilation, conv.padding, conv.stride).transpose(1, 2)
                if self.norm_path is not None:
                    # eval-mode BN after the conv: y -> gamma (y - mean) / sqrt(var + eps) + beta; fresh, that is
                    # the same scale s = 1/sqrt(1 + eps) on every channel, so the tangent is [s psi, 1]
                    norm = self.block.get_submodule(self.norm_path)
                    value = value * (norm.weight / torch.sqrt(norm.running_var + norm.eps))[0]
            elif self.sequence_first:
                value = value.transpose(0, 1)
            parts.append(value)
            if bias:
                parts.append(value.new_ones(value.shape[:2] + (1,)))
        features = torch.cat(parts, -1)
        if features.shape[2] != self.n_features:
            raise ValueError(f"native features of {type(self.block).__name__}: {features.shape[2]} columns, "
                             f"expected {self.n_features}")
        return features


def native_feature_map(model: nn.Module, candidate, z: torch.Tensor, *, seed: int = 0) -> NativeFeatures:
    """The ``native`` family at ``candidate`` (a :class:`~.locate.Candidate`) of ``model``: the tangent
    space of the block ``insert_block(model, candidate.name, seed=seed)`` inserts, for a stream
    shaped like ``z`` (batch-first)."""
    site = insertion_site(model, candidate.name)
    config = None
    if site.kind == "hf":
        _check_hf(model)
        config = copy.deepcopy(model.config)
        _grow_config(config, site)
    block = fresh_block(model, site, seed, config)
    spec = {"kind": "native", "block": type(block).__name__, "seed": seed, "container": site.container,
            "index": site.index}
    return NativeFeatures(block, site, candidate.sequence_first, z, spec)


def _native_builder(z: torch.Tensor, *, seed: int, model, candidate) -> NativeFeatures:
    """The torch builder of the ``native`` kind (built from the model, not drawn from a seed alone)."""
    if model is None or candidate is None:
        raise InputError("family 'native' needs the model and the candidate")
    return native_feature_map(model, candidate, z, seed=seed)


# the tangent space of the model's own block: no NumPy reference, a feature map of every position at once
register_family(FamilySpec("native", draw=None, features=None, positionwise=False))
register_builder("torch", "native", _native_builder)
