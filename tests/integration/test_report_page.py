"""The report as people read it: report.html rendered by headless Chromium at 1280 px, the screenshot checked for
one colour per variant across every plot (tests/unit/test_report.py checks the page's content)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from matplotlib import colors, image

from benchmarks.analysis import figures, report
from tests.helpers import make_run

CHROMIUM = shutil.which("chromium-headless-shell")
WIDTH = 1280


def _pixels_of(shot: np.ndarray, colour: str) -> int:
    """How many pixels of the screenshot are `colour` (a matplotlib colour), within a little antialiasing."""
    target = np.array(colors.to_rgb(colour))
    return int((np.abs(shot[:, :, :3] - target).max(axis=2) < 0.02).sum())


@pytest.mark.processes
@pytest.mark.timeout(120)
@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium-headless-shell is not installed (make setup installs it as root)"
)
def test_the_report_renders_with_one_colour_per_variant_in_every_plot(tmp_path) -> None:
    """ddp, horovod and fsdp: with a colour per position in each plot, a plot whose order differed (fsdp before
    horovod, by run directory) gave horovod a colour of its own there, and the phases were drawn in the variants'
    colours. A colour per variant, and shades of their own for the parts of a step, draw none of matplotlib's
    third colour (C2): horovod is C1 and fsdp C3 everywhere."""
    runs = tmp_path / "runs"
    for i in range(3):
        for name, backend, wall in (("ddp", "ddp", 1.0), ("horovod", "horovod", 1.3), ("fsdp", "fsdp", 1.6)):
            losses = [1.0, 0.8 - 0.01 * i, 0.6]
            make_run(
                runs, f"{name}-r{i}", backend, [[1.0, 0.1, 0.1], [1.0, 0.1, 0.1]], wall=wall + 0.05 * i, losses=losses
            )
    out = tmp_path / "report"
    report.write([str(runs)], out, {"html"})
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            CHROMIUM,
            "--no-sandbox",
            f"--window-size={WIDTH},2400",
            f"--screenshot={shot}",
            (out / "report.html").as_uri(),
        ],
        capture_output=True,
        timeout=90,
        check=True,
    )
    pixels = image.imread(shot)
    assert pixels.shape[1] == WIDTH and pixels.shape[0] > 1000  # the page rendered, at the width asked
    assert figures.colour("horovod") == figures.colour("horovod@gloo") == "C1"
    for colour in ("C0", "C1", "C3"):  # ddp, horovod, fsdp
        assert _pixels_of(pixels, colour) > 200, colour
    assert _pixels_of(pixels, "C2") == 0  # no variant drawn in another's place
