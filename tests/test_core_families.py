"""The NumPy feature maps every adapter must reproduce, against direct loops."""

import numpy as np
import pytest
from scipy.signal import correlate2d

import satcore
from satcore._formulas.families import gelu, unfold3x3


def test_conv_family_against_direct_convolution():
    rng = np.random.default_rng(0)
    M, C, H, W = 2, 3, 5, 4
    fam = satcore.make_family("conv", C, seed=7, mid_channels=2)
    z = rng.standard_normal((M, C, H, W))
    U = fam.params["conv1"]
    mid = np.zeros((M, 2, H, W))
    for m in range(M):
        for o in range(2):
            mid[m, o] = sum(correlate2d(z[m, c], U[o, c], mode="same") for c in range(C))
    mid = np.maximum(mid / np.sqrt(1 + fam.eps), 0)
    psi = fam.features(z)
    assert psi.shape == (M, H * W, 2 * 9) and fam.n_features == 18
    padded = np.pad(mid, ((0, 0), (0, 0), (1, 1), (1, 1)))
    for m, y, x in [(0, 0, 0), (1, 2, 3), (1, 4, 0)]:
        patch = padded[m, :, y : y + 3, x : x + 3].reshape(-1)  # c*9 + ki*3 + kj
        np.testing.assert_allclose(psi[m, y * W + x], patch, rtol=1e-12, atol=1e-12)


def test_unfold_then_linear_equals_conv():
    """A terminal conv3x3 with weights V acts on unfolded patches as psi @ V.reshape(out, -1).T."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 4, 4))
    V = rng.standard_normal((3, 2, 3, 3))
    direct = np.stack([sum(correlate2d(x[0, c], V[o, c], mode="same") for c in range(2)) for o in range(3)])
    via_unfold = (unfold3x3(x) @ V.reshape(3, -1).T)[0].T.reshape(3, 4, 4)
    np.testing.assert_allclose(via_unfold, direct, rtol=1e-12, atol=1e-12)
    grad = rng.standard_normal((1, 3, 4, 4))
    assert satcore._formulas.families.conv_gradients(grad).shape == (1, 16, 3)


def test_mlp_linear_bias_families():
    rng = np.random.default_rng(2)
    z = rng.standard_normal((3, 4, 6)) * 3 + 1
    fam = satcore.make_family("mlp", 6, seed=5, init_std=0.02)
    ln = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(fam.features(z), gelu(ln @ fam.params["w1"].T), rtol=1e-13)
    assert fam.n_features == 24 and np.std(fam.params["w1"]) == pytest.approx(0.02, rel=0.2)
    # Same seed, same weights: the cross-framework contract.
    np.testing.assert_array_equal(fam.params["w1"], satcore.make_family("mlp", 6, seed=5, init_std=0.02).params["w1"])
    assert not np.array_equal(fam.params["w1"], satcore.make_family("mlp", 6, seed=6, init_std=0.02).params["w1"])
    np.testing.assert_array_equal(satcore.make_family("linear", 6).features(z), z)
    assert satcore.make_family("bias", 6).features(z).shape == (3, 4, 1)
    img = rng.standard_normal((3, 2, 4, 5))
    assert satcore.make_family("bias", 2).features(img).shape == (3, 20, 1)
    np.testing.assert_array_equal(satcore.make_family("linear", 2).features(img)[1, 7], img[1, :, 1, 2])
    assert gelu(np.array([1.0]))[0] == pytest.approx(0.8413447460685429)
    with pytest.raises(ValueError, match="unknown family"):
        satcore.make_family("attention", 4)


def test_families_compare_by_their_weights():
    """``Family == Family`` compares kind, settings and every weight array (the dataclass default
    compared dicts of arrays with ``==`` and raised "truth value of an array is ambiguous")."""
    a, b = satcore.make_family("mlp", 6, seed=0), satcore.make_family("mlp", 6, seed=0)
    assert a == b and not (a != b)
    assert a != satcore.make_family("mlp", 6, seed=1)  # same shapes, other weights
    assert a != satcore.make_family("mlp", 6, seed=0, n_features=12)
    assert a != satcore.make_family("linear", 6) and a != "mlp"
    assert satcore.make_family("conv", 3, seed=2) == satcore.make_family("conv", 3, seed=2)
    with pytest.raises(TypeError):
        hash(a)  # mutable weights


def test_the_registry_defines_the_built_in_kinds():
    from satcore._formulas.families import FAMILIES, family_spec, rebuild_family, registered_families

    assert registered_families()[: len(FAMILIES)] == FAMILIES
    assert family_spec("conv").images_only and family_spec("mlp").takes_init_std
    with pytest.raises(ValueError, match=r"unknown family 'gru'.*'mlp'"):
        satcore.make_family("gru", 4)
    with pytest.raises(ValueError, match=r"^n_features=2 for family 'bias': does not apply \(its number of "
                                         r"features is fixed, 1 "):
        satcore.make_family("bias", 4, n_features=2)
    with pytest.raises(ValueError, match="multiple of 9"):
        satcore.make_family("conv", 4, n_features=10)
    record = {"kind": "mlp", "width": 5, "n_features": 7, "seed": 3, "init_std": 0.1}
    assert rebuild_family(record) == satcore.make_family("mlp", 5, seed=3, n_features=7, init_std=0.1)


def test_a_registry_object_refuses_a_second_entry_under_a_name_unless_told_to_overwrite():
    """A :class:`FamilyRegistry` owns its kinds and builders (the package's is one instance): a name held
    by another entry is refused by name, ``overwrite=True`` replaces it, the same entry again is a no-op;
    a separate registry shares nothing with the package's."""
    from satcore._formulas.families import FAMILY_REGISTRY, FamilyRegistry, FamilySpec, family_spec

    def draw(width, rng, *, seed, **_):
        return satcore.Family("cube", width, width, seed=seed)

    cube, other_cube = FamilySpec("cube", draw, lambda f, z: z**3), FamilySpec("cube", draw, lambda f, z: -(z**3))
    registry = FamilyRegistry([cube])
    assert registry.kinds() == ("cube",) and registry.register(cube) is cube  # the same entry: no-op
    with pytest.raises(satcore.InputError, match="^family 'cube' is registered already; pass overwrite=True"):
        registry.register(other_cube)
    assert registry.spec("cube") is cube
    assert registry.register(other_cube, overwrite=True) is other_cube and registry.spec("cube") is other_cube
    first, second = (lambda family, z: z), (lambda family, z: 2 * z)
    registry.register_builder("jax", "cube", first)
    registry.register_builder("jax", "cube", first)
    with pytest.raises(satcore.InputError, match="^family 'cube' has a jax feature map already"):
        registry.register_builder("jax", "cube", second)
    registry.register_builder("jax", "cube", second, overwrite=True)
    assert registry.builder("jax", "cube") is second
    with pytest.raises(satcore.InputError, match=r"^unknown family 'mlp'; choose one of \('cube',\)"):
        registry.register_builder("jax", "mlp", first)
    with pytest.raises(satcore.InputError, match="^family 'cube' has no torch feature map"):
        registry.builder("torch", "cube")
    registry.unregister("cube")
    assert registry.kinds() == ()
    with pytest.raises(satcore.InputError, match="^unknown family 'cube'"):
        family_spec("cube")  # the package's registry never saw it
    with pytest.raises(satcore.InputError, match="^family 'mlp' is registered already"):
        FAMILY_REGISTRY.register(FamilySpec("mlp", draw, lambda f, z: z))


def test_a_registered_spec_is_a_family_like_the_built_in_ones():
    from satcore._formulas.families import FamilySpec, positions, register_family, registered_families, unregister_family

    def draw(width, rng, *, seed, **_):
        return satcore.Family("square", width, width, {"scale": rng.standard_normal(width)}, seed=seed)

    register_family(FamilySpec("square", draw, lambda f, z: positions(z) ** 2 * f.params["scale"]))
    try:
        assert "square" in registered_families()
        z = np.random.default_rng(0).standard_normal((3, 2, 4))
        family = satcore.make_family("square", 4, seed=5)
        np.testing.assert_array_equal(family.features(z),
                                      z**2 * np.random.default_rng(5).standard_normal(4))
    finally:
        unregister_family("square")
    with pytest.raises(ValueError, match="unknown family 'square'"):
        satcore.make_family("square", 4)


def test_a_builder_registered_again_by_its_module_imported_again_replaces_itself(tmp_path, monkeypatch):
    """An adapter registers its builders when its module is imported; imported again (``sys.modules`` cleared,
    as a missing package's check does, or ``importlib.reload``) it makes new objects of the same top-level
    functions, which replace the held ones without asking. A different function of that module is still refused."""
    import importlib
    import sys

    from satcore._formulas.families import FamilyRegistry, family_spec

    registry = FamilyRegistry([family_spec("mlp")])
    (tmp_path / "jax_features_probe.py").write_text(
        "def mlp_features(family, z):\n    return z\n\ndef other_features(family, z):\n    return -z\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = importlib.import_module("jax_features_probe")
    registry.register_builder("jax", "mlp", first.mlp_features)
    monkeypatch.delitem(sys.modules, "jax_features_probe")
    again = importlib.import_module("jax_features_probe")
    assert again.mlp_features is not first.mlp_features
    registry.register_builder("jax", "mlp", again.mlp_features)
    assert registry.builder("jax", "mlp") is again.mlp_features
    with pytest.raises(satcore.InputError, match="^family 'mlp' has a jax feature map already"):
        registry.register_builder("jax", "mlp", again.other_features)
