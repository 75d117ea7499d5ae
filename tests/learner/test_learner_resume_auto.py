"""resume=auto: a restarted learner resumes from its checkpoint when there is one and starts fresh otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from learner_helpers import first_weights_then_stop
from pydantic import ValidationError

from flywheel.services.learner.checkpoint import CHECKPOINT_FILE, load_checkpoint, reserve_versions
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.learner.settings import LearnerSettings


@pytest.mark.parametrize(("given", "expected"), [
    ("auto", "auto"), ("AUTO", "auto"), (" auto ", "auto"), ("true", True), ("false", False), ("1", True),
    ("no", False), (True, True), (False, False),
])
def test_resume_accepts_auto_true_and_false(given: object, expected: object) -> None:
    assert LearnerSettings(resume=given, checkpoint_dir="ckpt").resume == expected


def test_resume_rules() -> None:
    assert LearnerSettings().resume is False  # the CLI default is unchanged; compose and k8s set auto
    assert LearnerSettings(resume="auto").resume == "auto"  # auto without a folder: starts fresh
    with pytest.raises(ValidationError, match="resume needs --checkpoint-dir"):
        LearnerSettings(resume=True)
    with pytest.raises(ValidationError, match="must be auto, true or false"):
        LearnerSettings(resume="sometimes", checkpoint_dir="ckpt")


def test_resume_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_LEARNER_RESUME", "auto")
    assert LearnerSettings().resume == "auto"
    monkeypatch.setenv("FLYWHEEL_LEARNER_RESUME", "true")
    monkeypatch.setenv("FLYWHEEL_LEARNER_CHECKPOINT_DIR", "ckpt")
    assert LearnerSettings().resume is True


def _first_version_then_stop(folder: Path) -> tuple[int, str]:
    """Start a learner with resume=auto, read the first weight version it publishes, stop it with SIGTERM."""
    run = first_weights_then_stop(folder, FLYWHEEL_LEARNER_RESUME="auto")
    assert run.returncode == 0, run.err
    return run.weights.version, run.err


@pytest.mark.system
def test_auto_starts_fresh_in_an_empty_folder_and_resumes_after_a_restart(tmp_path: Path) -> None:
    first, err = _first_version_then_stop(tmp_path)
    assert first == 1
    fresh = [line for line in err.splitlines() if "resume=auto" in line]
    assert len(fresh) == 1 and "no checkpoint at" in fresh[0] and "starting fresh" in fresh[0], err
    assert (tmp_path / CHECKPOINT_FILE).exists(), "SIGTERM leaves the checkpoint the restart resumes from"
    saved = load_checkpoint(tmp_path, LearnerCore((4,), 2, CoreConfig())).weight_version

    second, err = _first_version_then_stop(tmp_path)  # the same container restarted: same folder, same settings
    resumed = [line for line in err.splitlines() if "resume=auto" in line]
    assert len(resumed) == 1 and "resuming from the checkpoint" in resumed[0], err
    assert "learner: resumed from" in err
    assert second > saved >= first, "a resumed learner publishes above every version the last run sent"


@pytest.mark.system
def test_a_learner_that_died_before_its_first_checkpoint_restarts_above_what_it_published(tmp_path: Path) -> None:
    """The supervisor (or compose) restarts a learner killed before any checkpoint: it published up to version 57,
    noted in weights-versions.json as it went, so the new one starts at 58 rather than 1 (actors refuse 1..57)."""
    reserve_versions(tmp_path, 57)
    version, err = _first_version_then_stop(tmp_path)
    assert version == 58, err
    assert "published up to weight version 57" in err and "publishing from version 58 on" in err
