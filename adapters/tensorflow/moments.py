"""The per-batch sums of :func:`satcore.batch_moments`, on the TF device in float64.

Computed per replica as a :class:`satcore.BatchMoments` of tensors, summed with
``strategy.reduce(SUM)`` field by field, then handed to
:meth:`CandidateStatistics.add_moments`, so a distributed probe equals one
pass over the global batch.
"""

from __future__ import annotations

import tensorflow as tf

from satcore import BatchMoments
from satcore.adapter_api import forms_sample_gradients


def replica_moments(q, psi, *, variance: bool) -> BatchMoments:
    """``n_samples``, ``n_vectors``, ``sum_q_sq``, ``sum_cross``, ``sum_gram``, ``sum_xi_sq`` (, ``sum_xtx``)
    of one replica's share, float64 tensors (the counts too: they are all-reduced with the sums).
    No ``batch_grad_norm``: eq. (2)'s term needs the global batch.

    ``q``: ``(M, T, N)``, ``psi``: ``(M, T, r)``.  ``sum_xi_sq = sum_i ||Q_i^T Psi_i||_F^2``
    uses the ``T x T`` kernels ``<Q_i Q_i^T, Psi_i Psi_i^T>`` unless ``X_i`` is needed anyway.
    """
    q = tf.cast(q, tf.float64)
    psi = tf.cast(psi, tf.float64)
    out = {
        "n_samples": tf.cast(tf.shape(q)[0], tf.float64),
        "n_vectors": tf.cast(tf.shape(q)[0] * tf.shape(q)[1], tf.float64),
        "sum_q_sq": tf.reduce_sum(q * q),
        "sum_cross": tf.einsum("mtn,mtr->nr", q, psi),
        "sum_gram": tf.einsum("mtr,mts->rs", psi, psi),
    }
    T, N, r = q.shape[1], q.shape[2], psi.shape[2]
    if variance or forms_sample_gradients(T, N, r, variance=False):  # TF has no QR-factor route for sum_xtx
        X = tf.einsum("mtn,mtr->mnr", q, psi)
        out["sum_xi_sq"] = tf.reduce_sum(X * X)
        if variance:
            out["sum_xtx"] = tf.einsum("mnr,mns->rs", X, X)
    else:
        kq = tf.einsum("mtn,msn->mts", q, q)
        kp = tf.einsum("mtr,msr->mts", psi, psi)
        out["sum_xi_sq"] = tf.reduce_sum(kq * kp)
    return BatchMoments(**out)
