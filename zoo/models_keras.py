"""Keras 3 ports of the small PyTorch models of :mod:`zoo.models_torch`, with the same weights copied in."""

from __future__ import annotations

import keras


def to_numpy(t):
    return t.detach().cpu().numpy()


def copied_dense(x, linear, name: str, weights: list, activation=None):
    """A ``Dense`` port of ``torch.nn.Linear`` ``linear`` applied to ``x``; ``(layer, its torch weights)`` is appended
    to ``weights`` for ``set_weights`` once the model is built."""
    layer = keras.layers.Dense(linear.out_features, activation=activation, name=name)
    weights.append((layer, [to_numpy(linear.weight).T, to_numpy(linear.bias)]))
    return layer(x)


def keras_mlp(torch_model) -> keras.Model:
    """:class:`models_torch.ResidualMLP` in Keras (same weights); its input is the flattened ``(64,)`` digit."""
    weights = []

    def dense(x, lin, name, activation=None):
        return copied_dense(x, lin, name, weights, activation)

    x_in = keras.Input((64,), name="x")
    h = dense(x_in, torch_model.embed, "embed")
    for i, block in enumerate(torch_model.blocks):
        f = dense(dense(h, block.fc1, f"b{i}_fc1", activation="relu"), block.fc2, f"b{i}_fc2")
        h = keras.layers.Add(name=f"b{i}_add")([h, f])
    model = keras.Model(x_in, dense(h, torch_model.fc, "fc"), name="residual_mlp")
    for layer, w in weights:
        layer.set_weights(w)
    return model
