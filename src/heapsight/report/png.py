"""Charts as PNG images, drawn by headless Chromium with the page's own renderer: the page
opened as report.html#png=CHART_ID draws that one chart filling the window, and Chromium
takes a screenshot of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from heapsight import output
from heapsight.errors import HeapsightError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
WIDTH, HEIGHT = 960, 540   # CSS pixels of one chart image
SCALE = 2                  # device pixels per CSS pixel: sharp text when the image is scaled down
JOBS = 2                   # Chromium processes at once
TIMEOUT_S = 60.0
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--mute-audio", "--disable-extensions")


def chromium() -> str:
    """The Chromium to drive (HEAPSIGHT_CHROMIUM if set, else chromium on PATH or in
    /usr/bin), or a message naming the Debian package."""
    wanted = os.environ.get("HEAPSIGHT_CHROMIUM")
    for name in ((wanted,) if wanted else ("chromium", "/usr/bin/chromium")):
        path = shutil.which(name)
        if path:
            return path
    raise HeapsightError("chromium is needed to draw PNG images and was not found: install the "
                         "Debian package chromium (apt-get install chromium), or leave out --png", 2)


def run(args: list, size: tuple = (WIDTH, HEIGHT), scale: float = 1, timeout_s: float = TIMEOUT_S,
        exe: str | None = None) -> subprocess.CompletedProcess:
    """Chromium with a fresh profile of its own, removed afterwards."""
    exe = exe or chromium()
    with tempfile.TemporaryDirectory(prefix="heapsight-chromium-") as profile:
        argv = [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                f"--force-device-scale-factor={scale}", *args]
        try:
            return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, timeout=timeout_s, cwd=profile)
        except subprocess.TimeoutExpired as e:
            raise HeapsightError(f"chromium took more than {timeout_s:.0f} s on {args[-1]}", 1) from e


def page_url(html_path: str, chart: str | None = None, size: tuple = (WIDTH, HEIGHT)) -> str:
    url = Path(html_path).resolve().as_uri()
    return f"{url}#png={chart}&w={size[0]}&h={size[1]}" if chart else url


def dump_dom(html_path: str, size: tuple = (1280, 900), timeout_s: float = TIMEOUT_S) -> str:
    """The page's DOM after its scripts ran (the body's data-charts and data-errors say how
    the drawing went)."""
    p = run(["--dump-dom", page_url(html_path)], size=size, timeout_s=timeout_s)
    if p.returncode != 0 or "<body" not in p.stdout:
        raise HeapsightError(f"chromium could not open {html_path}: " + _tail(p.stderr), 1)
    return p.stdout


def screenshot(html_path: str, out_png: str, chart: str | None = None,
               size: tuple = (WIDTH, HEIGHT), scale: float = SCALE, exe: str | None = None) -> str:
    out = Path(out_png).resolve()
    # chromium writes into a directory of our own, then the image goes through output.write
    # (whole or not at all, never over a device, a private temporary name)
    with tempfile.TemporaryDirectory(prefix="heapsight-png-") as d:
        tmp = Path(d) / "chart.png"
        p = run([f"--screenshot={tmp}", page_url(html_path, chart, size)], size=size, scale=scale, exe=exe)
        data = tmp.read_bytes() if tmp.exists() else b""
    if data[:8] != PNG_SIGNATURE:
        raise HeapsightError(f"chromium did not draw {chart or html_path} as PNG "
                             f"(exit {p.returncode}): " + _tail(p.stderr), 1)
    output.write(str(out), data, gzip=False)
    return str(out)


def write_pngs(html_path: str, charts: list, out_dir: str, jobs: int = JOBS,
               progress=None) -> list:
    """One PNG per chart id, named CHART_ID.png in out_dir; returns their paths."""
    exe = chromium()
    os.makedirs(out_dir, exist_ok=True)

    def one(cid):
        path = os.path.join(out_dir, f"{cid}.png")
        screenshot(html_path, path, cid, exe=exe)
        if progress:
            progress(path)
        return path
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, charts))


def _tail(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if "dbus" not in ln.lower()]
    return " | ".join(lines[-3:]) or "no message"
