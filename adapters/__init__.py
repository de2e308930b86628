"""Framework front-ends: ``satcore.adapters.torch``, ``.tensorflow``, ``.onnx``.

Each is imported on demand so that ``import satcore`` never imports a framework.  They share one
skeleton (``locate``, ``capture``, ``features``, ``moments``, ``probe``, ``result``, ``grow``;
docs/core.md, Adapters; docs/adapters.md) and four framework-free modules: :mod:`.base` (the
probe protocol, the shared options, split check and provenance), :mod:`.batches` (the batch
convention), :mod:`.options` (per-candidate options, the ``"auto"`` family) and :mod:`.graph`
(the residual-``Add`` search of Keras and ONNX).
"""
