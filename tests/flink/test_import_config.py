"""The Flink jobs configuration of the sync DAG: the Variable's JSON or the settings file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from state_engine.errors import ConfigurationError
from state_engine.flink.jobs_config import FILE_SETTING, load_jobs_config, parse_jobs_config


def test_variable_json_is_parsed_with_defaults() -> None:
    jobs = load_jobs_config(
        json.dumps(
            {
                "payments": {
                    "checkpoint_dir": "s3://ckpt/payments/0cf791d2fa2585d18b369593e6ac454d/",
                    "savepoint_dirs": "s3://ckpt/payments-savepoints",
                },
                "audit": {"savepoint_dirs": ["/data/audit/sp"], "flink_job_id": "ab" * 16},
            }
        )
    )
    assert [j.as_dict() for j in jobs] == [
        {"name": "audit", "checkpoint_dir": None, "savepoint_dirs": ["/data/audit/sp"],
         "flink_job_id": "ab" * 16},
        {"name": "payments",
         "checkpoint_dir": "s3://ckpt/payments/0cf791d2fa2585d18b369593e6ac454d/",
         "savepoint_dirs": ["s3://ckpt/payments-savepoints"],
         "flink_job_id": "0cf791d2fa2585d18b369593e6ac454d"},
    ]  # fmt: skip
    assert jobs[1].paths == [jobs[1].checkpoint_dir, "s3://ckpt/payments-savepoints"]


def test_the_settings_file_is_used_when_the_variable_is_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(FILE_SETTING, raising=False)
    assert load_jobs_config(None) == []
    path = tmp_path / "flink-jobs.json"
    path.write_text(json.dumps({"j": {"checkpoint_dir": "/c/abc"}}))
    monkeypatch.setenv(FILE_SETTING, str(path))
    assert [j.name for j in load_jobs_config("")] == ["j"]
    monkeypatch.setenv(FILE_SETTING, str(tmp_path / "missing.json"))
    with pytest.raises(ConfigurationError, match="cannot be read"):
        load_jobs_config(None)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{not json", "is not JSON"),
        ("[]", "must be a JSON object"),
        ('{"j": 3}', "must map to an object"),
        ('{"j": {}}', "names no directory"),
        ('{"j": {"checkpoint_dir": 5}}', "checkpoint_dir must be a string"),
        ('{"j": {"savepoint_dirs": [""]}}', "savepoint_dirs must be strings"),
    ],
)
def test_bad_configuration_is_a_clear_error(value: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_jobs_config(value, "Airflow Variable 'statekeeper_flink_jobs'")
