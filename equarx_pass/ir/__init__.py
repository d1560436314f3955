"""The IR: reading StableHLO (parse), walking it (traverse), building ops (hlo_builder).

The lowest layer of the pass: nothing here knows what a site, a policy or a scheme is.
"""
