"""Where things are, for tests in any folder of ``tests/``."""
import os

SUPPORT = os.path.dirname(os.path.abspath(__file__))  # this folder: on the jobs' path too
TESTS = os.path.dirname(SUPPORT)
ROOT = os.path.dirname(TESTS)
