"""A pytest started beside the suite, its output in a file (the other Pythons' subsets,
the portable leg, the side leg): :func:`launch` starts one, :class:`SideRun` reads and
ends it."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from paths import ROOT


@dataclass
class SideRun:
    process: subprocess.Popen
    output_path: str
    folder: str

    def output(self) -> str:
        with open(self.output_path, errors="replace") as file:
            return file.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def launch(command: list[str], env: dict[str, str], folder: str, log_name: str) -> SideRun:
    """Start ``command`` in the checkout, its output in ``folder``/``log_name``."""
    output_path = os.path.join(folder, log_name)
    with open(output_path, "w") as output:  # a file, not a pipe: nothing held open here
        process = subprocess.Popen(command, cwd=ROOT, env=env, text=True, stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT)
    return SideRun(process, output_path, folder)
