"""Small REAL PyTorch models and data shared by the adapter tests (and by the
TF/ONNX tests, which export the same weights) and the performance benches.

Data (shipped with packages or the OS, no downloads):

* images: ``sklearn.datasets.load_digits()`` (1797 8x8 digits), scaled to
  ``[0, 1]``, as ``(M, 1, 8, 8)`` float32 with integer labels;
* English text: the bytes of ``/usr/share/common-licenses/GPL-3`` (training
  text) and ``/usr/share/common-licenses/Apache-2.0`` (held-out text),
  tokenised as raw bytes (vocabulary 256).

Models (each builder returns a fresh float32 model in ``eval()`` mode, trained
for a few deterministic steps from ``torch.manual_seed(seed)``; the trained
weights are cached per process, so repeated calls are cheap and independent):

* :func:`digits_resnet` -- CIFAR-style stagewise ResNet (torchvision-style
  ``BasicBlock`` written here: ``conv1/bn1/relu(inplace)/conv2/bn2`` plus
  ``downsample``; stages ``layer1`` (8 ch, 8x8) and ``layer2`` (16 ch, stride 2)),
  residual blocks ``layer1.0, layer1.1, layer2.0, layer2.1``;
* :class:`ResidualMLP` -- flattened digits, ``x + W2 relu(W1 x)`` blocks ``blocks.*``
  (untrained; :mod:`zoo.models_keras` ports it to Keras with the same weights);
* :func:`digits_transformer` -- ``nn.TransformerEncoder`` (2 layers, d 32,
  batch_first) over the 8 image rows as tokens, blocks ``encoder.layers.0/1``;
  ``batch_first=False`` gives the same weights in PyTorch's default
  ``(T, B, d)`` layout;
* :func:`gpt2` / :func:`gpt_neox` / :func:`llama` -- Hugging Face
  ``GPT2LMHeadModel`` / ``GPTNeoXForCausalLM`` / ``LlamaForCausalLM`` from tiny
  configs (d 32, 2 layers, eager attention, no cache), trained a few steps on
  the GPL-3 text; blocks ``transformer.h.*`` / ``gpt_neox.layers.*`` /
  ``model.layers.*``;
* :func:`bert` -- Hugging Face ``BertForMaskedLM`` (d 32, 2 layers), seeded and
  untrained, blocks ``bert.encoder.layer.*``; loss :func:`token_loss`.
* the benches' workloads (``bench/_workloads.py``): :func:`gpt2_model` (width 256, 8 blocks) with
  :func:`gpt2_batches` of Apache-2.0 byte windows, and :class:`ResNet8` (:func:`resnet8_model`) with
  :func:`resnet8_batches` of the digits upsampled to 32x32; seeded, untrained.

Batches: :func:`digits_batches` and :func:`text_batches` give lists of
``(inputs, targets)``; losses: ``per_sample_ce`` (classification, ``(B,)``)
and ``satcore.adapters.torch.sequence_loss`` (causal LM).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn

from zoo.training import per_sample_ce  # noqa: F401  (the loss of every classifier here, shared with the studies)

TRAIN_TEXT = "/usr/share/common-licenses/GPL-3"
HELDOUT_TEXT = "/usr/share/common-licenses/Apache-2.0"


# -- data ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """``(X, y)``: ``X`` ``(1797, 1, 8, 8)`` float32 in ``[0, 1]``, ``y`` int64."""
    d = pytest.importorskip("sklearn.datasets").load_digits()
    X = torch.tensor(d.images / 16.0, dtype=torch.float32)[:, None]
    return X, torch.tensor(d.target, dtype=torch.int64)


def digits_batches(batch_size: int, n_batches: int, start: int = 1000, dtype=torch.float32):
    """Consecutive digits batches starting at sample ``start`` (training uses samples < 1000)."""
    X, y = digits()
    out = []
    for b in range(n_batches):
        s = start + b * batch_size
        out.append((X[s : s + batch_size].to(dtype), y[s : s + batch_size]))
    return out


@functools.lru_cache(maxsize=2)
def text_bytes(path: str = TRAIN_TEXT) -> torch.Tensor:
    with open(path, "rb") as f:
        return torch.tensor(np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64))


def text_batches(seq_len: int, batch_size: int, n_batches: int, *, path: str = HELDOUT_TEXT, offset: int = 0):
    """Non-overlapping byte windows ``(input_ids, labels)`` (labels = input_ids; the loss shifts)."""
    data = text_bytes(path)
    out = []
    for b in range(n_batches):
        s = offset + b * batch_size * seq_len
        ids = data[s : s + batch_size * seq_len].view(batch_size, seq_len)
        out.append((ids, ids))
    return out


# -- models -------------------------------------------------------------------------
class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock, re-written (no torchvision import)."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class MLPBlock(nn.Module):
    """``x + W2 relu(W1 x)``."""

    def __init__(self, width):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Residual(nn.Module):
    """``z + f(z)`` with a tanh MLP ``f``: a residual block of no kind the adapters insert natively."""

    def __init__(self, width):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, width))

    def forward(self, z):
        return z + self.f(z)


class ResidualMLP(nn.Module):
    """Flattened digits -> ``embed`` -> ``blocks`` (a stack of :class:`MLPBlock`) -> classes."""

    def __init__(self, width=16, depth=2, classes=10):
        super().__init__()
        self.embed = nn.Linear(64, width)
        self.blocks = nn.ModuleList(MLPBlock(width) for _ in range(depth))
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        h = self.embed(x.flatten(1))
        for block in self.blocks:
            h = block(h)
        return self.fc(h)


class DigitsResNet(nn.Module):
    """Stem conv3x3 -> layer1 (2 blocks, 8 ch) -> layer2 (2 blocks, 16 ch, stride 2) -> pool -> fc."""

    def __init__(self, widths=(8, 16), depth=2, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(*[BasicBlock(widths[0], widths[0]) for _ in range(depth)])
        self.layer2 = nn.Sequential(
            BasicBlock(widths[0], widths[1], 2), *[BasicBlock(widths[1], widths[1]) for _ in range(depth - 1)]
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[1], classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class DigitsTransformer(nn.Module):
    """The 8 rows of a digit as 8 tokens -> ``nn.TransformerEncoder`` -> mean pool -> classes."""

    def __init__(self, d_model=32, nhead=4, layers=2, classes=10, batch_first=True):
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Linear(8, d_model)
        self.position = nn.Parameter(torch.randn(8, d_model) * 0.1)
        layer = nn.TransformerEncoderLayer(d_model, nhead, 2 * d_model, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.fc = nn.Linear(d_model, classes)

    def forward(self, x):
        tokens = self.embed(x.reshape(x.shape[0], 8, 8)) + self.position
        if self.batch_first:
            return self.fc(self.encoder(tokens).mean(1))
        return self.fc(self.encoder(tokens.transpose(0, 1)).mean(0))


def _train_classifier(model, steps, seed, lr=1e-2, batch_size=64):
    X, y = digits()
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, 1000, (batch_size,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
        opt.step()
    return model.eval()


def _train_lm(model, steps, seed, lr=3e-3, batch_size=8, seq_len=32):
    from satcore.adapters.torch import sequence_loss

    data = text_bytes(TRAIN_TEXT)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=g)
        ids = torch.stack([data[s : s + seq_len] for s in starts.tolist()])
        opt.zero_grad()
        sequence_loss(model(ids), ids).mean().backward()
        opt.step()
    return model.eval()


@functools.lru_cache(maxsize=None)
def _trained_state(kind: str, seed: int, steps: int):
    torch.manual_seed(seed)
    model = BUILDERS[kind]()
    train = _train_lm if kind in ("gpt2", "gpt_neox", "llama") else _train_classifier
    with torch.random.fork_rng():
        train(model, steps, seed)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _fresh(kind: str, seed: int, steps: int):
    torch.manual_seed(seed)
    model = BUILDERS[kind]()
    model.load_state_dict(_trained_state(kind, seed, steps))
    return model.eval()


def gpt2_config(**overrides):
    GPT2Config = pytest.importorskip("transformers").GPT2Config

    kw = dict(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
              attn_pdrop=0.0, use_cache=False, attn_implementation="eager", bos_token_id=0, eos_token_id=0)
    kw.update(overrides)
    return GPT2Config(**kw)


def gpt_neox_config(**overrides):
    GPTNeoXConfig = pytest.importorskip("transformers").GPTNeoXConfig

    kw = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0, use_cache=False,
              attn_implementation="eager")
    kw.update(overrides)
    return GPTNeoXConfig(**kw)


def llama_config(**overrides):
    LlamaConfig = pytest.importorskip("transformers").LlamaConfig

    kw = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=2, max_position_embeddings=64, use_cache=False, attn_implementation="eager",
              bos_token_id=0, eos_token_id=0)
    kw.update(overrides)
    return LlamaConfig(**kw)


def _llama():
    LlamaForCausalLM = pytest.importorskip("transformers").LlamaForCausalLM

    return LlamaForCausalLM(llama_config())


def _gpt2():
    GPT2LMHeadModel = pytest.importorskip("transformers").GPT2LMHeadModel

    return GPT2LMHeadModel(gpt2_config())


def _gpt_neox():
    GPTNeoXForCausalLM = pytest.importorskip("transformers").GPTNeoXForCausalLM

    return GPTNeoXForCausalLM(gpt_neox_config())


BUILDERS = {
    "resnet": DigitsResNet,
    "transformer": DigitsTransformer,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "llama": _llama,
}


def digits_resnet(seed: int = 0, steps: int = 150) -> DigitsResNet:
    """The stagewise ResNet trained ``steps`` Adam steps on digits samples 0-999."""
    return _fresh("resnet", seed, steps)


def digits_transformer(seed: int = 0, steps: int = 150, batch_first: bool = True) -> DigitsTransformer:
    """The ``nn.TransformerEncoder`` classifier trained ``steps`` Adam steps on digits samples 0-999
    (the weights do not depend on ``batch_first``, only the stream's layout does)."""
    if batch_first:
        return _fresh("transformer", seed, steps)
    model = DigitsTransformer(batch_first=False)
    model.load_state_dict(_trained_state("transformer", seed, steps))
    return model.eval()


def gpt2(seed: int = 0, steps: int = 40):
    """Tiny Hugging Face GPT-2 trained ``steps`` Adam steps on the GPL-3 text (bytes)."""
    return _fresh("gpt2", seed, steps)


def gpt_neox(seed: int = 0, steps: int = 40):
    """Tiny Hugging Face GPT-NeoX trained ``steps`` Adam steps on the GPL-3 text (bytes)."""
    return _fresh("gpt_neox", seed, steps)


def llama(seed: int = 0, steps: int = 20):
    """Tiny Hugging Face Llama-style decoder trained ``steps`` Adam steps on the GPL-3 text (bytes)."""
    return _fresh("llama", seed, steps)


def bert(seed: int = 0):
    """Tiny Hugging Face ``BertForMaskedLM`` (d 32, 2 layers, eager attention), seeded, untrained.

    Blocks ``bert.encoder.layer.*``; use with :func:`token_loss` on text batches.
    """
    transformers = pytest.importorskip("transformers")
    BertConfig, BertForMaskedLM = transformers.BertConfig, transformers.BertForMaskedLM

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return BertForMaskedLM(config).eval()


def token_loss(outputs, labels):
    """Per-sample mean cross-entropy of predicting each token in place (no shift), ``(B,)``."""
    logits = getattr(outputs, "logits", outputs)
    return nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none").mean(1)


# -- the benches' workloads (bench/_workloads.py) ----------------------------------------
class ResNet8(nn.Module):
    """Stagewise ResNet-8 (paper, Appendix on ResNet experiments): one BasicBlock per stage."""

    def __init__(self, widths=(16, 32, 64), classes=10, in_channels=3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(widths[0], widths[0], 1))
        self.layer2 = nn.Sequential(BasicBlock(widths[0], widths[1], 2))
        self.layer3 = nn.Sequential(BasicBlock(widths[1], widths[2], 2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[2], classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def gpt2_model(n_embd=256, n_layer=8, n_head=8, seq_len=128, seed=0):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    config = gpt2_config(n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_positions=seq_len, attn_implementation="sdpa")
    return GPT2LMHeadModel(config).eval()


def resnet8_model(seed=0):
    torch.manual_seed(seed)
    return ResNet8().eval()


def gpt2_batches(batch_size, n_batches, start=0, seq_len=128):
    """Byte windows of ``seq_len`` from sequence ``start`` on; the text is recycled past its end."""
    data = text_bytes(HELDOUT_TEXT)
    n_windows = len(data) // seq_len
    out = []
    for b in range(n_batches):
        idx = torch.arange(start + b * batch_size, start + (b + 1) * batch_size) % n_windows
        ids = torch.stack([data[i * seq_len : (i + 1) * seq_len] for i in idx.tolist()])
        out.append(({"input_ids": ids}, ids))
    return out


@functools.lru_cache(maxsize=1)
def digits_32x32():
    """``load_digits`` upsampled 8x8 -> 32x32 (nearest), repeated to 3 channels, standardised."""
    X, y = digits()
    X = (X - 0.3) / 0.4
    return X.repeat_interleave(4, 2).repeat_interleave(4, 3).repeat(1, 3, 1, 1), y


def resnet8_batches(batch_size, n_batches, start=0):
    """Batches of :func:`digits_32x32`, recycled past its 1797 samples."""
    X, y = digits_32x32()
    out = []
    for b in range(n_batches):
        idx = torch.arange(start + b * batch_size, start + (b + 1) * batch_size) % X.shape[0]
        out.append((X[idx], y[idx]))
    return out
