"""Exit codes as text: one form for a Process's repr (the stdlib's), one for messages."""
from __future__ import annotations

import pytest

from fiberlite.runtime.exit_codes import describe_exit, exit_name


@pytest.mark.parametrize("code, name, described", [
    (0, "0", "exit code 0"),
    (3, "3", "exit code 3"),
    (-9, "-SIGKILL", "killed by SIGKILL"),
    (-15, "-SIGTERM", "killed by SIGTERM"),
    (-200, "-200", "killed by signal 200"),  # no such signal
    (None, "None", "ended"),
])
def test_exit_codes_as_text(code, name, described):
    assert (exit_name(code), describe_exit(code)) == (name, described)


def test_the_repr_form_is_the_standard_librarys():
    from multiprocessing.process import _exitcode_to_name  # what its Process repr shows
    for code in (0, 1, -9, -15):
        assert exit_name(code) == str(_exitcode_to_name.get(code, code))
