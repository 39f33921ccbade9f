"""Every Flink command on ``s3://`` directories (moto's server), as on a local disk: import of
checkpoints and of savepoints (whose handles are relative to the savepoint's own directory),
verify, state show, the conversion into a Statekeeper savepoint, expire and orphan cleanup."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from state_engine.cli import main
from tests.cluster.sk_cluster import S3Endpoint
from tests.fixtures.s3 import s3, s3_env  # noqa: F401  (fixtures)

JOB_DIR = "checkpoints/0cf791d2fa2585d18b369593e6ac454d"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("STATEKEEPER_HOME", str(home))
    monkeypatch.delenv("STATEKEEPER_CATALOG_URL", raising=False)
    assert main(["catalog", "upgrade"]) == 0
    return home


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = _run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_flink_commands_work_on_s3_directories_as_on_local_ones(
    s3_env: S3Endpoint,  # noqa: F811  (the fixture imported above)
    home: Path,
    flink_fixtures: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = flink_fixtures.java / "rocksdb"
    prefix = f"{s3_env.bucket}/{uuid.uuid4().hex[:8]}"
    s3_env.fs().put(str(local) + "/", f"{prefix}/", recursive=True)
    remote = f"s3://{prefix}"
    monkeypatch.setenv("STATEKEEPER_CHECKPOINT_ROOT", f"{remote}/statekeeper")

    imported = _json(
        capsys, "flink", "import", f"{remote}/savepoints", "--job", "s3job",
        "--manage", "retention,orphans",
    )  # fmt: skip
    assert sorted(a["format"] for a in imported["added"]) == ["CANONICAL", "NATIVE"]
    more = _json(capsys, "flink", "import", f"{remote}/{JOB_DIR}", "--job", "s3job")
    assert len(more["added"]) == 3
    # the same snapshots imported from the local copy: the same files, sizes and records
    same = _json(
        capsys, "flink", "import", str(local / "savepoints"), "--job", "localjob",
        "--manage", "retention,orphans",
    )  # fmt: skip
    assert [(a["checkpoint_id"], a["files"], a["bytes"]) for a in imported["added"]] == [
        (a["checkpoint_id"], a["files"], a["bytes"]) for a in same["added"]
    ]
    code, out, err = _run(capsys, "verify", "s3job")
    assert code == 0, out + err

    canonical = next(a for a in imported["added"] if a["format"] == "CANONICAL")
    local_canonical = next(a for a in same["added"] if a["format"] == "CANONICAL")
    rows = _json(capsys, "state", "show", str(canonical["snapshot_id"]), "--limit", "0")
    local_rows = _json(capsys, "state", "show", str(local_canonical["snapshot_id"]), "--limit", "0")
    assert rows == local_rows and len(rows) > 1000
    for added in more["added"]:
        assert _json(capsys, "state", "show", str(added["snapshot_id"]), "--limit", "5")

    converted = _json(capsys, "maintain", "savepoint", "--snapshot", str(canonical["snapshot_id"]))
    assert converted["output_location"].startswith(f"{remote}/statekeeper/")
    assert converted["rows_out"] > 0

    expired = _json(capsys, "maintain", "expire", "--job", "s3job", "--retain-last", "1")
    assert expired["status"] == "SUCCEEDED" and len(expired["stats"]["expired"]) == 2
    orphans = _json(capsys, "maintain", "orphan_cleanup", "--job", "s3job", "--dry-run")
    assert orphans["status"] == "DRY_RUN"
