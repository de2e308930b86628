"""Recipe: validation names the field; the JSON round trip is exact; block-steps count."""

import math

import pytest

from satcore import InputError, Recipe, SatcoreError


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(optimizer="rmsprop"), "optimizer"),
        (dict(trainable="head"), "trainable"),
        (dict(lr=0.0), "lr"),
        (dict(lr=math.nan), "lr"),
        (dict(lr=True), "lr"),
        (dict(steps=0), "steps"),
        (dict(steps=2.5), "steps"),
        (dict(batch_size=-1), "batch_size"),
        (dict(weight_decay=-1e-4), "weight_decay"),
    ],
)
def test_recipe_refuses_each_field_by_name(kwargs, field):
    base = dict(optimizer="adam", lr=1e-3, steps=300, batch_size=128)
    with pytest.raises(InputError, match=f"recipe: {field}"):
        Recipe(**{**base, **kwargs})


def test_recipe_round_trip_and_cost():
    recipe = Recipe("adamw", lr=3e-4, steps=1000, batch_size=64, trainable="block", weight_decay=0.01)
    assert Recipe.from_dict(recipe.to_dict()) == recipe
    assert recipe.block_steps(8) == 8000
    short = recipe.with_steps(50)
    assert (short.steps, short.optimizer, short.trainable) == (50, "adamw", "block")
    with pytest.raises(SatcoreError, match="unknown field 'momentum'"):
        Recipe.from_dict({**recipe.to_dict(), "momentum": 0.9})
    # A refusal is still a ValueError for callers written against earlier releases.
    with pytest.raises(ValueError):
        Recipe("sgd", lr=-1.0, steps=1, batch_size=1)
