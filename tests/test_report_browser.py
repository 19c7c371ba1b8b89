"""The HTML report in a real browser: headless Chromium loads it from disk with networking off,
its DOM has every section and the inline SVG plots, and a screenshot is not blank."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from nearlocal.report.render_html import write_html
from nearlocal.report.tables import build_report
from nearlocal.store import load
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
    assert "latency vs local DRAM 16KiB 1.07×" in dom.stdout


# Reads the laid-out page: the first text under <main>, and per plot the (fill colour, marker
# shape) of every data series matplotlib drew in the axes (legend entries left out).
_SERIES_PROBE = """<script>
const first = document.querySelector("main section p");
const plots = [...document.querySelectorAll("figure.plot svg")].map((svg) => {
  const drawn = [];
  svg.querySelectorAll('g[id*="line2d"]').forEach((g) => {
    if (g.closest('g[id*="legend"], g[id*="tick"]')) return;  // legend entries, axis ticks
    const use = g.querySelector("use");
    if (!use) return;  // a reference line: no markers
    const ref = (use.getAttribute("xlink:href") || use.getAttribute("href")).slice(1);
    drawn.push([getComputedStyle(use).fill, document.getElementById(ref).getAttribute("d")]);
  });
  return drawn;
});
document.body.dataset.series = JSON.stringify({
  first: first ? first.textContent : "", firstInVerdict: !!(first && first.closest(".verdict")),
  absentInFirst: document.querySelectorAll("main section:first-of-type .absent").length,
  plots});
</script>"""


def _rendered(tmp_path, report) -> dict:
    import html as html_module
    import json
    import re

    page = write_html(report, tmp_path / "report.html")
    probe = tmp_path / "series.html"
    probe.write_text(page.read_text().replace("</body>", _SERIES_PROBE + "</body>"))
    dom = _chromium(tmp_path, "--window-size=1280,900", "--dump-dom", probe.resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-series="([^"]+)"', dom.stdout)
    assert found, dom.stdout[:2000]
    return json.loads(html_module.unescape(found.group(1)))


def test_the_verdict_comes_first_and_no_two_series_look_alike(tmp_path):
    from tests.report_fixtures import row

    rows = full_rows()  # nine CPU methods over sizes: a ninth series once shared blue circles
    methods = ["load", "store", "nt-store", "nt-copy", "nt-load", "clflush-load",
               "clflushopt-load", "store-clwb", "memcpy", "movdir64b"]
    rows += [row(m, "dram", size=s, median=s / (10 + i)) for i, m in enumerate(methods)
             for s in (4096, 65536, 2**20)]
    layout = _rendered(tmp_path, build_report([load(make_run(tmp_path / "store", rows))]))
    assert layout["firstInVerdict"] and layout["absentInFirst"] == 0
    assert layout["first"].startswith("devdax:/dev/dax0.0, a CXL pool (device-dax): latency")
    drawn = [plot for plot in layout["plots"] if plot]
    assert drawn and max(len(plot) for plot in drawn) >= 10
    for plot in drawn:
        assert len(set(map(tuple, plot))) == len(plot), plot  # colour + marker: one per series


def test_a_box_with_only_local_dram_says_so_once_first(tmp_path):
    from tests.report_fixtures import CPU_ONLY_INVENTORY, cpu_only_rows

    run = load(make_run(tmp_path / "store", cpu_only_rows(), CPU_ONLY_INVENTORY))
    layout = _rendered(tmp_path, build_report([run]))
    assert layout["firstInVerdict"] and layout["absentInFirst"] == 0
    assert layout["first"].startswith("Only local DRAM was measured: this box has 1 NUMA node")
