"""examples/custom-model, used as a user uses it: installed with pip, named by its import path.

The example is a project of its own (its own pyproject.toml, a CNN of its own, its task in one
file). It is pip-installed into this test environment once per session, not imported from the
checkout, and run from a folder outside the checkout: `fedasync simulate --config` with the
example's config, and `fedasync up --task custom_model.task:make`, each to its budget and above
chance (four classes: 0.25).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

import pytest

from fedasync.services.runtime.settings import RedisSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom-model"
CHANCE = 0.25
#: the run `fedasync up` trains: the default key prefix (the test clears FEDASYNC_*)
DEFAULT_RUN = RedisSettings.model_fields["key_prefix"].default
#: the `up` run's budget: past chance long before it (0.5 at version 9, 0.86 at 30 and 0.94 at
#: 80 in one run), and each update is real CNN training on a machine that may be loaded
UP_UPDATES = 40


@pytest.fixture(scope="session")
def example_installed() -> None:
    """`pip install examples/custom-model` (no dependencies: fedasync and torch are here)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--force-reinstall", str(EXAMPLE)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    where = subprocess.run(
        [sys.executable, "-c", "import custom_model; print(custom_model.__file__)"],
        cwd="/", check=True, capture_output=True, text=True,
    )  # fmt: skip
    installed_at = Path(where.stdout.strip())
    assert installed_at.is_relative_to(sysconfig.get_paths()["purelib"]), installed_at


def fedasync(*argv: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}
    return subprocess.run(
        [sys.executable, "-m", "fedasync.services.commands.cli", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_the_example_simulates_by_its_import_path(example_installed: None, tmp_path: Path) -> None:
    out = tmp_path / "sim"
    config = str(EXAMPLE / "simulate.toml")
    done = fedasync(
        "simulate", "--config", config, "--out", str(out), "--no-plots", "--quiet",
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["task"]["name"] == "custom_model.task:make"
    for name in ("fedasync", "fedavg"):
        result = summary["algorithms"][name]
        assert result["ended_by"] == "max_updates", name
        assert result["final"]["score"] > 2 * CHANCE, (name, result["final"])


def test_the_example_trains_in_up_by_its_import_path(
    example_installed: None, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    done = fedasync(
        "up", "--no-live", "--out", str(out), "--task", "custom_model.task:make",
        "--devices", "3", "--profile", "none", "--max-updates", str(UP_UPDATES),
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["task"]["name"] == "custom_model.task:make"
    assert summary["ended_by"] == "max_updates"
    assert summary["updates"]["applied"] == UP_UPDATES
    assert summary["updates"]["rejected"] == 0
    assert summary["final"]["accuracy"] > CHANCE, summary["final"]


def test_the_example_device_gets_a_receipt_equal_to_the_ledger_for_every_update(
    example_installed: None, tmp_path: Path
) -> None:
    """The README's flow: `fedasync up --secure`, a key from `fedasync devices add`, and the
    example's device script publishing through ingest; each of its N receipts is the ledger's
    decision about that update id, field for field.

    The run has a budget it does not reach while the device publishes; once the device has
    every receipt, the run is stopped through the control service (`POST /v1/runs/<run>/stop`,
    what `fedasync runs stop` sends) and `up` ends as after a budget: exit 0, its run folder
    written. Its own worker (the long-tail profile, slowed: 0.6 s a round) keeps updates coming,
    so the aggregator closes the run at its next batch.
    """
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}
    up = subprocess.Popen(
        [sys.executable, "-m", "fedasync.services.commands.cli", "up", "--no-live", "--secure",
         "--out", str(out), "--task", "custom_model.task:make", "--devices", "1",
         "--profile", "longtail", "--time-scale", "0.02", "--max-updates", "100000",
         "--max-seconds", "3600"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        urls: dict[str, str] = {}
        for line in up.stdout:  # the header: where everything is
            words = line.split()
            if words[:1] in (["snapshot"], ["ingest"]):
                urls[words[0]] = words[1].split("/v1/")[0]
            if words[:1] == ["redis"]:
                urls["redis"] = words[1]  # redis://127.0.0.1:<port>/0
            if words[:1] == ["dashboard"]:  # dashboard <control>/  operator token: <token>
                urls["control"], token = words[1].rstrip("/"), words[-1]
            if "device processes started" in line:
                break
        assert set(urls) == {"snapshot", "ingest", "redis", "control"}, urls
        added = subprocess.run(
            [sys.executable, "-m", "fedasync.services.commands.cli", "devices", "add", "phone-1"],
            env=env | {"FEDASYNC_REDIS__URL": urls["redis"]},
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        receipts = tmp_path / "receipts.jsonl"
        device = subprocess.run(
            [sys.executable, "-m", "custom_model.device", "--snapshot", urls["snapshot"],
             "--ingest", urls["ingest"], "--client-id", "phone-1", "--key", added.stdout.strip(),
             "--updates", "4", "--share", "3", "--receipts", str(receipts)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert device.returncode == 0, device.stderr
        stop = urllib.request.Request(
            f"{urls['control']}/v1/runs/{DEFAULT_RUN}/stop",
            data=json.dumps({"reason": "the example device is done"}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(stop, timeout=60) as answer:
            assert answer.status == 200
        remaining, _ = up.communicate(timeout=600)
        assert up.returncode == 0, remaining
    finally:
        if up.poll() is None:
            os.killpg(up.pid, 9)
            up.wait()
        if up.stdout is not None:
            up.stdout.close()
    rows = [json.loads(line) for line in receipts.read_text().splitlines()]
    assert len(rows) == 4
    assert all("outcome" in row for row in rows), rows  # every receipt holds a decision
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended_by"] == "stopped"  # by the stop, after the device's last receipt
    ledger = {}
    for line in (out / "ledger.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["client_id"] == "phone-1":
            ledger[record["update_id"]] = record
    assert sorted(ledger) == sorted(row["update_id"] for row in rows)
    for row in rows:
        record = ledger[row["update_id"]]
        for field, value in row.items():
            if field != "base_version" or "base_version" in record:
                assert record[field] == value, (field, record, row)
