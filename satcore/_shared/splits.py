"""The names that say a probe split is the training set, and the warning reports and probes then give."""

TRAINING_SPLIT_NAMES = ("train", "training", "trainset", "train_set")

TRAINING_SPLIT_WARNING = (
    "the probe split is the training set: the finite-sample test (Prop. 1) assumes an "
    "independent probe (Assumption 4, Remark 5); fixed-sample values remain exact"
)


def is_training_split(split: str | None) -> bool:
    """Whether the probe data's name says it is the training set (reports and probes then warn)."""
    return split is not None and split.lower() in TRAINING_SPLIT_NAMES
