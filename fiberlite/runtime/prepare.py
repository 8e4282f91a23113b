"""A job made to look like its parent before it unpickles what the parent sent."""
from __future__ import annotations

import os
import sys
import types


def prepare(prep: dict) -> None:
    """Make this process look like the parent to the code it runs, as the standard
    library's spawn does: sys.path, sys.argv, cwd, settings, the logger, ``__main__``."""
    from .. import config, util
    parent_path = [p for p in prep["sys_path"] if not p or os.path.exists(p)]
    sys.path[:] = parent_path + [p for p in sys.path if p not in parent_path]
    sys.argv[:] = prep["sys_argv"]  # a script may read its arguments at module level
    if os.path.isdir(prep["cwd"]):
        os.chdir(prep["cwd"])
    config.adopt(prep["settings"])
    config.settings()  # resolved now: it sets the logger's level from log_level, then
    util.get_logger().setLevel(prep["log_level"])  # the parent's level wins
    if prep["log_to_stderr"]:
        util.log_to_stderr()
    # functions and classes of the parent's __main__ arrive by value; give them a clean home
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    # ... and globals of theirs that could not be pickled are made by the script, run here
    from ..wire import main_globals
    from . import main_script
    main_globals.set_loader(lambda path: main_script.load(path, prep["main_name"]))
