"""The documentation: its examples run, its links point at files that exist, and CI runs the README's test command."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("examples/*/README.md"))]


def test_readme_examples_run(capsys):
  blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
  assert blocks
  for block in blocks: exec(compile(block, "README.md", "exec"), {})
  assert "[1. 3. 5. 7.]" in capsys.readouterr().out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_point_at_files(doc: Path):
  prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", doc.read_text(), flags=re.S))  # code is not links
  for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", prose):
    if "://" in target: continue
    assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"


def test_ci_runs_the_readme_test_command():
  readme = (REPO / "README.md").read_text()
  setup = readme.split("## Set up on a fresh machine")[1].split("\n## ")[0]
  commands = re.findall(r"```sh\n(.*?)\n```", setup, re.S)
  assert len(commands) == 2, "the README keeps exactly two set-up commands"
  ci = (REPO / ".ci" / "run").read_text()
  assert commands[1] in ci
  em = "PATH=/usr/bin:$PATH "  # the first command too, with an externally managed python3 first on PATH
  assert commands[0].replace("bash scripts/setup.sh", em + "bash scripts/setup.sh").replace("scripts/run", em + "scripts/run") in ci


GUIDES = [REPO / "docs" / "guide.md"]


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_guide_examples_run(guide: Path, tmp_path: Path):
  """Each python block runs as written, in a file of its own (@kernel reads its source) and a fresh process."""
  import subprocess
  import sys
  blocks = re.findall(r"```python\n(.*?)```", guide.read_text(), re.S)
  assert len(blocks) >= 5
  for n, block in enumerate(blocks):
    path = tmp_path / f"example_{n}.py"
    path.write_text(block)
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, f"{guide.name} example {n} failed:\n{block}\n{r.stderr[-2000:]}"
