"""Pseudo-inverse and rank of a symmetric positive semi-definite Gram matrix.

Every growth value is ``g^T G^+ g`` for some Gram matrix ``G`` (paper Lemma 4),
so the one tolerance that decides which directions of ``G`` count lives here.

Tolerance.  An eigenvalue ``lam`` of ``G`` is treated as zero when
``lam <= rtol * lam_max`` with ``DEFAULT_RTOL = 1e-10``.  Eigenvalues of a Gram
matrix are squared singular values of the feature matrix, so this drops
feature directions whose singular value is below ``1e-5`` of the largest.  The
choice sits between two error sources: float32 features carry relative noise
near ``1e-7`` (eigenvalues near ``1e-14``, dropped), and float64 accumulation
of ``10^8`` rows leaves eigenvalue errors far below ``1e-10``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_RTOL = 1e-10


@dataclass(frozen=True)
class PsdSpectrum:
    """Eigen-decomposition of a PSD matrix restricted to its numerical range."""

    eigenvalues: np.ndarray  # kept eigenvalues, > tolerance
    eigenvectors: np.ndarray  # (dim, rank) orthonormal columns
    tolerance: float

    @property
    def rank(self) -> int:
        return int(self.eigenvalues.size)

    def whiten(self, C: np.ndarray) -> np.ndarray:
        """``C U diag(lam^-1/2)``: its squared Frobenius norm is ``tr(C G^+ C^T)``."""
        return (C @ self.eigenvectors) / np.sqrt(self.eigenvalues)

    def quadratic_form(self, A: np.ndarray, B: np.ndarray | None = None) -> float:
        """``tr(A G^+ B^T)`` (``B = A`` when omitted) through the whitened factors.

        Going through ``A U lam^-1/2`` rather than an explicit ``G^+`` keeps
        full precision when eigenvalues sit just above the cut.
        """
        wa = self.whiten(np.asarray(A, dtype=np.float64))
        wb = wa if B is None else self.whiten(np.asarray(B, dtype=np.float64))
        return float(np.sum(wa * wb))

    def pinv(self) -> np.ndarray:
        """The Moore-Penrose pseudo-inverse ``G^+`` at this tolerance."""
        U = self.eigenvectors
        return (U / self.eigenvalues) @ U.T


def psd_spectrum(G: np.ndarray, rtol: float = DEFAULT_RTOL) -> PsdSpectrum:
    G = np.asarray(G, dtype=np.float64)
    # Symmetrise: accumulated sums are symmetric only up to round-off.
    lam, U = np.linalg.eigh(0.5 * (G + G.T))
    top = float(lam[-1]) if lam.size else 0.0
    tol = rtol * top if top > 0 else 0.0
    keep = lam > tol if top > 0 else np.zeros(lam.shape, dtype=bool)
    return PsdSpectrum(eigenvalues=lam[keep], eigenvectors=U[:, keep], tolerance=tol)
