"""The one exception the ONNX adapter raises for bad models, names and data."""

from satcore import ProbeError


class OnnxProbeError(ProbeError):
    """A model, candidate name, loss or data batch the ONNX probe cannot use.

    Its message is one line naming what is wrong; the CLI prints it and exits 2.
    """
