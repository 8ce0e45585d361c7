"""The run report in a real browser: a tiny ``ragen-rllib train`` run (FrozenLake, tiny random
model, HF engine, real Ray and MLflow) writes ``<run>/report.html``; headless Chromium (selenium
with the system chromedriver) renders it: curves drawn, no JS error, an episode's turns shown.

Needs Debian's ``chromium`` and ``chromium-driver`` (``scripts/setup.sh`` installs them with apt
where it can) and the ``selenium`` package (test extra); without them the test skips.
A screenshot of the rendered report goes to ``$RAGEN_REPORT_SCREENSHOT`` (default /tmp/report.png).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOT = Path(os.environ.get("RAGEN_REPORT_SCREENSHOT", "/tmp/report.png"))
#: Flags that run Chromium headless as root, offline, with a fresh profile.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1800")


@pytest.fixture
def browser():
    """A headless Chromium driven by selenium; skips when Chromium, its driver or selenium is missing."""
    if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
        pytest.skip(f"chromium is missing ({CHROMIUM}, {CHROMEDRIVER}): scripts/setup.sh installs the Debian "
                    "packages chromium and chromium-driver where apt is available")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is missing (pip install -e '.[test]')")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="ragen-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _train_tiny_run(model_dir: Path, tmp_path: Path) -> Path:
    cfg = {"preset": "starpo_s", "iterations": 2, "run_dir": str(tmp_path / "runs"),
           "starpo": {"model": str(model_dir), "engine": "hf", "env": "frozen_lake", "env_groups": 4,
                      "group_size": 2, "max_turns": 2, "response_length": 8, "enable_think": False,
                      "critic_type": "value_head", "test_freq": 1, "val_groups": 4, "val_group_size": 2},
           "tracking": {"experiment": "test-report"}}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = subprocess.run([sys.executable, "-m", "ragen_rllib.cli", "train", "--config", str(path), "--run-name", "rep"],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    run = tmp_path / "runs" / "rep"
    assert "run report:" in p.stdout and (run / "report.html").is_file(), p.stdout[-2000:]
    return run


def test_train_writes_a_report_that_renders(tiny_model_dir, tmp_path, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    run = _train_tiny_run(tiny_model_dir, tmp_path)

    # the report is an MLflow artifact of the run, and the kept rows carry their token advantages
    from mlflow.tracking import MlflowClient

    from ragen_rllib.tracking.mlflow_logger import find_runs
    from ragen_rllib.trajectory import read_run
    from ragen_rllib.trajectory.schema import Col

    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    (mlrun,) = find_runs(uri, "test-report")
    assert "report.html" in {f.path for f in MlflowClient(uri).list_artifacts(mlrun["run_id"])}
    rows = read_run(run).to_pylist()
    assert any(r[Col.KEPT] for r in rows) and not all(r[Col.KEPT] for r in rows)
    for r in rows:
        adv = r[Col.TOKEN_ADVANTAGES]
        assert (adv is None) == (not r[Col.KEPT])
        if adv is not None:
            assert len(adv) == len(r[Col.TOKEN_IDS])
            assert all(a == 0 for a, m in zip(adv, r[Col.LOSS_MASK], strict=True) if not m)

    browser.get((run / "report.html").resolve().as_uri())
    WebDriverWait(browser, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe

    # curves: every line is a path through its points, drawn with a real extent
    paths = browser.find_elements(By.CSS_SELECTOR, "svg.chart path.series")
    assert len(paths) >= 6, len(paths)  # val, rollout success, return, std, entropy, grad norm, length
    for p in paths:
        assert p.get_attribute("d").startswith("M ") and " L " in p.get_attribute("d")
    assert browser.execute_script("return arguments[0].getBBox().width", paths[0]) > 0
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart circle.pt")) >= 2 * len(paths)
    assert browser.find_elements(By.CSS_SELECTOR, "svg.chart path.band")  # the 95% intervals

    # an episode of a kept group: its turns with the grid, the reply and the advantage heat map
    kept_group = next(g for g in browser.find_elements(By.CSS_SELECTOR, "#groups .group")
                      if g.find_elements(By.CSS_SELECTOR, ".badge.kept"))
    button = kept_group.find_element(By.CSS_SELECTOR, "button.episode")
    browser.execute_script("arguments[0].scrollIntoView()", button)
    button.click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#episode-detail .turn"))
    first_turn = browser.find_elements(By.CSS_SELECTOR, "#episode-detail .turn")[0]
    cells = first_turn.find_elements(By.CSS_SELECTOR, "table.grid-obs td")
    assert len(cells) == 16 and any(c.text == "P" for c in cells)  # the 4x4 FrozenLake grid
    assert first_turn.find_element(By.CSS_SELECTOR, "pre.reply").text.strip()
    tokens = first_turn.find_elements(By.CSS_SELECTOR, ".heat .tok")
    assert tokens and any(t.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "transparent")
                          for t in tokens)
    assert "advantage" in tokens[0].get_attribute("title")
    assert "kept" in browser.find_element(By.CSS_SELECTOR, "#episode-detail h3").text
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]

    height = browser.execute_script("window.scrollTo(0, 0); return document.documentElement.scrollHeight")
    browser.set_window_size(1400, min(int(height) + 150, 6000))  # the whole page in one screenshot
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))
