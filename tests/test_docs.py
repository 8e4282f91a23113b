"""The documentation site builds without a single warning, and its generated parts are current."""
from __future__ import annotations

import importlib.util
import os

import pytest
from interpreters import run_python

pytestmark = pytest.mark.timeout(330)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATOR = os.path.join(ROOT, "docs", "gen_config_reference.py")


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_builds_strict(tmp_path):
    missing = [m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers")
               if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(f"documentation tools not installed ({', '.join(missing)}): pip install -e '.[test]'")
    site = tmp_path / "site"
    proc = run_python("-m", "mkdocs", "build", "--strict",
                      "--config-file", os.path.join(ROOT, "mkdocs.yml"), "--site-dir", site,
                      cwd=ROOT, env={"NO_MKDOCS_2_WARNING": "1", "NO_COLOR": "1"}, timeout=300)
    output = proc.stdout + proc.stderr
    problems = [line for line in output.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert proc.returncode == 0 and not problems, f"mkdocs build --strict failed:\n{output[-6000:]}"
    for page in ("index.html", "configuration/index.html", "cli/index.html",
                 "reference/process/index.html", "security/index.html"):
        assert (site / page).is_file(), f"{page} missing from the built site"
    # the hooks ran: command help is embedded, Sphinx roles are gone from the API pages
    assert "usage: fiberlite run" in (site / "cli" / "index.html").read_text()
    for html in (site / "reference").rglob("*.html"):
        assert ":class:<code>" not in html.read_text(), html
    # generated API pages carry the docstrings
    assert "Create the job that runs" in (site / "reference" / "process" / "index.html").read_text()


def test_configuration_reference_is_current():
    gen = _generator()
    with open(gen.PAGE, encoding="utf-8") as source:
        page = source.read()
    assert gen.render(page) == page, "docs/configuration.md is stale: run python docs/gen_config_reference.py"
    from fiberlite.config import SETTINGS
    for name in SETTINGS:
        assert f"| `{name}` | `FIBERLITE_{name.upper()}` |" in page
