"""The names that say a probe split is the training set, the warning reports and probes then give, and how a
split the decisions read is named in what a user reads."""

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
