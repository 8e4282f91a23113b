"""``fiberlite run``'s working directory: the options, and how the master job gets it.

Where the backend's jobs see this machine's files (local processes, a Docker engine of
this machine: a bind mount), the master runs ``python SCRIPT`` as before. Elsewhere (a
Kubernetes cluster, a remote Docker engine) the directory is packed here, checked
against the size limit before any job exists, handed to the backend with the master
job (``JobSpec.tree``), and the master starts with
``python -m fiberlite.runtime.tree.enter``, which checks and enters it; the master's own
jobs then get the same tree from it. ``--no-working-dir``: the script and its code are
in the image, as before.
"""
from __future__ import annotations

import argparse
import os
import sys

from .. import config
from ..backends import Backend, TreeArchive
from ..runtime.tree.pack import pack
from ..units import human_bytes
from .common import CliError

ENTER = ["python", "-m", "fiberlite.runtime.tree.enter"]


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--working-dir", metavar="DIR",
                       help="the directory the run's jobs work in, sent with them where they "
                            "cannot see it (docker with a remote engine, kubernetes); the "
                            "script is in it (default: the current directory; setting "
                            "working_dir)")
    group.add_argument("--no-working-dir", action="store_true",
                       help="send nothing: the script and its code are in the image, and the "
                            "master runs in the image's working directory")


def apply(args: argparse.Namespace) -> None:
    """The options as the ``working_dir`` setting of this command."""
    if args.no_working_dir:
        config.init(working_dir="off")
    elif args.working_dir:
        if not os.path.isdir(args.working_dir):
            raise CliError(f"--working-dir {args.working_dir}: no such directory", 2)
        config.init(working_dir=os.path.abspath(args.working_dir))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def master_command(args: argparse.Namespace, target: Backend, run_id: str
                   ) -> tuple[list[str], TreeArchive | None, dict[str, str]]:
    """The master job's command, the tree it starts in (None: none travels) and the
    working directory setting it inherits."""
    chosen = config.get("working_dir")
    if chosen is False:
        return ["python", args.script, *args.args], None, {"FIBERLITE_WORKING_DIR": "off"}
    root = os.path.abspath(os.path.expanduser(chosen)) if chosen else os.getcwd()
    if target.shares_working_dir():
        env = {"FIBERLITE_WORKING_DIR": root} if chosen else {}
        return ["python", args.script, *args.args], None, env
    if not target.delivers_tree:
        raise CliError(f"the {target.name} backend cannot send the working directory to the "
                       "master job: bake the script into the image and use --no-working-dir")
    script = os.path.abspath(args.script)
    if not _inside(script, root):
        raise CliError(f"{args.script} is not in the working directory {root}, which is what "
                       "travels with the run: run from the script's directory, pass "
                       "--working-dir DIR, or --no-working-dir for a script baked into the image", 2)
    if not os.path.isfile(script):
        raise CliError(f"{args.script}: no such file in the working directory {root}", 2)
    here = os.getcwd()
    cwd = here if _inside(here, root) else root
    tree = pack(root, config.get("working_dir_limit"))
    sys.stderr.write(f"fiberlite: run {run_id}: sending {root} ({tree.files} files, "
                     f"{human_bytes(tree.size)}, {human_bytes(len(tree.data))} packed)\n")
    command = [*ENTER, "--cwd", os.path.relpath(cwd, root), os.path.relpath(script, cwd), *args.args]
    return command, TreeArchive(tree.digest, tree.data), {}
