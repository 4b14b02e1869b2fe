"""Runs a script of worker.kind = "python" as `python3 SCRIPT` would, with the pslab package
(beside this file) importable: the launcher starts every worker and the evaluator of such a run
as `PSLAB_*=... worker.python worker/python/run_script.py worker.script` (pslab.launched())."""
import os
import runpy
import sys

if len(sys.argv) < 2:
    sys.exit("usage: run_script.py SCRIPT [ARGS...] (the launcher runs worker.script so)")
script = sys.argv[1]
if not os.path.isfile(script):
    sys.exit(f"worker.script {script}: no such file on this host")
# As `python3 SCRIPT` has it, then pslab's (before site-packages: another `pslab` there is not this one).
sys.path[0:0] = [os.path.dirname(os.path.abspath(script)), os.path.dirname(os.path.abspath(__file__))]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
