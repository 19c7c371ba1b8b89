"""The HTML report in a real browser: headless Chromium loads it from disk with networking off,
its DOM has every section and the inline SVG plots, and a screenshot is not blank."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from nearlocal.report.render_html import write_html
from nearlocal.report.tables import build_report
from nearlocal.results import load
from tests.report_fixtures import full_rows, make_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]

pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="chromium is not installed (scripts/test.sh installs it)")


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_html_report_loads_in_chromium_with_its_plots(tmp_path):
    report = build_report([load(make_run(tmp_path / "store", full_rows()))])
    page = write_html(report, tmp_path / "report.html")
    url = page.resolve().as_uri()

    dom = _chromium(tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console  # no script errors, no failed loads reported by the page
    html = dom.stdout
    assert "<title>nearlocal report" in html
    for section in report.sections:
        assert f'id="{section.key}"' in html
    plots = sum(len(s.plots) for s in report.sections)
    assert plots >= 4
    assert html.count("<svg") == plots  # every plot parsed as an inline SVG element
    assert html.count('<figure class="plot">') == plots
    assert "worker crashed: SIGBUS" in html

    shot = tmp_path / "shot.png"
    result = _chromium(tmp_path, "--window-size=1280,2000", f"--screenshot={shot}", url)
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as image:
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is None or len(colors) > 50  # text, tables and plots, not a blank page
