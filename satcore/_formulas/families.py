"""Candidate residual families with fixed, seeded feature maps (NumPy reference).

A family fixes the feature map ``psi`` of the zero-output block ``h = V psi``.
Its weights are drawn ONCE from ``numpy.random.default_rng(seed)`` and then
held fixed, so the PyTorch, TensorFlow and ONNX adapters, given the same seed,
use the very same ``psi`` and must report the same scores.  The NumPy
``features`` here is the reference the adapters are tested against and the
implementation the ONNX adapter uses.

Layouts: token/vector candidates take ``z`` of shape ``(M, N)`` or
``(M, T, N)`` and return ``(M, T, r)``; the ``conv`` family takes
channels-first ``(M, C, H, W)`` and returns ``(M, H*W, C_mid*9)`` whose
columns are the 3x3 patches a terminal ``conv3x3`` sees (PyTorch ``unfold``
order ``c*9 + ki*3 + kj``, zero padding 1, stride 1), one position per pixel.
Gradients ``Q`` for a conv candidate are laid out ``(M, H*W, C)`` to match.
Formulas: docs/core.md, Feature families.

Every kind is a :class:`FamilySpec` in one registry, a :class:`FamilyRegistry` object
(:data:`FAMILY_REGISTRY`, made with the built-in kinds; :func:`register_family`): how its
weights are drawn, its NumPy features, which streams and sizes it takes.  Each framework
registers its own feature map of a kind (:func:`register_builder`), so a new family is one spec
plus one builder per framework, and no adapter's source changes (docs/adapters.md).  A name
registered twice with different entries is refused unless ``overwrite=True``.
"""

from __future__ import annotations

import dataclasses

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.special import erf

from .._shared.arrays import check_statistics_memory
from .._shared.errors import InputError
from .._shared.option_names import option_given

FAMILIES = ("mlp", "conv", "linear", "bias")  # the built-in kinds; registered_families() adds the others


def gelu(x):
    """Exact (erf) GELU, PyTorch's default ``nn.GELU()``."""
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def relu(x):
    return np.maximum(x, 0.0)


ACTIVATIONS = {"gelu": gelu, "relu": relu}


def layer_norm(z, eps: float = 1e-5):
    """LayerNorm over the last axis with unit gain and zero bias."""
    mean = z.mean(axis=-1, keepdims=True)
    var = z.var(axis=-1, keepdims=True)
    return (z - mean) / np.sqrt(var + eps)


def unfold3x3(x):
    """``(M, C, H, W) -> (M, H*W, C*9)`` zero-padded 3x3 patches, PyTorch ``F.unfold`` order.

    Parameters
    ----------
    x : numpy.ndarray, shape (M, C, H, W)
        Channels-first maps.

    Returns
    -------
    numpy.ndarray, shape (M, H*W, C*9)
        One row per output pixel (row-major), columns ``c*9 + ki*3 + kj``.

    References
    ----------
    docs/core.md, Feature families (the ``conv`` family's columns).

    Examples
    --------
    >>> import numpy as np
    >>> from satcore._formulas.families import unfold3x3
    >>> patches = unfold3x3(np.arange(4.0).reshape(1, 1, 2, 2))
    >>> patches.shape, patches[0, 0]  # the top-left pixel's 3x3 window, padded with zeros
    ((1, 4, 9), array([0., 0., 0., 0., 0., 1., 0., 2., 3.]))
    """
    M, C, H, W = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    patches = np.stack(
        [padded[:, :, i : i + H, j : j + W] for i in range(3) for j in range(3)], axis=2
    )  # (M, C, 9, H, W)
    return patches.reshape(M, C * 9, H * W).transpose(0, 2, 1)


@dataclass(frozen=True, eq=False)
class Family:
    """A fixed feature map.  ``params`` holds its seeded NumPy weights.

    Two families are equal when they are the same map: kind, sizes, settings, seed and every
    weight array element for element (``params`` holds arrays, so the dataclass default, which
    compares them with ``==``, would raise).
    """

    kind: str
    width: int
    n_features: int
    params: dict = field(default_factory=dict)
    activation: str = "gelu"
    eps: float = 1e-5
    seed: int = 0

    def __eq__(self, other) -> bool:
        if not isinstance(other, Family):
            return NotImplemented
        settings = ("kind", "width", "n_features", "activation", "eps", "seed")
        return (all(getattr(self, a) == getattr(other, a) for a in settings)
                and self.params.keys() == other.params.keys()
                and all(np.array_equal(self.params[k], other.params[k]) for k in self.params))

    __hash__ = None  # params are mutable arrays

    def features(self, z) -> np.ndarray:
        """``psi(z)`` as ``(M, T, r)`` float64 (see module docstring for layouts).

        Parameters
        ----------
        z : array_like
            The stream at the candidate: ``(M, N)`` or ``(M, T, N)``, or
            channels-first ``(M, C, H, W)`` for ``conv`` (and ``linear`` or
            ``bias`` at a conv candidate).

        Returns
        -------
        numpy.ndarray, shape (M, T, r)
            The features, ``T = H*W`` for maps.

        References
        ----------
        docs/core.md, Feature families.

        Examples
        --------
        >>> import numpy as np, satcore
        >>> satcore.make_family("mlp", 8, seed=0).features(np.ones((2, 3, 8))).shape
        (2, 3, 32)
        >>> satcore.make_family("conv", 4, seed=1).features(np.zeros((2, 4, 5, 5))).shape
        (2, 25, 36)
        """
        spec = family_spec(self.kind)
        if spec.features is None:
            raise InputError(f"family {self.kind!r} has no NumPy reference (it is built by its framework)")
        return spec.features(self, z)


@dataclass(frozen=True)
class FamilySpec:
    """What defines a family kind, framework-free: the registry entry behind ``make_family``.

    Attributes
    ----------
    name : str
        The kind, as ``family=`` options and dump metadata name it.
    draw : callable or None
        ``draw(width, rng, n_features=, init_std=, **settings) -> Family``: the family's fixed
        weights from ``numpy.random.default_rng(seed)`` (``n_features`` already checked; ``None``:
        the kind's default).  ``None`` for a kind that is not drawn from ``(kind, width, seed)``
        alone (``native``: the tangent space of a model's own block, built by its framework).
    features : callable or None
        ``features(family, z) -> (M, T, r)`` float64, ``z`` as :func:`positions` reads it (a 4-d
        stream channels-first): the NumPy reference every framework's builder must equal
        (``tests/test_conformance.py``), and the ONNX adapter's own map (ONNX Runtime hands
        out NumPy arrays, so it registers no builder).
    images_only : bool
        The kind needs a 4-d image stream (``conv``).
    takes_init_std : bool
        ``init_std`` (the model's weight scale) concerns the draw (``mlp``); adapters record it.
    sized : str
        How ``n_features`` is taken: ``"any"`` (``r >= 1``), ``"nine"`` (a multiple of 9) or
        ``"fixed"`` (no choice: ``fixed_features(width)`` is ``r``).
    fixed_features : callable or None
        ``r`` of a ``"fixed"`` kind for a stream of ``width``.
    positionwise : bool
        Each position's features depend on that position alone (positions may be subsampled first).
    """

    name: str
    draw: Callable | None
    features: Callable | None
    images_only: bool = False
    takes_init_std: bool = False
    sized: str = "any"
    fixed_features: Callable | None = None
    positionwise: bool = True

    def __post_init__(self):
        if self.sized not in ("any", "nine", "fixed"):
            raise InputError(f"sized must be 'any', 'nine' or 'fixed', got {self.sized!r}")
        if (self.sized == "fixed") != (self.fixed_features is not None):
            raise InputError("a 'fixed' kind gives fixed_features(width), and only it")

    @property
    def drawn(self) -> bool:
        """Whether ``make_family(name, width, seed=...)`` rebuilds it (what a dump records suffices)."""
        return self.draw is not None

    def checked_features(self, n_features, width: int):
        """``n_features`` as an int after the kind's rule (``None`` stays ``None``: the default); a refusal names
        the option as the user gave it (:func:`~satcore._shared.option_names.option_given`: ``n_features=``, or
        ``satcore probe``'s ``--n-features``)."""
        if n_features is None:
            return None
        n = int(n_features)
        if self.sized == "fixed":
            if n != self.fixed_features(width):
                raise InputError(f"{option_given('n_features', n)} for family {self.name!r}: does not apply (its "
                                 f"number of features is fixed, {self.fixed_features(width)} for a stream of width "
                                 f"{width})")
        elif n < 1 or (self.sized == "nine" and n % 9):
            raise InputError(f"{option_given('n_features', n)} for family {self.name!r}: "
                             + ("a positive multiple of 9 (9 per middle channel)" if self.sized == "nine"
                                else "must be >= 1"))
        return n


def _defined_as(entry) -> tuple:
    """What an entry is, the same after the module that made it is imported again (``importlib.reload``, or
    ``sys.modules`` cleared, as a missing package's check does): a function or class at a module's top level
    by its module and qualified name (importing again makes new objects of them), a spec field by field,
    other callables by identity, other values by value."""
    if dataclasses.is_dataclass(entry) and not isinstance(entry, type):
        return tuple(_defined_as(getattr(entry, f.name)) for f in dataclasses.fields(entry))
    if callable(entry):
        qualname = getattr(entry, "__qualname__", "<locals>")
        return ("<locals>" in qualname and (id(entry),)) or (entry.__module__, qualname)
    return (entry,)


class FamilyRegistry:
    """The family kinds (:class:`FamilySpec`) and each framework's feature map of them, owned by this object.

    ``registry.register(spec)`` adds a kind; ``registry.register_builder(framework, kind, builder)``
    adds a framework's feature map of a registered kind (what a builder takes is the
    framework's: a torch builder returns an ``nn.Module``, a TensorFlow one a function of
    tensors; the registry only keeps it, so that adding a family touches no adapter's source).

    Failure mode: registering a name (or a framework's builder of a kind) that already holds
    another entry is refused with an :class:`~satcore.InputError` naming it, unless
    ``overwrite=True``, which replaces it; registering the very entry it holds again, or the
    same definitions from the same module (an adapter's module imported again, which makes new
    function, class and spec objects), replaces it without asking.  Looking up a kind that is not registered, or a builder a framework has not
    registered, is refused with an :class:`~satcore.InputError` naming what is known.

    The package holds one instance, :data:`FAMILY_REGISTRY`, made with the built-in kinds
    (:data:`FAMILIES`) and filled with each adapter's builders as the adapter is imported; the
    functions :func:`register_family`, :func:`register_builder`, :func:`family_spec`,
    :func:`family_builder`, :func:`registered_families` and :func:`unregister_family` act on it.
    """

    def __init__(self, specs=()):
        self._specs: dict[str, FamilySpec] = {}
        self._builders: dict[tuple[str, str], Callable] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: FamilySpec, *, overwrite: bool = False) -> FamilySpec:
        """Add the kind ``spec.name`` (see the class docstring for a name already held); returns ``spec``."""
        held = self._specs.get(spec.name)
        if held is not None and _defined_as(held) != _defined_as(spec) and not overwrite:
            raise InputError(f"family {spec.name!r} is registered already; pass overwrite=True to replace it")
        self._specs[spec.name] = spec
        return spec

    def register_builder(self, framework: str, kind: str, builder: Callable, *, overwrite: bool = False) -> None:
        """Add ``builder``, the ``framework``'s feature map of the registered kind ``kind``."""
        self.spec(kind)
        held = self._builders.get((framework, kind))
        if held is not None and _defined_as(held) != _defined_as(builder) and not overwrite:
            raise InputError(f"family {kind!r} has a {framework} feature map already; pass overwrite=True to replace it")
        self._builders[(framework, kind)] = builder

    def unregister(self, name: str) -> None:
        """Remove the kind ``name`` and its frameworks' builders (a test's family, once done)."""
        self._specs.pop(name, None)
        for key in [k for k in self._builders if k[1] == name]:
            del self._builders[key]

    def kinds(self) -> tuple[str, ...]:
        """The registered kinds in registration order (the built-in ones first)."""
        return tuple(self._specs)

    def spec(self, kind: str) -> FamilySpec:
        """The :class:`FamilySpec` of ``kind`` (InputError naming the known kinds when none is registered)."""
        spec = self._specs.get(kind) if isinstance(kind, str) else None
        if spec is None:
            raise InputError(f"unknown family {kind!r}; choose one of {self.kinds()} or pass a feature map")
        return spec

    def builder(self, framework: str, kind: str) -> Callable:
        """The ``framework``'s builder of ``kind`` (InputError when it has none)."""
        self.spec(kind)
        builder = self._builders.get((framework, kind))
        if builder is None:
            raise InputError(f"family {kind!r} has no {framework} feature map")
        return builder


def register_family(spec: FamilySpec, *, overwrite: bool = False) -> FamilySpec:
    """:meth:`FamilyRegistry.register` on the package's :data:`FAMILY_REGISTRY`; returns ``spec``.

    A new family is this spec plus one builder per framework (:func:`register_builder`); the
    adapters and the conformance tests then take it like a built-in one (docs/adapters.md).
    """
    return FAMILY_REGISTRY.register(spec, overwrite=overwrite)


def unregister_family(name: str) -> None:
    """:meth:`FamilyRegistry.unregister` on :data:`FAMILY_REGISTRY`."""
    FAMILY_REGISTRY.unregister(name)


def registered_families() -> tuple[str, ...]:
    """The registered kinds, built-in ones first (:data:`FAMILIES`), in registration order."""
    return FAMILY_REGISTRY.kinds()


def family_spec(kind: str) -> FamilySpec:
    """The :class:`FamilySpec` of ``kind``; an unknown kind is refused (InputError naming the known ones)."""
    return FAMILY_REGISTRY.spec(kind)


def register_builder(framework: str, kind: str, builder: Callable, *, overwrite: bool = False) -> None:
    """:meth:`FamilyRegistry.register_builder` on :data:`FAMILY_REGISTRY`: ``builder`` is the
    ``framework``'s feature map of the registered family ``kind``."""
    FAMILY_REGISTRY.register_builder(framework, kind, builder, overwrite=overwrite)


def family_builder(framework: str, kind: str) -> Callable:
    """The ``framework``'s builder of ``kind`` (InputError when it has none)."""
    return FAMILY_REGISTRY.builder(framework, kind)


@dataclass(frozen=True)
class FamilySettings:
    """The settings of a drawn family besides its kind, width, seed and size (``make_family``'s).

    Attributes
    ----------
    expansion : int
        ``r / width`` of ``mlp``.
    mid_channels : int or None
        Channels of ``conv``'s first convolution (``None``: ``width``).
    activation : {"gelu", "relu"}
        ``mlp``'s activation.
    eps : float
        LayerNorm/BatchNorm epsilon.
    """

    expansion: int = 4
    mid_channels: int | None = None
    activation: str = "gelu"
    eps: float = 1e-5


def make_family(
    kind: str,
    width: int,
    *,
    seed: int = 0,
    n_features: int | None = None,
    init_std: float | None = None,
    settings: FamilySettings | None = None,
    **overrides,
) -> Family:
    """Build a family for a candidate of hidden width ``width`` (channels for ``conv``).

    ``mlp``: ``psi = act(W1 LN(z))`` with ``W1`` (``expansion*width x width``)
    drawn ``N(0, init_std^2)``, ``init_std`` defaulting to ``width^-1/2`` (pass the
    model's own, e.g. GPT-2's 0.02); ``r = expansion * width``.
    ``conv``: ``psi`` = 3x3 patches of ``relu(BN(conv3x3(z)))`` with He-normal
    ``conv3x3`` weights (std ``sqrt(2 / (9 C))``), ``mid_channels`` defaulting to
    ``width``; ``r = 9 * mid_channels``.  ``linear``: ``psi = z``, ``r = width``.
    ``bias``: ``psi = 1``, ``r = 1``.  Other kinds: their :class:`FamilySpec`'s ``draw``.

    Parameters
    ----------
    kind : str
        The family: ``"mlp"``, ``"conv"``, ``"linear"``, ``"bias"`` or a registered kind.
    width : int
        The stream width ``N`` (channels ``C`` for ``conv``).
    seed : int, optional
        Seed of ``numpy.random.default_rng`` for the fixed weights; the same
        seed gives the same weights in every adapter.
    n_features : int, optional
        ``r`` instead of the family's default (the memory of a candidate's sums is
        ``O(N r + r^2)``): for ``mlp`` any ``r >= 1`` (its ``W1`` rows are drawn in
        order, so a smaller ``r`` keeps the first rows of a larger one); for
        ``conv`` a multiple of 9 (``mid_channels = r / 9``).
    init_std : float, optional
        Standard deviation of the weights (defaults above).
    settings : FamilySettings, optional
        ``expansion``, ``mid_channels``, ``activation`` and ``eps`` (defaults:
        :class:`FamilySettings`'s).
    **overrides
        Fields of :class:`FamilySettings` given one by one (``expansion=2``), over
        ``settings``; any other keyword is a TypeError.

    Returns
    -------
    Family
        The frozen feature map, ``n_features = r``.

    References
    ----------
    docs/core.md, Feature families and Conventions (the zero-output block ``h = V psi``).

    Examples
    --------
    >>> import numpy as np, satcore
    >>> fam = satcore.make_family("mlp", 8, seed=0)
    >>> fam.n_features, fam.params["w1"].shape
    (32, (32, 8))
    >>> bool(np.array_equal(fam.params["w1"], satcore.make_family("mlp", 8, seed=0).params["w1"]))
    True
    """
    spec = family_spec(kind)
    if not spec.drawn:
        raise InputError(f"family {kind!r} is not drawn from a seed alone: its framework builds it from the model")
    n_features = spec.checked_features(n_features, width)
    chosen = replace(settings or FamilySettings(), **overrides)
    return spec.draw(width, np.random.default_rng(seed), n_features=n_features, init_std=init_std, seed=seed,
                     expansion=chosen.expansion, mid_channels=chosen.mid_channels, activation=chosen.activation,
                     eps=chosen.eps)


def rebuild_family(record: dict) -> Family:
    """The family a result recorded as ``{kind, width, n_features, seed[, init_std]}``
    (:func:`satcore.adapters.options.family_record`), drawn again with ``make_family``."""
    spec = family_spec(record["kind"])
    return make_family(record["kind"], int(record["width"]), seed=int(record["seed"]),
                       init_std=record.get("init_std") if spec.takes_init_std else None,
                       n_features=record.get("n_features") if spec.sized != "fixed" else None)


# -- the built-in kinds ------------------------------------------------------------------------
def _draw_mlp(width, rng, *, n_features, init_std, expansion, **settings):  # settings: seed, activation, eps, ...
    r = expansion * width if n_features is None else n_features
    check_statistics_memory(width, r)  # the sums the features will feed, refused before any weight is drawn
    std = init_std if init_std is not None else width**-0.5
    w1 = rng.standard_normal((r, width)) * std
    return Family("mlp", width, r, {"w1": w1}, activation=settings["activation"], eps=settings["eps"],
                  seed=settings["seed"])


def _mlp_features(family, z):
    h = layer_norm(positions(z).astype(np.float64), family.eps) @ family.params["w1"].T
    return ACTIVATIONS[family.activation](h)


def _draw_conv(width, rng, *, n_features, init_std, seed, mid_channels, eps, **_):
    mid = n_features // 9 if n_features is not None else mid_channels or width
    check_statistics_memory(width, 9 * mid)
    std = init_std if init_std is not None else np.sqrt(2.0 / (9 * width))
    conv1 = rng.standard_normal((mid, width, 3, 3)) * std
    return Family("conv", width, 9 * mid, {"conv1": conv1}, activation="relu", eps=eps, seed=seed)


def _conv_features(family, z):
    x = np.asarray(z, dtype=np.float64)
    M, C, H, W = x.shape
    u = family.params["conv1"].reshape(family.params["conv1"].shape[0], -1)
    pre = unfold3x3(x) @ u.T  # (M, H*W, C_mid)
    # BatchNorm in identity mode: running mean 0, running var 1, unit affine.
    mid = relu(pre / np.sqrt(1.0 + family.eps))
    return unfold3x3(mid.transpose(0, 2, 1).reshape(M, -1, H, W))


def _draw_linear(width, rng, *, seed, **_):  # for a conv candidate: psi = z per pixel (a 1x1 terminal conv)
    return Family("linear", width, width, seed=seed)


def _draw_bias(width, rng, *, seed, **_):
    return Family("bias", width, 1, seed=seed)


# the package's registry: the built-in kinds; each adapter adds its builders when it is imported
FAMILY_REGISTRY = FamilyRegistry((
    FamilySpec("mlp", _draw_mlp, _mlp_features, takes_init_std=True),
    FamilySpec("conv", _draw_conv, _conv_features, images_only=True, sized="nine", positionwise=False),
    FamilySpec("linear", _draw_linear, lambda family, z: positions(z).astype(np.float64), sized="fixed",
               fixed_features=lambda width: width),
    FamilySpec("bias", _draw_bias, lambda family, z: np.ones(positions(z).shape[:2] + (1,)), sized="fixed",
               fixed_features=lambda width: 1),
))


def positions(stream) -> np.ndarray:
    """A stream (or its gradient) as positions ``(M, T, N)``: the one layout of ``Q`` and ``Psi``.

    ``(M, N)`` is one position, ``(M, 1, N)``; ``(M, T, N)`` (tokens) is unchanged; a
    channels-first map ``(M, C, H, W)`` has one position per pixel, row-major,
    ``(M, H*W, C)`` (:func:`conv_gradients`).  The torch and TensorFlow adapters have
    twins for their tensor types (``satcore.adapters.torch.positions``; TensorFlow's
    channels-last ``(M, H, W, C)`` maps to the same ``(M, H*W, C)``); the ONNX adapter
    uses this one.

    Parameters
    ----------
    stream : array_like, shape (M, N), (M, T, N) or (M, C, H, W)
        Activations or activation gradients at a candidate, sample first.

    Returns
    -------
    numpy.ndarray, shape (M, T, N)
        A view where the layout allows (no copy of a 3-d stream).

    Raises
    ------
    ValueError
        For any other rank.

    References
    ----------
    docs/core.md, Conventions (layout) and Feature families (pixels as positions).

    Examples
    --------
    >>> import numpy as np
    >>> from satcore._formulas.families import positions
    >>> positions(np.zeros((2, 5))).shape, positions(np.zeros((2, 3, 5))).shape
    ((2, 1, 5), (2, 3, 5))
    >>> positions(np.arange(8.0).reshape(1, 2, 2, 2))[0]
    array([[0., 4.],
           [1., 5.],
           [2., 6.],
           [3., 7.]])
    """
    a = np.asarray(stream)
    if a.ndim == 4:
        return conv_gradients(a)
    if a.ndim in (2, 3):
        return a.reshape(a.shape[0], -1, a.shape[-1])
    raise InputError(f"stream of shape {a.shape}: expected (M, N), (M, T, N) or (M, C, H, W)")


def conv_gradients(grad_nchw) -> np.ndarray:
    """Channels-first ``(M, C, H, W)`` as positions ``(M, H*W, C)``: the layout of ``Q`` at a conv candidate.

    Parameters
    ----------
    grad_nchw : array_like, shape (M, C, H, W)
        Gradients (or maps) in channels-first layout.

    Returns
    -------
    numpy.ndarray, shape (M, H*W, C)
        One position per pixel, row-major, matching :func:`unfold3x3`'s rows.

    References
    ----------
    docs/core.md, Feature families.

    Examples
    --------
    >>> import numpy as np
    >>> from satcore._formulas.families import conv_gradients
    >>> conv_gradients(np.zeros((2, 3, 4, 5))).shape
    (2, 20, 3)
    """
    g = np.asarray(grad_nchw)
    return g.reshape(g.shape[0], g.shape[1], -1).transpose(0, 2, 1)
