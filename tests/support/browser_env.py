"""Headless Chromium for the browser tests.

``ensure_chromium()`` installs Debian's ``chromium`` and ``chromium-driver`` with apt
once per test session when they are missing (as tests/support/docker_env.py installs Docker)
and returns the paths of the browser and its driver. Failure raises RuntimeError:
browser tests fail loudly, never skip.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess

PACKAGES = ["chromium", "chromium-driver"]
TIMEOUT = float(os.environ.get("FIBERLITE_BROWSER_SETUP_TIMEOUT", "900"))


def _found() -> tuple[str, str] | None:
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@functools.cache
def _install() -> tuple[str, str] | RuntimeError:
    found = _found()
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return RuntimeError("browser tests need chromium and chromium-driver: "
                            "apt-get install -y " + " ".join(PACKAGES))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "install", "-y", *PACKAGES],
                    ["apt-get", "update"], ["apt-get", "install", "-y", *PACKAGES]):
        try:
            subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env,
                           stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return RuntimeError(f"{' '.join(command)} failed: {exc}")
        found = _found()
        if found:
            return found
    return RuntimeError("apt-get could not install " + " ".join(PACKAGES))


def ensure_chromium() -> tuple[str, str]:
    """Paths of ``chromium`` and ``chromedriver``, installed on first use if need be."""
    result = _install()  # once per session: the answer, or why there is none
    if isinstance(result, RuntimeError):
        raise result
    return result


def headless_browser(width: int = 1280, height: int = 1400):
    """A selenium driver of headless Chromium (quit it when done)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    browser, driver = ensure_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)
