"""The paper's models, small enough for a CPU.

``StagewiseResNet``: the stagewise ResNet-8 backbone of Appendix B.1-B.2 (a
3x3 stem, three stages of one BasicBlock each, stride-2 transitions, global
average pooling, a linear classifier) plus ``n_added`` BasicBlocks assigned
cyclically to layer1, layer2, layer3.  Blocks are torchvision-shaped
(``conv1/bn1/conv2/bn2``, optional ``downsample``) so satcore finds them.

``gpt2_decoder``: a Hugging Face GPT-2 built from a small ``GPT2Config``
(byte vocabulary), ``L`` decoder blocks.
"""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """``relu(x + bn2(conv2(relu(bn1(conv1(x))))))`` with a 1x1 projection shortcut when the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        skip = x if self.downsample is None else self.downsample(x)
        return torch.relu(out + skip)


def stage_blocks(n_added: int) -> list[int]:
    """Blocks per stage: one each, plus added block ``k`` going to stage ``k mod 3`` (App. B.1)."""
    counts = [1, 1, 1]
    for k in range(n_added):
        counts[k % 3] += 1
    return counts


class StagewiseResNet(nn.Module):
    def __init__(self, n_added: int, widths=(16, 32, 64), in_channels: int = 1, n_classes: int = 10):
        super().__init__()
        self.n_added, self.widths = n_added, tuple(widths)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        c_in = widths[0]
        for s, (width, count) in enumerate(zip(widths, stage_blocks(n_added))):
            blocks = [BasicBlock(c_in, width, 1 if s == 0 else 2)] + [BasicBlock(width, width) for _ in range(count - 1)]
            setattr(self, f"layer{s + 1}", nn.Sequential(*blocks))
            c_in = width
        self.fc = nn.Linear(widths[-1], n_classes)

    def forward(self, x):
        h = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(h.mean(dim=(2, 3)))

    @property
    def n_blocks(self) -> int:
        return 3 + self.n_added


def grow_zero_block(model: StagewiseResNet) -> StagewiseResNet:
    """Function-preserving growth to ``n_added + 1``: append a BasicBlock whose ``bn2`` gain is zero.

    The new block sits where the cyclic rule puts block ``n_added`` (the end
    of stage ``n_added mod 3``), so the grown network has exactly the
    architecture of ``StagewiseResNet(n_added + 1)``.  With ``bn2.weight = 0``
    and ``bn2.bias = 0`` its residual branch outputs zero (the paper's
    zero-output block, Problem Setup) while every parameter still receives
    gradient once training resumes.
    """
    grown = StagewiseResNet(model.n_added + 1, model.widths, model.stem[0].in_channels, model.fc.out_features)
    grown.load_state_dict(model.state_dict(), strict=False)
    stage = getattr(grown, f"layer{model.n_added % 3 + 1}")
    with torch.no_grad():
        stage[-1].bn2.weight.zero_()
        stage[-1].bn2.bias.zero_()
    return grown


def gpt2_decoder(n_layer: int, *, d_model: int = 64, n_head: int = 4, n_positions: int = 128, seed: int = 0):
    """A byte-level GPT-2 (vocab 256) with ``n_layer`` blocks; dropout off so probes are deterministic."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=256, n_positions=n_positions, n_embd=d_model, n_layer=n_layer, n_head=n_head,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    return GPT2LMHeadModel(config)
