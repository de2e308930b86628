"""The names that say a probe split is the training set, the warning reports and probes then give, how a
split the decisions read is named in what a user reads, and how every adapter reads a split's batches."""

import itertools
from collections.abc import Iterable, Iterator

from .display import display_name
from .errors import InputError

# at most this many batches are read from a split: an endless iterator is refused instead of read until memory runs out
MAX_DATA_BATCHES = 2**16

TRAINING_SPLIT_NAMES = ("train", "training", "trainset", "train_set")

TRAINING_SPLIT_WARNING = (
    "the probe split is the training set: the finite-sample test (Prop. 1) assumes an "
    "independent probe (Assumption 4, Remark 5); fixed-sample values remain exact"
)


def is_training_split(split: str | None) -> bool:
    """Whether the probe data's name says it is the training set (reports and probes then warn)."""
    return split is not None and split.lower() in TRAINING_SPLIT_NAMES


# the decisions' split keys as a user reads them (a refusal, a note): the keys stay the code's
SPLIT_WORDS = {"heldout": "held-out", "train": "training", "general": "general"}


def split_words(split: str) -> str:
    """``split`` (a decision's key: ``heldout``, ``train``, ``general``) as a message names it.

    >>> split_words("heldout"), split_words("train"), split_words("general")
    ('held-out', 'training', 'general')
    """
    return SPLIT_WORDS.get(split, split)


def no_batches(data, what: str) -> str:
    """The line refusing ``data`` (``what``, as a message names it) that yielded no batch: an iterator read to its end
    before (a generator passed a second time) reads as empty, so the line asks whether it was."""
    exhausted = (" (an iterator, already read to its end? pass a list of batches, which can be read again)"
                 if isinstance(data, Iterator) else "")
    return f"{what} yielded no batches{exhausted}"


def read_batches(data, what: str) -> list:
    """``list(data)``, at most :data:`MAX_DATA_BATCHES` batches (an endless iterator is refused, naming ``what``;
    ``None`` or another object that is not iterable too, instead of a bare ``TypeError``)."""
    if not isinstance(data, Iterable):
        raise InputError(f"{what}: not an iterable of batches, got {type(data).__name__}")
    if isinstance(data, (str, bytes)):  # a str iterates as characters: 'corpus.txt' was read as 10 batches
        raise InputError(f"{what}: got the {type(data).__name__} {display_name(repr(data), 80)}, not an "
                         "iterable of batches; a file is read by the command line (--data), not here: pass its "
                         "batches")
    batches = list(itertools.islice(data, MAX_DATA_BATCHES + 1))
    if len(batches) > MAX_DATA_BATCHES:
        raise InputError(f"{what}: more than {MAX_DATA_BATCHES:,} batches (an endless iterator?); pass a finite "
                         "list of batches")
    return batches
