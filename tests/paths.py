"""Where things are, for tests in any folder of ``tests/``."""
import os

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
