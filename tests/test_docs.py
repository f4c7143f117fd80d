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
  commands = re.findall(r"```sh\n(.*?)\n```", readme, re.S)
  assert len(commands) == 2, "the README keeps exactly two set-up commands"
  assert commands[1] in (REPO / ".ci" / "run").read_text()


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


def test_authoring_guide_snippets_work(tmp_path: Path):
  """docs/authoring.md: every python block compiles; the blocks with hooks, put together as the entry module the
  guide describes, load in a registry under the name its pyproject.toml block registers, with no reason and no
  warning, and the snippet's probe answers (no /dev/mydev0 here: NO_DEVICE)."""
  import os
  import subprocess
  import sys

  import tomllib
  text = (REPO / "docs" / "authoring.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  for n, block in enumerate(blocks): compile(block, f"authoring.md python block {n}", "exec")
  entry = "\n".join(b for b in blocks if "@hookimpl" in b)
  assert "def plugrt_backends" in entry and "def plugrt_program" in entry
  (tmp_path / "plugrt_mydev").mkdir()
  (tmp_path / "plugrt_mydev" / "__init__.py").write_text(entry)
  (toml,) = re.findall(r"```toml\n(.*?)```", text, re.S)
  eps = tomllib.loads(toml)["project"]["entry-points"]["plugrt"]
  (name, module), = eps.items()
  assert module == "plugrt_mydev"
  code = f"""
from plugrt.errors import Reason
from plugrt.registry import isolated
with isolated(["plugrt_mydev"]) as reg:  # the registry imports it, and so sees what it imports

  (rec,) = reg.load().plugins
  br = reg.backends[{name.upper()!r}]
  assert rec.reason is None and br.reason is None and rec.warnings == [], (rec.detail, rec.warnings)
  p = reg.probe({name.upper()!r})
  assert not p.ok and p.reason is Reason.NO_DEVICE, p
  assert [c.name for c in br.spec.compilers] == ["MYCC"]
"""
  env = {**os.environ, "PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
  assert r.returncode == 0, f"the guide's entry module does not load:\n{entry}\n{r.stderr[-2000:]}"


def test_authoring_guide_lists_every_suite_attribute():
  """Every public class attribute a ConformanceSuite subclass sets is documented in docs/authoring.md."""
  from plugrt.testing.conformance import ConformanceSuite
  text = (REPO / "docs" / "authoring.md").read_text()
  attrs = [a for a, v in vars(ConformanceSuite).items() if not a.startswith("_") and not callable(v) and not isinstance(v, property)]
  assert "device" in attrs and "transcendental_atol" in attrs
  assert [a for a in attrs if f"`{a}" not in text] == []
