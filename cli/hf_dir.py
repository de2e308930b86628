"""``satcore probe MODEL_DIR``: a dump from a Hugging Face checkpoint directory (the torch adapter).

MODEL_DIR is read as ``satcore expand`` reads it (config, weights, tokenizer;
nothing executed, nothing written), ``--data`` as there too: UTF-8 text
tokenised with the checkpoint's tokenizer, or token ids in ``.npz``
(``input_ids``) / ``.jsonl``, cut into windows of ``min(256, context)`` tokens
(at most 256 windows), ``--batch-size`` windows a batch (by default as for an ONNX model: at most 64, and
16 batches where the windows allow).  The loss is the
model's own next-token cross-entropy per window.
"""

from __future__ import annotations

SEQ_LEN, MAX_WINDOWS = 256, 256


def window_length(config) -> int:
    """Tokens per window unless the user says: ``min(SEQ_LEN, the model's context)``."""
    from satcore.adapters.torch.hf import context_length

    context = context_length(config)
    return SEQ_LEN if context is None else min(SEQ_LEN, context[1])


def probe_checkpoint_dir(model_dir, data_path, probe_config, *, batch_size, out_path):
    """Probe the checkpoint in ``model_dir`` on ``data_path``'s windows with ``probe_config`` (the torch
    adapter's ``ProbeConfig``, built by the command from its options) and write the dump to ``out_path``."""
    from satcore import ProbeError
    from satcore.adapters.torch import probe, sequence_loss
    from satcore.adapters.torch.checkpoint_dir import (load_causal_lm, load_tokenizer, read_token_windows,
                                                       tokenizer_load_note)

    from .common import announced

    from .probe import default_batch_size, named_refusal, say_written

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one report on stdout, no bars on stderr
    model = load_causal_lm(model_dir)
    config = model.config
    windows = read_token_windows(data_path, tokenizer_dir=model_dir, vocab_size=config.vocab_size,
                                 seq_len=window_length(config), max_windows=MAX_WINDOWS,
                                 tokenizer=lambda: announced(tokenizer_load_note(model_dir),  # config.json read once
                                                             lambda: load_tokenizer(model_dir, config)))
    chosen = batch_size is None
    if chosen:
        batch_size = default_batch_size(len(windows))
    batches = [({"input_ids": w}, w) for w in windows.split(batch_size)]
    try:
        result = probe(model, batches, sequence_loss, config=probe_config)
    except ProbeError as exc:
        raise named_refusal(exc, model_dir, data_path) from None
    result.save(out_path, inputs=(data_path,))
    say_written(out_path, f"{len(result.statistics)} candidate(s), {len(windows)} windows", len(batches), batch_size,
                chosen=chosen)
