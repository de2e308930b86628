"""The model zoo the examples, studies, benches and tests share: data, models, training, measurement, output.

One package imported from the repository root (``python -m examples.<name>``, ``python -m studies.<name>``,
``python -m bench.<name>``; pytest puts the root on the path), never installed: nothing here is part of the
satcore API.  ``models_torch``/``models_keras`` are the tests' small trained models, ``growth_fakes`` the growth
loop's framework-free fakes, the rest the examples' and studies' data sets, ResNets, decoders and training.
"""
