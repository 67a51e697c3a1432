"""examples/webservice.py's live page in a real headless browser (Debian's chromium, driven by Playwright).

Start a rollout from the page's form, check that every chart draws data (canvas pixels in the series
colours, not just the frame), that the charts and the steps counter move over a couple of seconds,
and that the Stop button stops the rollout and its workers. Needs ``pip install playwright`` and
``apt-get install -y chromium`` (no browser download: the system chromium is used).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from typing import Any

import pytest
from conftest import assert_clean, load_example, pid_gone, run_on, wait
from test_webservice import start_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = os.environ.get("AIOVEC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
CHARTS = ("chart-workers", "chart-rate", "chart-latency", "chart-returns")
SCREENSHOT = "/tmp/aiovec_webservice_page.png"

# Per canvas: how many pixels are coloured (not white/grey: the series, not the frame, grid or labels),
# and a cheap hash of the pixels, to tell that the drawing changed.
CANVAS_JS = """(ids) => ids.map((id) => {
  const c = document.getElementById(id);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let coloured = 0, nonwhite = 0, h = 0;
  for (let i = 0; i < d.length; i += 4) {
    const r = d[i], g = d[i + 1], b = d[i + 2];
    if (r < 250 || g < 250 || b < 250) nonwhite++;
    if (Math.max(r, g, b) - Math.min(r, g, b) > 40) coloured++;
    h = (h * 31 + r + 7 * g + 13 * b) >>> 0;
  }
  return {id, width: c.width, height: c.height, coloured, nonwhite, hash: h, points: Number(c.dataset.points || 0)};
})"""


def require_browser() -> Any:
    """Playwright and chromium, or a failure that says what to install (CI installs both)."""
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.fail("Playwright for Python is missing: pip install playwright  (no `playwright install` needed: "
                    "the test uses the system chromium)", pytrace=False)
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        found = shutil.which("chromium") or shutil.which("chromium-browser")
        pytest.fail(f"chromium not found at {CHROMIUM}{f' (there is one at {found}: set AIOVEC_CHROMIUM)' if found else ''}: "
                    "apt-get update && apt-get install -y chromium", pytrace=False)
    return async_playwright


async def page_scenario(ws: Any, async_playwright: Any) -> dict:
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    runner, base = await start_server(ws)
    problems: list[str] = []
    try:
        async with async_playwright() as pw:
            browser = await wait(pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS))
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 1000})
                page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
                page.on("console", lambda msg: msg.type == "error" and problems.append(f"console error: {msg.text}"))
                page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status} for {r.url}"))
                page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
                await page.goto(base + "/", wait_until="load", timeout=20_000)
                await page.wait_for_function("window.aiovecPage && window.aiovecPage.polls >= 1", timeout=10_000)
                assert "no rollout yet" in await page.text_content("#state")

                # start a rollout from the form
                await page.fill("input[name=env_id]", "CartPole-v1")
                await page.fill("input[name=num_envs]", "8")
                await page.click("#start")
                await page.wait_for_function(
                    "window.aiovecPage.points.rate >= 3 && window.aiovecPage.points.returns >= 5 && window.aiovecPage.lastSteps > 0",
                    timeout=20_000)
                assert (await page.text_content("#state")).startswith("running")
                first = await page.evaluate(CANVAS_JS, list(CHARTS))
                steps1 = int(await page.text_content("#steps"))
                polls1 = await page.evaluate("window.aiovecPage.polls")
                rate_points1 = await page.evaluate("window.aiovecPage.points.rate")
                # Two more polls that brought data, however long a loaded machine takes for them.
                await page.wait_for_function(
                    f"window.aiovecPage.polls >= {polls1 + 2} && window.aiovecPage.points.rate > {rate_points1} "
                    f"&& window.aiovecPage.lastSteps > {steps1}", timeout=60_000)
                second = await page.evaluate(CANVAS_JS, list(CHARTS))
                steps2 = int(await page.text_content("#steps"))
                polls2 = await page.evaluate("window.aiovecPage.polls")
                workers = int(await page.text_content("#workers"))
                await page.screenshot(path=SCREENSHOT, full_page=True)

                for a, b in zip(first, second, strict=True):
                    assert a["width"] > 100 and a["height"] > 100, a
                    assert a["nonwhite"] > 500 and a["coloured"] > 50, f"{a['id']} draws no data: {a}"
                    assert b["coloured"] > 50, f"{b['id']} draws no data: {b}"
                    if a["id"] != "chart-workers":  # the worker count may well stay put
                        assert b["hash"] != a["hash"], f"{a['id']} did not change over two polls: {a} -> {b}"
                by_id = {c["id"]: c for c in second}
                assert by_id["chart-rate"]["points"] > {c["id"]: c for c in first}["chart-rate"]["points"], "the steps/s series did not grow"
                assert steps2 > steps1 > 0, f"steps counter did not increase: {steps1} -> {steps2}"
                assert polls2 - polls1 >= 2, f"the page polled {polls2 - polls1} times"
                assert workers >= 1

                # stop from the page
                import aiohttp

                async with aiohttp.ClientSession() as s, s.get(f"{base}/rollouts/1") as resp:
                    pids = (await resp.json())["worker_pids"]
                await page.click("#stop")
                await page.wait_for_function("document.getElementById('state').textContent.startsWith('stopped')", timeout=20_000)
                steps3 = int(await page.text_content("#steps"))
                await asyncio.sleep(1.0)
                assert int(await page.text_content("#steps")) == steps3, "steps kept increasing after Stop"
                assert pids and all(pid_gone(p) for p in pids), f"workers still running after Stop: {pids}"
            finally:
                await browser.close()
    finally:
        await wait(runner.cleanup())
    assert not problems, problems
    return {"steps": (steps1, steps2), "polls": polls2 - polls1, "charts": second}


@pytest.fixture
def ws():
    yield from load_example("webservice.py")


def test_live_page_in_chromium(clean, ws):
    async_playwright = require_browser()
    t0 = time.perf_counter()
    out = run_on("asyncio", page_scenario(ws, async_playwright), guard=90.0)
    assert_clean(clean)
    print(f"\npage: steps {out['steps'][0]} -> {out['steps'][1]} in 2.5 s, {out['polls']} polls; "
          + ", ".join(f"{c['id']}: {c['points']} points, {c['coloured']} coloured px" for c in out["charts"])
          + f"; {time.perf_counter() - t0:.1f} s; screenshot {SCREENSHOT}")
