"""Planning: which collectives to rewrite (policy, match, loops) and how (cost, plan).

The planner's output is one typed route per site (plan.py); the driver (rewrite.py)
hands each route to the emitter its pattern names (site_patterns.py).
"""
