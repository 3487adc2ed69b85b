"""Files crashbench reads back are input too: a malformed result is refused in one line, exit 2, with
the field that does not fit and never crashbench's own source path; a result's timeline is a file
beside it, never a path elsewhere; results and timelines are written whole or not at all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT

from crashbench import files
from crashbench.cli import cli
from crashbench.errors import ExitCode

README_RESULT = ROOT / "results" / "readme" / "20261203-064521-33bd600d-compare-default-naive-reliable-stream.json"


def _edited(tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    data = json.loads(README_RESULT.read_text())
    edit(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return path


def _text(path: Path, content: str) -> Path:
    path.write_text(content)
    return path


def _set_count(data: dict) -> None:
    data["runs"][0]["counts"]["lost"] = "many"


def _set_runs(data: dict) -> None:
    data["runs"] = "x"


def _set_flag(data: dict) -> None:
    data["runs"][1]["timings"]["drained"] = "yes"


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: _text(p, "[1, 2]"), "not a crashbench result"),
        (lambda p: _text(p, "[" * 5000 + "]" * 5000), "nested too deeply"),
        (lambda p: _text(p, "{not json"), "JSONDecodeError"),
        (lambda p: _edited(p.parent, _set_runs), "result.runs: expected a list, got str"),
        (lambda p: _edited(p.parent, _set_count), "result.runs[0].counts.lost: expected a whole number, got str"),
        (lambda p: _edited(p.parent, _set_flag), "result.runs[1].timings.drained: expected true or false, got str"),
    ],
)
@pytest.mark.parametrize("command", ["show", "recount"])
def test_a_malformed_result_is_refused_in_one_line_with_exit_2(tmp_path: Path, make, says: str, command: str) -> None:  # type: ignore[no-untyped-def]
    path = make(tmp_path / "bad.json")
    got = CliRunner().invoke(cli, [command, str(path), "--plain"], env={"COLUMNS": "40"})
    assert got.exit_code == ExitCode.USAGE, got.output
    lines = got.output.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in got.output, got.output
    assert "crashbench/report" not in got.output and ".py" not in got.output


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "sub/x.timeline.jsonl.gz", ".."])
def test_a_timeline_outside_the_results_directory_is_never_read(tmp_path: Path, name: str) -> None:
    def point(data: dict) -> None:
        data["timeline"] = name

    path = _edited(tmp_path, point)
    got = CliRunner().invoke(cli, ["recount", str(path), "--plain"])
    assert got.exit_code == ExitCode.USAGE and "must be a file beside it" in got.output, got.output


def test_the_readme_result_recounts_from_a_copy_beside_its_timeline(tmp_path: Path) -> None:
    """The same file, untouched, with its timeline beside it: reproduced (the refusals above are the edits)."""
    for p in (README_RESULT, README_RESULT.with_name(README_RESULT.stem + ".timeline.jsonl.gz")):
        shutil.copy(p, tmp_path / p.name)
    got = CliRunner().invoke(cli, ["recount", str(tmp_path / README_RESULT.name), "--plain"])
    assert got.exit_code == 0 and "reproduced" in got.output, got.output


def test_a_file_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), files.replacing(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]  # no temporary left
    with files.replacing(target) as tmp:
        tmp.write_text("new")
        assert target.read_text() == "old"  # readers see the old file until the rename
    assert target.read_text() == "new" and list(tmp_path.iterdir()) == [target]


def test_a_result_and_its_timeline_are_written_under_one_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs sharing an --out: while one is between its timeline and its result, the other cannot
    start its pair (the last writer wins both files, never a result with the other run's timeline)."""
    import fcntl
    import os

    from crashbench.model import results, timeline

    for p in (README_RESULT, README_RESULT.with_name(README_RESULT.stem + ".timeline.jsonl.gz")):
        shutil.copy(p, tmp_path / p.name)
    result = results.Result.from_dict(json.loads((tmp_path / README_RESULT.name).read_text()))
    result.runs[0].timeline = recount_timelines(tmp_path / README_RESULT.name, result)[0]
    seen: list[bool] = []
    real = timeline.write

    def write_and_probe(timelines, path):  # type: ignore[no-untyped-def]
        written = real(timelines, path)
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(False)  # another writer could have come in here
        except BlockingIOError:
            seen.append(True)
        finally:
            os.close(fd)
        return written

    monkeypatch.setattr(timeline, "write", write_and_probe)
    result.write(tmp_path / "shared.json")
    assert seen == [True]


def recount_timelines(path: Path, result):  # type: ignore[no-untyped-def]
    from crashbench.report import recount

    return recount.timelines_of(path, result)
