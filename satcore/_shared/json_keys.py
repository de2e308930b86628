"""JSON objects whose keys are unique: a document that names a key twice is refused, not read as its last value.

Python's ``json`` module (like most readers) keeps the last of two equal keys without a word; in a file a user
wrote or edited (a dump's meta, a safetensors header, a shard index, a line of token ids) the two values say
different things, and which one was meant cannot be known.  Files that another library reads after satcore
(``config.json`` and the tokenizer's files: transformers and tokenizers keep the last value too) are read as that
library reads them, so that satcore checks what the model will be built from.
"""

from __future__ import annotations

import json

from .display import display_name


class DuplicateKeyError(ValueError):
    """A JSON object names ``key`` twice (``str(error)`` says so, the key escaped, in one line)."""

    def __init__(self, key: str):
        super().__init__(f"key {display_name(repr(key), 120)} appears twice in one object (JSON readers keep the "
                         "last silently; which was meant is ambiguous)")
        self.key = key


def _unique_object(pairs: list) -> dict:
    """``object_pairs_hook``: the object as a dict, or :class:`DuplicateKeyError` for its first repeated key."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return obj


def loads_unique(text: str):
    """``json.loads(text)``, raising :class:`DuplicateKeyError` where an object names a key twice (any depth)."""
    return json.loads(text, object_pairs_hook=_unique_object)
