"""Real data shipped on the machine: Fashion-MNIST (Debian) or sklearn digits, and English text.

Images: ``/usr/share/datasets/fashion-mnist`` (package ``dataset-fashion-mnist``)
holds the IDX files; without it we fall back to ``sklearn.datasets.load_digits``
(8x8 digits) and say so.  Splits are disjoint: ``train`` (fits the model),
``probe`` (held out from training, drawn from the training file: the
independent probe of Assumption 4) and ``test`` (the official test file).

Text: byte-level tokens (vocabulary 256) of real English prose.  ``quick``
uses the licence texts in ``/usr/share/common-licenses`` (always present);
the full runs use the reStructuredText sources of the Python 3.11 tutorial,
FAQ, how-tos and library reference from the Debian package
``python3.11-doc``, extracted (never installed) to ``~/.cache/satcore-text``.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
LICENSE_DIR = Path("/usr/share/common-licenses")
PYDOC_DIR = Path.home() / ".cache/satcore-text/usr/share/doc/python3.11/html/_sources"
PYDOC_HINT = (
    "apt-get download python3.11-doc && dpkg-deb -x python3.11-doc_*.deb ~/.cache/satcore-text"
)


@dataclass(frozen=True)
class ImageSplits:
    source: str
    train: tuple  # (x float32 (M, 1, H, W), y int64 (M,))
    probe: tuple
    test: tuple
    n_classes: int


def _idx(path: Path) -> np.ndarray:
    """Read a gzipped IDX file (big-endian header: magic, dims)."""
    raw = gzip.open(path, "rb").read()
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _pool2(x: np.ndarray) -> np.ndarray:
    """2x2 average pooling, ``(M, H, W) -> (M, H/2, W/2)``."""
    m, h, w = x.shape
    return x.reshape(m, h // 2, 2, w // 2, 2).mean(axis=(2, 4))


def load_images(n_train: int, n_probe: int, n_test: int, *, seed: int = 0, digits: bool = False) -> ImageSplits:
    """Disjoint train/probe/test subsets, standardised with the train mean and std.

    Fashion-MNIST is 2x2-average-pooled to 14x14; ``digits=True`` takes sklearn's digits even where
    Fashion-MNIST is installed.
    """
    rng = np.random.default_rng(seed)
    if not digits and (FASHION_DIR / "train-images-idx3-ubyte.gz").exists():
        x_all = _idx(FASHION_DIR / "train-images-idx3-ubyte.gz").astype(np.float32) / 255.0
        y_all = _idx(FASHION_DIR / "train-labels-idx1-ubyte.gz").astype(np.int64)
        x_test = _idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0
        y_test = _idx(FASHION_DIR / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
        x_all, x_test = _pool2(x_all), _pool2(x_test)
        source = "Fashion-MNIST (Debian dataset-fashion-mnist), 2x2-average-pooled to 14x14"
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = (digits.images / 16.0).astype(np.float32)
        y = digits.target.astype(np.int64)
        order = rng.permutation(len(y))
        n_hold = min(n_test, len(y) // 4)
        x_test, y_test = x[order[:n_hold]], y[order[:n_hold]]
        x_all, y_all = x[order[n_hold:]], y[order[n_hold:]]
        source = "sklearn load_digits (8x8)"
        if not digits:
            source += " -- FALLBACK: Fashion-MNIST not found in " + str(FASHION_DIR)
            print("NOTE:", source)
    order = rng.permutation(len(y_all))
    n_train = min(n_train, len(order) - n_probe)
    tr, pr = order[:n_train], order[n_train : n_train + n_probe]
    te = rng.permutation(len(y_test))[:n_test]
    mean, std = x_all[tr].mean(), x_all[tr].std()

    def prep(x, y):
        return ((x - mean) / std)[:, None].astype(np.float32), y

    return ImageSplits(source, prep(x_all[tr], y_all[tr]), prep(x_all[pr], y_all[pr]), prep(x_test[te], y_test[te]), 10)


@dataclass(frozen=True)
class TextSplits:
    source: str
    train: np.ndarray  # uint8 byte tokens
    probe: np.ndarray
    test: np.ndarray


def _text_files(quick: bool) -> tuple[list[Path], str]:
    if not quick and PYDOC_DIR.is_dir():
        files = sorted(
            p for sub in ("tutorial", "faq", "howto", "library") for p in (PYDOC_DIR / sub).glob("*.rst.txt")
        )
        if files:
            return files, f"Python 3.11 documentation sources (Debian python3.11-doc), {len(files)} files"
    if not quick:
        print(f"NOTE: {PYDOC_DIR} not found; using /usr/share/common-licenses. To get it: {PYDOC_HINT}")
    files = sorted(p for p in LICENSE_DIR.iterdir() if p.is_file() and not p.is_symlink())
    return files, f"/usr/share/common-licenses ({len(files)} licence texts)"


def load_text(quick: bool, max_bytes: int | None = None) -> TextSplits:
    """Byte tokens of real English text, split 80/10/10 into contiguous train/probe/test parts.

    Files are interleaved in a fixed order and each split takes every tenth
    64 KiB chunk in a fixed pattern, so all three splits see every document kind.
    """
    files, source = _text_files(quick)
    data = np.frombuffer(b"\n".join(p.read_bytes() for p in files), dtype=np.uint8)
    if max_bytes is not None:
        data = data[:max_bytes]
    chunk = 1 << 16 if len(data) > 40 * (1 << 16) else max(1024, len(data) // 40)
    parts = {"train": [], "probe": [], "test": []}
    for i, start in enumerate(range(0, len(data), chunk)):
        key = "probe" if i % 10 == 8 else "test" if i % 10 == 9 else "train"
        parts[key].append(data[start : start + chunk])
    return TextSplits(source + f", {len(data)} bytes", *(np.concatenate(parts[k]) for k in ("train", "probe", "test")))
