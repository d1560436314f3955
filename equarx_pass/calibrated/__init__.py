"""The calibrated outlier-feature scheme (--equarx_calibration), in three parts:

calibrate.py     equarx_pass.calibrate: runs the program with every site's per-feature
                 statistics as extra outputs and writes the calibration file
calibration.py   the file: its format, loading it, and whether a site matches its entry
outlier.py       the scheme's NumPy model: static int4 scales, the outlier features in
                 bf16; outlier_emit.py emits it (and the statistics calibrate records)
"""
