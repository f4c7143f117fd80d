"""plugrt.probing: helpers that backends' probes use."""
from __future__ import annotations

import os
import shutil

from plugrt.probing import which


def test_which_searches_path_like_the_shell(tmp_path, monkeypatch):
  run, plain = tmp_path / "bin" / "tool", tmp_path / "other" / "tool"
  for f in (run, plain):
    f.parent.mkdir()
    f.write_text("#!/bin/sh\n")
  run.chmod(0o755)
  plain.chmod(0o644)  # not executable: skipped, as the shell would
  monkeypatch.setenv("PATH", os.pathsep.join([str(plain.parent), "", str(run.parent)]))
  assert which("tool") == str(run) == shutil.which("tool")
  assert which("no-such-tool-here") is None
  assert which(str(run)) == str(run) and which(str(plain)) is None  # a path is checked as given
  monkeypatch.setenv("PATH", "")
  assert which("tool") is None
