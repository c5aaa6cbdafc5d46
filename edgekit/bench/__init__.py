"""The bench library behind ``edgekit bench``: the run loop, accuracy mode, the report, its caveats, plots and
the machine context.
"""
