"""The report page in a real browser: Debian's headless Chromium driven through chromedriver.

WebDriver is plain HTTP with JSON on localhost, so the standard library is the whole client. The
test loads a report from disk (file://, offline), checks the browser logged no error (a CSP
violation, which any fetch would be, is logged as one), sorts the layer table by a click on a
header and reads the rows back, filters it by typing, and saves a screenshot of the top of the page
under benchmarks/results/.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,1000"]


def browser_missing() -> Optional[str]:
    """Why the browser test cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (path.exists() and os.access(path, os.X_OK)):
            return f"{path} not found (Debian package {package}): the browser test needs headless Chromium"
    return None


class Browser:
    """A headless Chromium session over WebDriver (chromedriver on a free 127.0.0.1 port)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.profile = tempfile.mkdtemp(prefix="wbfe-chromium-")
        self.driver = subprocess.Popen([str(CHROMEDRIVER), f"--port={port}", "--allowed-ips=127.0.0.1"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if self._call("GET", "/status")["ready"]:
                        break
                except (urllib.error.URLError, ConnectionError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("chromedriver did not start within 30 s")
                time.sleep(0.1)
            caps = {"browserName": "chrome", "goog:loggingPrefs": {"browser": "ALL"},
                    "goog:chromeOptions": {"binary": str(CHROMIUM),
                                           "args": FLAGS + [f"--user-data-dir={self.profile}"]}}
            self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]
        except BaseException:
            self.close()
            raise

    def _call(self, method: str, path: str, body: Optional[dict[str, Any]] = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"WebDriver {method} {path}: {exc.read()[:500]!r}") from None

    def call(self, method: str, path: str, body: Optional[dict[str, Any]] = None) -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)

    def open(self, path: Path) -> None:
        self.call("POST", "/url", {"url": path.resolve().as_uri()})

    def js(self, script: str, *args: Any) -> Any:
        return self.call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def element(self, css: str) -> dict[str, str]:
        return self.call("POST", "/element", {"using": "css selector", "value": css})

    def click(self, css: str) -> None:
        element = self.element(css)
        self.call("POST", f"/element/{next(iter(element.values()))}/click", {})

    def type(self, css: str, text: str) -> None:
        element = self.element(css)
        self.call("POST", f"/element/{next(iter(element.values()))}/value", {"text": text})

    def logs(self) -> list[dict[str, Any]]:
        return self.call("POST", "/se/log", {"type": "browser"})

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.call("GET", "/screenshot")))
        return path

    def wait_ready(self, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = self.js("return document.documentElement.getAttribute('data-wbfe-ready');")
            if ready is not None:
                return str(ready)
            time.sleep(0.05)
        raise AssertionError("the page's script never ran (no data-wbfe-ready mark)")

    def close(self) -> None:
        try:
            if getattr(self, "session", None):
                self._call("DELETE", f"/session/{self.session}")
        except (RuntimeError, urllib.error.URLError, ConnectionError):
            pass
        finally:
            self.driver.terminate()
            try:
                self.driver.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


_COLUMN = """
const [table, key] = arguments;
const t = document.getElementById(table);
const i = Array.from(t.tHead.rows[0].cells).findIndex(th => th.dataset.key === key);
return Array.from(t.tBodies[0].rows).filter(r => !r.hidden).map(r => {
  const td = r.cells[i];
  return td.hasAttribute('data-null') ? null : Number(td.dataset.v);
});
"""


def errors_in(logs: list[dict[str, Any]]) -> list[str]:
    return [entry["message"] for entry in logs if entry.get("level") in ("SEVERE", "ERROR")]


@pytest.fixture(scope="module")
def browser() -> Any:
    missing = browser_missing()
    if missing:
        pytest.skip(missing)
    b = Browser()
    try:
        yield b
    finally:
        b.close()


def test_page_loads_sorts_filters_and_is_screenshotted(browser: Browser, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    import wbfe
    from tests.test_reporting import _state
    from wbfe.reporting import score_report, write_report
    from wbfe.reporting.text import visible

    model = tmp_path / "model.safetensors"
    save_file(_state(), str(model))
    score = wbfe.score(model, metrics=("bfe", "htsr", "htmp"))
    page = tmp_path / "report.html"
    write_report(score_report(score, spectra_from=model), page)
    browser.open(page)
    assert browser.wait_ready() == "2"  # the script ran and wired both sortable tables (layers, skipped)
    assert errors_in(browser.logs()) == []
    # every image rendered (a broken data: URI has naturalWidth 0)
    widths = browser.js("return Array.from(document.images).map(i => i.complete ? i.naturalWidth : -1);")
    assert len(widths) == 7 and min(widths) > 100
    layers = score.to_dict()["layers"]
    # htmp_kappa: null for the square matrix (HTMP needs gamma < 1), so the nulls' place is tested
    kappas = [layer["htmp_kappa"] for layer in layers]
    assert None in kappas
    assert browser.js(_COLUMN, "t-layers", "htmp_kappa") == kappas  # stored order before any click
    browser.click("#t-layers thead th[data-key='htmp_kappa']")
    finite = sorted(a for a in kappas if a is not None)
    nulls = [None] * (len(kappas) - len(finite))
    assert browser.js(_COLUMN, "t-layers", "htmp_kappa") == finite + nulls
    browser.click("#t-layers thead th[data-key='htmp_kappa']")
    assert browser.js(_COLUMN, "t-layers", "htmp_kappa") == finite[::-1] + nulls  # nulls last either way
    assert browser.js("return document.querySelector(\"#t-layers th[data-key='htmp_kappa']\").getAttribute('aria-sort');") \
        == "descending"
    browser.type("input[data-table='t-layers']", "blocks.")
    shown = browser.js("return Array.from(document.querySelectorAll('#t-layers tbody tr')).filter(r => !r.hidden)"
                       ".map(r => r.cells[1].textContent);")
    assert sorted(shown) == sorted(visible(layer["name"]) for layer in layers if "blocks." in layer["name"])
    assert browser.js("return document.getElementById('t-layers-count').textContent;") == \
        f"{len(shown)} of {len(layers)} rows"
    # the hostile tensor name is text in the DOM, and no script of it ran
    assert browser.js("return document.scripts.length;") == 1
    assert errors_in(browser.logs()) == []
    browser.js("window.scrollTo(0, 0);")
    shot = browser.screenshot(RESULTS / "report-browser-test.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_fetch_would_be_blocked_and_logged(browser: Browser, tmp_path: Path) -> None:
    """The check above can fail: a page that fetches is refused by its own CSP and logs an error."""
    from wbfe.reporting.content import Paragraph, Report, Section
    from wbfe.reporting.page import render_html

    text = render_html(Report("t", "s", [Section("a", "A", [Paragraph("x")])]))
    leaky = text.replace("</main>", '</main><img src="https&#58;//example.invalid/x.png">')
    path = tmp_path / "leaky.html"
    path.write_text(leaky)
    browser.open(path)
    browser.wait_ready()
    messages = errors_in(browser.logs())
    assert any("example.invalid" in m and "Content Security Policy" in m for m in messages), messages
