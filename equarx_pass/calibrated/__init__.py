"""The calibrated outlier-feature scheme (--equarx_calibration), what the plan and the
emitters use of it:

calibration.py   the file: its format, loading it, and whether a site matches its entry
outlier.py       the scheme's NumPy model: static int4 scales, the outlier features in
                 bf16; outlier_emit.py emits it (and the statistics calibrate records)

The entry point that writes the file, equarx_pass.calibrate, runs programs: it is a
front end, calibrate_program.py, beside jit.py.
"""
