"""The multi-host tier (test_multihost.py): the launcher over real ssh and Slurm across hosts made
of network namespaces."""
