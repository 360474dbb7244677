"""A run's settings: the deployment's, with the run's prefix, task, policy and budget on top
(services/runtime/run_settings.py), and `fedasync up --runs`' plan of runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedasync.services.commands.up.many import RunsFileError, plan_runs, read_runs_file
from fedasync.services.runtime.run_settings import settings_for_run
from fedasync.services.runtime.settings import SettingsError, load_settings, validated
from fedasync.shared.runs import RunSpec, TaskSpec

ROOT = Path(__file__).resolve().parents[2]


def test_a_runs_spec_replaces_the_task_policy_and_budget_and_names_the_default_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FEDASYNC_POLICY__MODE", "memory")  # the supervisor's own: not the run's
    base = load_settings(redis={"url": "redis://:pw@h:1"}, policy={"gamma": 2.0})
    spec = RunSpec("kb", TaskSpec("linear", seed=3), {"mode": "fedbuff"}, {"max_updates": 30})
    run = settings_for_run(base, spec, aggregator={"port": 9100})
    assert (run.redis.key_prefix, run.redis.url) == ("kb", "redis://:pw@h:1")
    assert (run.task.name, run.task.seed) == ("linear", 3)
    policy = run.policy.to_policy()
    assert policy.mode == "fedbuff"
    assert policy.gamma == load_settings(policy={"mode": "fedbuff"}).policy.to_policy().gamma
    assert run.budget.max_updates == 30
    assert run.aggregator.port == 9100
    assert run.auth.default_run == "fedasync"
    assert settings_for_run(base, None).redis.key_prefix == "fedasync"


def test_validated_settings_read_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDASYNC_TASK__SEED", "9")
    assert load_settings().task.seed == 9
    assert validated({}).task.seed == 0


def test_a_bad_field_of_a_spec_is_named_by_its_variable() -> None:
    with pytest.raises(SettingsError, match="FEDASYNC_POLICY__BUFFER_SIZE"):
        settings_for_run(load_settings(), RunSpec("kb", policy={"buffer_size": -1}))


def test_up_runs_n_are_the_default_run_then_numbered_runs_each_seed_its_own() -> None:
    base = load_settings(task={"seed": 5})
    runs = plan_runs(base, 3, None)
    assert [r.id for r in runs] == ["fedasync", "fedasync-2", "fedasync-3"]
    assert [r.settings.task.seed for r in runs] == [5, 6, 7]
    assert [r.settings.auth.default_run for r in runs] == [None, "fedasync", "fedasync"]
    assert [r.default for r in runs] == [True, False, False]


def test_the_example_runs_file_reads_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    specs = read_runs_file(ROOT / "examples" / "runs.toml")
    runs = plan_runs(load_settings(), 1, specs)
    assert [r.id for r in runs] == ["fedasync", "digits-fedbuff", "linear-exp"]
    assert runs[1].settings.policy.to_policy().buffer_size == 5
    assert [r.settings.auth.default_run for r in runs] == [None, "fedasync", "fedasync"]
    renamed = plan_runs(load_settings(), 1, [RunSpec("main"), RunSpec("side")])
    assert [r.settings.redis.key_prefix for r in renamed] == ["main", "side"]
    assert [r.settings.auth.default_run for r in renamed] == [None, "main"]
    bad = tmp_path / "runs.toml"
    bad.write_text('[[run]]\nid = "Bad"\n')
    with pytest.raises(RunsFileError, match="run 1: 'Bad' is not a run id"):
        read_runs_file(bad)
    bad.write_text('[[run]]\nid = "a"\n[[run]]\nid = "a"\n')
    with pytest.raises(RunsFileError, match="appears twice"):
        read_runs_file(bad)
    bad.write_text("x = 1\n")
    with pytest.raises(RunsFileError, match=r"no \[\[run\]\] table"):
        read_runs_file(bad)
