"""insert_block() and the native family.

1. Exactness: a zero-output block of the model's own kind inserted before
   every candidate leaves the outputs bit-identical (float32), for Hugging Face
   GPT-2, GPT-NeoX, Llama, torchvision-style BasicBlock/Bottleneck/pre-activation
   ResNets and nn.TransformerEncoder(norm_first=True), batch-first or not; the
   input model is untouched; config counts and cache indices follow;
   save_pretrained/from_pretrained and generation with a cache reproduce the
   original; the grown model trains (a plain loop; transformers.Trainer).
2. The native growth value == an autograd reference in float64: per-sample
   gradients of the loss w.r.t. the inserted block's zero terminal weights and
   biases (their mean is g), the per-sample Jacobians of the inserted block's
   output w.r.t. the same parameters (G = mean J_i^T J_i), and
   sqrt(g^T G^+ g) by NumPy (Lemma 4), for GPT-2, Llama, a pre-activation
   ResNet and nn.TransformerEncoder.
"""

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from zoo import models_torch as mt
from satcore.adapters.torch import find_blocks, insert_block, probe, sequence_loss
from satcore._shared.errors import InputError, ProbeError

torch.set_num_threads(1)


# -- models not in models_torch: the other ResNet blocks and a pre-norm encoder ------
class Bottleneck(nn.Module):
    """torchvision's Bottleneck (expansion 4), re-written."""

    def __init__(self, in_channels, planes, stride=1):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(in_channels, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != out:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class PreActBlock(nn.Module):
    """Pre-activation BasicBlock (He et al. 2016, identity mappings): ``z + conv2(relu(bn2(conv1(relu(bn1(z))))))``."""

    def __init__(self, channels):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)

    def forward(self, x):
        out = self.conv1(torch.relu(self.bn1(x)))
        return x + self.conv2(torch.relu(self.bn2(out)))


class TinyResNet(nn.Module):
    """stem -> layer1 (width w) -> layer2 (one reshaping block) -> pool -> fc, on 8x8 digits."""

    def __init__(self, kind="bottleneck", width=4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width * (4 if kind == "bottleneck" else 1), 3, 1, 1), nn.ReLU())
        if kind == "bottleneck":
            self.layer1 = nn.Sequential(Bottleneck(4 * width, width), Bottleneck(4 * width, width))
            self.layer2 = nn.Sequential(Bottleneck(4 * width, 2 * width, 2))
            out = 8 * width
        else:
            self.layer1 = nn.Sequential(PreActBlock(width), PreActBlock(width))
            self.layer2 = nn.Sequential()
            out = width
        self.fc = nn.Linear(out, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(x.mean((2, 3)))


class PreNormEncoder(nn.Module):
    """The 8 rows of a digit as tokens -> nn.TransformerEncoder(norm_first=True) -> mean -> classes."""

    def __init__(self, d=16, batch_first=True):
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Linear(8, d)
        layer = nn.TransformerEncoderLayer(d, 2, 2 * d, dropout=0.0, batch_first=batch_first, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(d, 10)

    def forward(self, x):
        tokens = self.embed(x.reshape(x.shape[0], 8, 8))
        if self.batch_first:
            return self.fc(self.encoder(tokens).mean(1))
        return self.fc(self.encoder(tokens.transpose(0, 1)).mean(0))


def seeded(build, seed=0):
    torch.manual_seed(seed)
    return build().eval()


def digits_inputs(n=6, dtype=torch.float32):
    return mt.digits_batches(n, 1, start=0, dtype=dtype)[0]


def text_inputs(batch=3, seq=12):
    return mt.text_batches(seq, batch, 1)[0]


EXACT = {
    "gpt2": (mt.gpt2, text_inputs),
    "gpt_neox": (mt.gpt_neox, text_inputs),
    "llama": (mt.llama, text_inputs),
    "basicblock": (mt.digits_resnet, digits_inputs),
    "bottleneck": (lambda: seeded(lambda: TinyResNet("bottleneck")), digits_inputs),
    "preact": (lambda: seeded(lambda: TinyResNet("preact")), digits_inputs),
    "encoder": (lambda: seeded(PreNormEncoder), digits_inputs),
    "encoder_seq_first": (lambda: seeded(lambda: PreNormEncoder(batch_first=False)), digits_inputs),
}


def logits(model, x):
    with torch.no_grad():
        out = model(x)
    return getattr(out, "logits", out)


@pytest.mark.parametrize("kind", sorted(EXACT))
def test_outputs_bit_identical_before_every_candidate(kind):
    build, inputs = EXACT[kind]
    model = build()
    x, _ = inputs()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    reference = logits(model, x)
    blocks = find_blocks(model)
    for at in blocks + ["head"]:
        grown = insert_block(model, at, seed=3)
        assert len(find_blocks(grown)) == len(blocks) + 1, at
        assert torch.equal(logits(grown, x), reference), at
        new = sum(p.numel() for p in grown.parameters()) - sum(p.numel() for p in model.parameters())
        assert new > 0
    # the input model is untouched
    assert find_blocks(model) == blocks
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("kind", ["gpt2", "gpt_neox", "llama"])
def test_hf_config_and_cache_indices_follow(kind):
    model = EXACT[kind][0]()
    grown = insert_block(model, find_blocks(model)[1], seed=0)
    assert grown.config.num_hidden_layers == 3 and model.config.num_hidden_layers == 2
    stack = grown.get_submodule(find_blocks(grown)[0].rpartition(".")[0])
    for index, block in enumerate(stack):
        indices = {m.layer_idx for m in block.modules() if isinstance(getattr(m, "layer_idx", None), int)}
        assert indices == {index}, (index, indices)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_hf_generation_with_cache_and_round_trip(kind, tmp_path):
    from transformers import AutoModelForCausalLM

    model = EXACT[kind][0]()
    x, _ = text_inputs(batch=2, seq=8)
    grown = insert_block(model, find_blocks(model)[1], seed=5)
    model.config.use_cache = grown.config.use_cache = True
    kw = dict(max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(grown.generate(x, **kw), model.generate(x, **kw))
    grown.save_pretrained(tmp_path)
    # the test models run eager attention; from_pretrained would pick sdpa (equal to ~1e-6, not bitwise)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert reloaded.config.num_hidden_layers == 3
    assert torch.equal(logits(reloaded, x), logits(model, x))
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), grown.state_dict().values()))


def test_seed_draws_the_block_and_restores_the_global_rng():
    model = mt.gpt2()
    state = torch.get_rng_state()
    a, b, c = (insert_block(model, "transformer.h.1", seed=s) for s in (7, 7, 8))
    assert torch.equal(torch.get_rng_state(), state)
    fc = [m.get_submodule("transformer.h.1.mlp.c_fc").weight for m in (a, b, c)]
    assert torch.equal(fc[0], fc[1]) and not torch.equal(fc[0], fc[2])
    new = a.get_submodule("transformer.h.1")
    for path in ("attn.c_proj", "mlp.c_proj"):
        terminal = new.get_submodule(path)
        assert not terminal.weight.any() and not terminal.bias.any()
    # initialised by GPT-2's own _init_weights: c_fc ~ N(0, initializer_range^2), LayerNorm (1, 0)
    assert fc[0].std().item() == pytest.approx(model.config.initializer_range, rel=0.1)
    assert torch.equal(new.ln_1.weight, torch.ones(32)) and not new.ln_1.bias.any()


@pytest.mark.parametrize("seed, says", [
    (-1, "insert_block: seed: -1 is not in the range 0..9223372036854775807"),
    (2**64, "insert_block: seed: 18446744073709551616 is not in the range 0..9223372036854775807"),
    (1.5, "insert_block: seed must be a whole number, got 1.5 (float)"),
    (True, "insert_block: seed must be a whole number, got True (bool)"),
    ("7", "insert_block: seed must be a whole number, got '7' (str)"),
])
def test_a_seed_outside_the_probes_range_is_refused_before_the_copy(seed, says):
    """``insert_block``'s seed is the probe's (``0 .. 2**63 - 1``, a whole number): it accepted -1, 1.5 and True
    (torch seeds them) and failed on 2**64 and '7' with torch's ValueError."""
    with pytest.raises(InputError) as refused:
        insert_block(mt.gpt2(), "transformer.h.1", seed=seed)
    assert str(refused.value) == says


@pytest.mark.parametrize("build,message", [
    (mt.bert, "post-norm"),
    (mt.digits_transformer, "norm_first=False"),
    (lambda: __import__("transformers").GPT2LMHeadModel(mt.gpt2_config(scale_attn_by_inverse_layer_idx=True)),
     "scale_attn_by_inverse_layer_idx"),
])
def test_refusals(build, message):
    """The project's own error (one line on the command line, exit 2), not a bare ValueError."""
    model = build()
    with pytest.raises(ProbeError, match=message):
        insert_block(model, find_blocks(model)[0])
    with pytest.raises(ProbeError, match="unknown candidate"):
        insert_block(mt.gpt2(), "transformer.h.9")


def test_grown_gpt2_trains_with_a_plain_loop():
    grown = insert_block(mt.gpt2(), "transformer.h.1", seed=0).train()
    (x, y), = mt.text_batches(32, 8, 1, path=mt.TRAIN_TEXT, offset=5000)
    optimizer = torch.optim.Adam(grown.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = sequence_loss(grown(x), y).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses
    assert grown.get_submodule("transformer.h.1.mlp.c_proj").weight.abs().max() > 1e-3


def test_grown_gpt2_trains_with_the_hf_trainer(tmp_path):
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    grown = insert_block(mt.gpt2(), "head", seed=0)
    rows = [{"input_ids": ids, "labels": ids} for ids in mt.text_batches(32, 1, 16, path=mt.TRAIN_TEXT)]
    rows = [{k: v[0] for k, v in r.items()} for r in rows]
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=4, max_steps=8, learning_rate=3e-3,
                             report_to=[], use_cpu=True, logging_steps=1, save_strategy="no")
    trainer = Trainer(model=grown, args=args, train_dataset=rows)
    before = grown.get_submodule("transformer.h.2.attn.c_proj").weight.detach().clone()
    history = trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert history.global_step == 8 and losses[-1] < losses[0], losses
    assert not torch.equal(grown.get_submodule("transformer.h.2.attn.c_proj").weight, before)


# -- the native family against autograd ----------------------------------------------
def small_gpt2():
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    # initializer_range 0.2: at 0.02 the MLP's GELU is nearly linear on its tiny inputs, K's smallest kept
    # eigenvalues sit within 30x of the rank cut and the reference's unscaled cut keeps other directions
    return GPT2LMHeadModel(mt.gpt2_config(n_embd=16, initializer_range=0.2)).double().eval()


def small_llama():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(mt.llama_config(hidden_size=16, intermediate_size=32)).double().eval()


# problem -> (model, batches, loss, [(candidate, the new block's name in the grown model, its terminal params)]);
# M*T exceeds the number of features r, so the features are not tangent-complete and the block's draw matters
GPT2_TERMINALS = ("attn.c_proj.weight", "attn.c_proj.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")
NATIVE = {
    "gpt2": (small_gpt2, lambda: mt.text_batches(8, 4, 4, offset=3000), sequence_loss,
             [("transformer.h.1", "transformer.h.1", GPT2_TERMINALS), ("head", "transformer.h.2", GPT2_TERMINALS)]),
    "llama": (small_llama, lambda: mt.text_batches(8, 4, 4, offset=3000), sequence_loss,
              [("model.layers.0", "model.layers.0", ("self_attn.o_proj.weight", "mlp.down_proj.weight"))]),
    "preact": (lambda: seeded(lambda: TinyResNet("preact")).double(),
               lambda: mt.digits_batches(3, 2, start=0, dtype=torch.float64), mt.per_sample_ce,
               [("layer1.1", "layer1.1", ("conv2.weight",))]),
    "encoder": (lambda: seeded(PreNormEncoder).double(),
                lambda: mt.digits_batches(4, 4, start=0, dtype=torch.float64), mt.per_sample_ce,
                [("encoder.layers.1", "encoder.layers.1",
                  ("self_attn.out_proj.weight", "self_attn.out_proj.bias", "linear2.weight", "linear2.bias"))]),
    "encoder_seq_first": (lambda: seeded(lambda: PreNormEncoder(batch_first=False)).double(),
                          lambda: mt.digits_batches(4, 4, start=0, dtype=torch.float64), mt.per_sample_ce,
                          [("head", "encoder.layers.2",
                            ("self_attn.out_proj.weight", "self_attn.out_proj.bias", "linear2.weight",
                             "linear2.bias"))]),
}


def autograd_reference(grown, new_block, params, batches, loss_fn):
    """``(g, G)``: mean per-sample gradient of the loss and mean ``J_i^T J_i`` of the inserted block's output,
    both w.r.t. its zero terminal parameters, by autograd on the grown model."""
    block = grown.get_submodule(new_block)
    theta = [block.get_parameter(p) for p in params]
    outputs = []
    hook = block.register_forward_hook(lambda module, args, out: outputs.append(out))
    grads, jacobians = [], []
    try:
        for x, y in batches:
            outputs.clear()
            losses = loss_fn(grown(x), y)
            h = outputs[0]
            if isinstance(block, nn.TransformerEncoderLayer) and not block.self_attn.batch_first:
                h = h.transpose(0, 1)
            for i in range(losses.shape[0]):
                g_i = torch.autograd.grad(losses[i], theta, retain_graph=True)
                grads.append(torch.cat([t.reshape(-1) for t in g_i]))
                rows = h[i].reshape(-1)
                eye = torch.eye(rows.numel(), dtype=rows.dtype)
                J_i = torch.autograd.grad(rows, theta, grad_outputs=eye, is_grads_batched=True, retain_graph=True)
                jacobians.append(torch.cat([t.reshape(rows.numel(), -1) for t in J_i], 1))
    finally:
        hook.remove()
    g = torch.stack(grads).mean(0).numpy()
    J = torch.stack(jacobians).numpy()
    return g, np.einsum("mkp,mks->ps", J, J) / J.shape[0]


def pinv_quadratic(G, g, rtol=1e-10):
    lam, U = np.linalg.eigh(G)
    keep = lam > rtol * lam.max()
    coords = U[:, keep].T @ g
    return float(np.sqrt(np.sum(coords**2 / lam[keep])))


@pytest.mark.parametrize("problem,case", [(p, i) for p, v in NATIVE.items() for i in range(len(v[3]))])
def test_native_growth_value_equals_autograd_reference(problem, case):
    build, batches_for, loss_fn, cases = NATIVE[problem]
    at, new_block, params = cases[case]
    model, batches, seed = build(), batches_for(), 11
    result = probe(model, batches, loss_fn, family="native", seed=seed)
    value = result.report()[at].growth_value
    grown = insert_block(model, at, seed=seed)
    g, G = autograd_reference(grown, new_block, params, batches, loss_fn)
    reference = pinv_quadratic(G, g)
    assert 1e-6 < value < 0.999 * result.report()[at].ag  # not tangent-complete
    assert value == pytest.approx(reference, rel=1e-10, abs=1e-12)
    # another seed draws another block, whose value differs
    other = probe(model, batches, loss_fn, family="native", seed=seed + 1, candidates=None).report()[at].growth_value
    assert abs(other - value) > 1e-8 * value


def test_gpt2_native_cross_gradient_is_the_terminal_gradient():
    """C's columns are the mean per-sample gradients of attn.c_proj / mlp.c_proj (weights, biases)."""
    build, batches_for, loss_fn, _ = NATIVE["gpt2"]
    model, batches = build(), batches_for()
    C = probe(model, batches, loss_fn, family="native", seed=2).statistics["transformer.h.1"].cross_gradient()
    grown = insert_block(model, "transformer.h.1", seed=2)
    block = grown.get_submodule("transformer.h.1")
    theta = [block.get_parameter(p) for p in GPT2_TERMINALS]
    total = [torch.zeros_like(t) for t in theta]
    M = 0
    for x, y in batches:
        losses = loss_fn(grown(x), y)
        for t, g in zip(total, torch.autograd.grad(losses.sum(), theta)):
            t += g
        M += losses.shape[0]
    d = 16  # Conv1D weights are (in, out): C[:, in] = grad^T
    expected = np.concatenate([total[0].T, total[1][:, None], total[2].T, total[3][:, None]], 1) / M
    assert C.shape == (d, 5 * d + 2)
    np.testing.assert_allclose(C, expected, rtol=1e-10, atol=1e-14)


def test_native_result_copies_and_grow_points_to_insert_block():
    import copy

    from satcore.adapters.torch import grow

    model, batches = small_gpt2(), mt.text_batches(8, 2, 1, offset=3000)
    result = probe(model, batches, sequence_loss, family="native", seed=0)
    features = copy.deepcopy(result.families["transformer.h.0"])  # the last batch's graph is not copied
    assert features.context is None and features.n_features == 5 * 16 + 2
    with pytest.raises(ValueError, match="insert_block"):
        grow(model, result, "transformer.h.0", zero=True)


@pytest.mark.parametrize("zero", ["terminal", "norm"])
def test_resnet_zero_choice_exact_and_train_mode_step(zero):
    """Both choices are exact; with the conv zeroed, train-mode BatchNorm normalises a zero map and the first
    Adam step turns the new block's output from 0 into an O(1) map (the loss jumps), with the gain zeroed
    the block's output stays O(lr) and the loss falls (the numbers in insert_block's docstring).

    Adam's first step moves every parameter by ``lr |g| / (|g| + eps) < lr``, so with the gain zeroed the
    new BatchNorm's ``gamma`` and ``beta`` are below ``lr`` after it and its output ``gamma x_hat + beta``
    (``x_hat`` of unit variance per channel) has an RMS of at most ``sqrt(2) lr``, held to ``2 lr`` (float32
    round-off). With the conv zeroed, the conv's new output (``O(lr)``) is divided by its own batch standard
    deviation: an RMS of ``sqrt(v / (v + eps_bn))``, 0.92 measured, held to above ``100 lr`` (= 0.1): 50x the
    gain-zeroed bound, and 9x below the measured value. How far the loss then jumps depends on the trained
    weights (0.04 -> 0.26 here; 6x to 45x measured on hosts of one kind); that it rises is asserted.
    """
    model = mt.digits_resnet()
    x, y = mt.digits()[0][:64], mt.digits()[1][:64]
    grown = insert_block(model, "layer1.1", seed=0, zero=zero)
    new = grown.layer1[1]
    assert not (new.bn2.weight if zero == "norm" else new.conv2.weight).any()
    assert torch.equal(logits(grown, x), logits(model, x))
    grown.train()
    lr = 1e-3
    optimizer = torch.optim.Adam(grown.parameters(), lr=lr)
    branch = []  # the new block's output before the skip is added (cloned: BasicBlock adds in place)
    handle = new.bn2.register_forward_hook(lambda module, args, out: branch.append(out.detach().clone()))
    losses = []
    try:
        for _ in range(2):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(grown(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    finally:
        handle.remove()
    assert not branch[0].any()  # exact insertion: the first forward's block output is zero
    rms = float(branch[1].pow(2).mean().sqrt())
    if zero == "terminal":
        assert rms > 100 * lr and losses[1] > losses[0], (rms, losses)
    else:
        assert rms <= 2 * lr and losses[1] < losses[0], (rms, losses)
    with pytest.raises(ProbeError, match="zero='norm'"):
        insert_block(mt.gpt2(), "head", zero="norm")


@pytest.mark.parametrize("zero", ["terminal", "norm"])
def test_growth_warns_where_its_zeroed_conv_meets_train_mode_batchnorm(zero):
    """A growth round that inserts a torchvision-style block with its terminal conv zeroed warns as it inserts,
    naming the place and the way out: trained in train mode such a block can raise the loss far (a digits ResNet
    grown so, 20 Adam steps in train mode, went from a held-out loss of 0.79 to 8.86 and was rolled back as
    ``heldout_knee``, a stop that reads as "depth does not help"); with ``zero="norm"`` it is silent."""
    from satcore import GrowthBudget, GrowthCriteria, GrowthOptions
    from satcore.adapters.torch import grow_until_saturated

    model = mt.digits_resnet()
    options = GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1), zero=zero)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = grow_until_saturated(model, lambda m, r: m, mt.digits_batches(16, 16), mt.per_sample_ce,
                                      options=options)
    inserted = result.rounds[0].inserted_at
    assert inserted is not None  # a briefly trained ResNet: improvable, so the round inserts
    messages = [str(w.message) for w in caught if "grow_until_saturated" in str(w.message)]
    if zero == "terminal":
        assert len(messages) == 1 and f"inserted at {inserted} " in messages[0] and "zero='norm'" in messages[0]
    else:
        assert messages == []
