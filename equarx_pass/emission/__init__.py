"""Emission: the quantized collectives a planned site is replaced with.

Wire formats (formats/), algorithms (algorithms/), the forms they are emitted in
(forms.py, hierarchical.py, quantize_kernel.py), each beside its NumPy model
(quantize.py, rotation.py, scheme.reference, outlier.py).  Emission never sees the
policy: it takes a Scheme and the typed route the planner chose.
"""
