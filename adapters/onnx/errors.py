"""The ONNX adapter's exception for bad models, names and data, and its subclass for a batch the model refuses."""

from satcore import ModelOnDataError, ProbeError


class OnnxProbeError(ProbeError):
    """A model, candidate name, loss or data batch the ONNX probe cannot use.

    Its message is one line naming what is wrong; the CLI prints it and exits 2.
    """


class OnnxBatchError(OnnxProbeError, ModelOnDataError):
    """A batch the ONNX model cannot take: the adapter's error, and the model's on the data (either may be at
    fault), so ``except OnnxProbeError`` and ``except ModelOnDataError`` both catch it."""
