"""The load generator's per-request JSONL records, as ``sim agree`` and the demo read
them back: a line that is not a record is refused naming the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcompass.loadgen.records import RequestRecord, read_records

RECORD = RequestRecord("r1", "s1", "us", "tenant-0", 0.5, 0.0, 600, 16, status=200)


def test_records_read_back_and_unknown_fields_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    newer = json.loads(RECORD.to_json()) | {"field_of_a_later_version": 1}
    path.write_text(f"{RECORD.to_json()}\n\n{json.dumps(newer)}\n")
    assert list(read_records(path)) == [RECORD, RECORD]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"request_id": "r2"}', "missing 7 required positional arguments"),
        ("[1, 2]", "'list' object has no attribute 'items'"),
        ('{"request_id": "r2", "sess', "Invalid control character"),
    ],
)
def test_a_line_that_is_not_a_record_is_refused_naming_file_and_line(
    tmp_path: Path, line: str, why: str
) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(f"{RECORD.to_json()}\n{line}\n")
    with pytest.raises(ValueError, match=rf"^{path}:2: not a request record \(.*{why}"):
        list(read_records(path))
