"""A real headless browser for the tests: Debian's Chromium, driven directly through its command
line (``--dump-dom``: the DOM the browser built after the page loaded and its scripts, if any,
ran; ``--screenshot``: a PNG of the rendered page). No Python dependency, no driver protocol.

When no ``chromium`` binary is found the tests that need one are skipped locally, but fail under
CI (``CI=true``), where ``.ci/run`` installs it. Each run has a throw-away profile directory, no
network services of the browser's own (updates, sync, QUIC) and a time limit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--disable-extensions", "--hide-scrollbars")


def chromium() -> str:
    """The browser's path; skips the test (fails it under CI) when there is none."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    reason = "no chromium binary (apt-get install chromium; .ci/run installs it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def _run(url: str, *extra: str, timeout: float) -> str:
    with tempfile.TemporaryDirectory(prefix="dpbudget-chromium-") as profile:
        done = subprocess.run([chromium(), *_FLAGS, f"--user-data-dir={profile}", *extra, url],
                              capture_output=True, text=True, timeout=timeout, cwd=profile)
    if done.returncode != 0:
        raise AssertionError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def dump_dom(url: str, *, timeout: float = 120.0) -> str:
    """The serialised DOM of ``url`` once loaded, as the browser built it."""
    return _run(url, "--dump-dom", timeout=timeout)


def screenshot(url: str, path: Path, *, width: int = 1200, height: int = 1600,
               timeout: float = 120.0) -> bytes:
    """A PNG of ``url`` rendered in a ``width`` x ``height`` window, written to ``path`` and
    returned."""
    _run(url, f"--screenshot={path}", f"--window-size={width},{height}", timeout=timeout)
    return path.read_bytes()
