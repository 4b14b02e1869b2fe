"""The experiment launcher's parts, one module per concern; experiments/launch.py is its command line.

Importing the package imports none of its modules: plot.py imports launcher.metrics and
launcher.summary alone (the standard library's and each other).
"""
