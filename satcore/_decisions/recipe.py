"""How the user trains an inserted block: the unit in which decisions are made and costed.

A decision ("insert a block at l, it will lower my held-out loss by about x") is only
worth what it predicts under the recipe the user will actually train with: the
optimizer, its learning rate, how many steps, on what batch size, and which
parameters of the new block are trained.  :class:`Recipe` names those choices once;
decisions, trials and the growth loop take it, and report their own cost in the
recipe's unit, *block-steps* (one optimizer step of one inserted block).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .._shared.errors import InputError
from .._shared.numbers import MAX_COUNT, finite_real, whole_number

OPTIMIZERS = ("adam", "adamw", "sgd")
TRAINABLE = ("terminal", "block")


@dataclass(frozen=True)
class Recipe:
    """The training recipe of an inserted block.

    Parameters
    ----------
    optimizer : {"adam", "adamw", "sgd"}
        The optimizer the block is trained with (Adam and AdamW from a zero state).
    lr : float
        Learning rate, finite and > 0 (a NumPy scalar is taken as the number it is).
    steps : int
        Optimizer steps the user trains the block for, ``1 .. 2**53`` (a NumPy integer is taken; a float
        such as ``1e9`` is refused, as is a bool).
    batch_size : int
        Training batch size, ``1 .. 2**53``.
    trainable : {"terminal", "block"}
        ``"terminal"``: only the zero-initialised terminal map ``V`` of the block is
        trained (the paper's setting, Theorem 1); ``"block"``: every parameter of the
        inserted block.
    weight_decay : float
        Decoupled weight decay for AdamW, L2 penalty for Adam and SGD; >= 0.

    Examples
    --------
    >>> from satcore import Recipe
    >>> recipe = Recipe("adam", lr=1e-3, steps=300, batch_size=128)
    >>> recipe.block_steps(candidates=4)   # training one block at each of 4 places
    1200
    >>> Recipe.from_dict(recipe.to_dict()) == recipe
    True
    """

    optimizer: str
    lr: float
    steps: int
    batch_size: int
    trainable: str = "terminal"
    weight_decay: float = 0.0

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise InputError(f"recipe: optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.trainable not in TRAINABLE:
            raise InputError(f"recipe: trainable must be one of {', '.join(TRAINABLE)}, got {self.trainable!r}")
        # NumPy scalars (np.float32(1e-3), np.int64(300)) are taken as the numbers they are, stored as Python's
        object.__setattr__(self, "lr", finite_real(self.lr, "recipe: lr", low=0.0, low_open=True))
        object.__setattr__(self, "weight_decay", finite_real(self.weight_decay, "recipe: weight_decay", low=0.0))
        for name in ("steps", "batch_size"):
            object.__setattr__(self, name, whole_number(getattr(self, name), f"recipe: {name}", 1, MAX_COUNT))

    def block_steps(self, candidates: int = 1) -> int:
        """Cost of training one block at each of ``candidates`` places with this recipe, in block-steps."""
        return self.steps * int(candidates)

    def with_steps(self, steps: int) -> "Recipe":
        """The same recipe run for ``steps`` steps (a short trial of it)."""
        return Recipe(self.optimizer, self.lr, steps, self.batch_size, self.trainable, self.weight_decay)

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Recipe":
        """Inverse of :meth:`to_dict`; unknown keys are refused by name."""
        if not isinstance(data, dict):
            raise InputError(f"recipe: expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise InputError(f"recipe: unknown field {unknown[0]!r}")
        return cls(**data)


__all__ = ["Recipe", "OPTIMIZERS", "TRAINABLE"]
