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


# Measures the laid-out page: where the verdict and the first paper table sit, in CSS pixels.
_LAYOUT_PROBE = """<script>
const top_of = (sel) => { const e = document.querySelector(sel);
                          return e ? Math.round(e.getBoundingClientRect().top) : -1; };
document.body.dataset.probe = JSON.stringify({
  h2: document.querySelector("main h2").textContent,
  verdict: top_of(".verdict"), b7: top_of("#b7"), viewport: window.innerHeight,
  scrollWidth: document.documentElement.scrollWidth, width: window.innerWidth});
</script>"""


def test_the_top_of_the_page_answers_how_near_local_is(tmp_path):
    import html as html_module
    import json
    import re

    report = build_report([load(make_run(tmp_path / "store", full_rows()))])
    page = write_html(report, tmp_path / "report.html")
    probe = tmp_path / "probe.html"  # the report plus a script that reports its layout
    probe.write_text(page.read_text().replace("</body>", _LAYOUT_PROBE + "</body>"))
    dom = _chromium(tmp_path, "--window-size=1280,900", "--dump-dom", probe.resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-probe="([^"]+)"', dom.stdout)
    assert found, dom.stdout[:2000]
    layout = json.loads(html_module.unescape(found.group(1)))
    assert layout["h2"] == "How near is local"  # the first heading under the header
    assert 0 < layout["verdict"] < layout["viewport"] / 2  # the verdict is on the first screen
    assert layout["verdict"] < layout["b7"]
    assert layout["scrollWidth"] <= layout["width"]  # nothing pushes the page sideways
    assert "takes 4.82× local DRAM's time" in dom.stdout
