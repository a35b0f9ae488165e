"""Loaded by every Python process of a GPU engine check (engine_child.py puts this folder on PYTHONPATH):
SIGUSR1 prints every thread's stack to stderr, which the check asks for before it kills a stalled run."""
import faulthandler
import signal

faulthandler.register(signal.SIGUSR1, all_threads=True)
