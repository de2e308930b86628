"""The ``satcore`` command line (``satcore.cli``)."""
