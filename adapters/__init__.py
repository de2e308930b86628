"""Framework front-ends: ``satcore.adapters.torch``, ``.tensorflow``, ``.onnx``.

Each is imported on demand so that ``import satcore`` never imports a framework.
"""
