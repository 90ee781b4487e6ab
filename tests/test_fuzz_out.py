"""``fuzz --out`` is checked before the search: a finding that took the whole search is never lost to a bad path."""

from __future__ import annotations

import pytest

from tests.support import harness


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_unusable_out_is_refused_before_the_search(tmp_path, device, where):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    out = blocker if where == "file" else blocker / "findings"
    proc = harness("fuzz", "--budget", "2", "--out", str(out), "--device", device,
                   "--provider", "tests.broken_providers:on_reference.wrong_slot", "--isolation", "none")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: --out {out}: a failing case could not be written there ({blocker} "), \
        proc.stderr
    assert "not a directory); nothing was run" in proc.stderr
    assert "fuzz:" not in proc.stdout  # no search ran
    assert blocker.read_text() == "not a directory\n"


def test_missing_out_under_a_directory_is_accepted(tmp_path):
    from harness.fuzz import out_dir_problem

    assert out_dir_problem(tmp_path / "new" / "deeper") == ""
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == []  # the probe leaves nothing behind
