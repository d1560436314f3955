"""Front ends: the ways a program reaches the pass.

`equarx_pass.jit` (jit.py, with the partitioned program in partitioned.py), jax.export
artifacts, StableHLO and XLA HLO files (exported.py, transform.py, the equarx-opt CLI in
cli.py), third-party trainers (launch.py, equarx-run), compile-only TPU (tpu_aot.py)
and the calibration run (calibrate_program.py).
"""
