"""The documentation: its examples run, its links point at files and headings that exist, and CI runs the README's
commands."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plugrt import Device

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted(REPO.glob("examples/*/README.md"))]


def _prose(text: str) -> str: return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))  # code is not links


def heading_anchors(text: str) -> set[str]:
  """The anchors GitHub gives a Markdown file's headings: the heading's text as rendered (code and link text kept,
  their markup gone), lower-cased, every character but letters, digits, _, - and spaces dropped, each space a '-';
  a repeated anchor gets -1, -2, ... in order."""
  out, seen = set(), {}
  for heading in re.findall(r"^#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$", re.sub(r"```.*?```", "", text, flags=re.S), re.M):
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    out.add(slug if n == 0 else f"{slug}-{n}")
  return out


def test_heading_anchors_follow_githubs_rules():
  text = "# Set up\n## Issue 17: first hit, 2026-11-25 (fourth session)\n## `plugrt.video` and [links](x.md)\n## Set up\n" \
         "## Import + discovery\n```\n# not a heading\n```\n"
  assert heading_anchors(text) == {"set-up", "issue-17-first-hit-2026-11-25-fourth-session", "plugrtvideo-and-links", "set-up-1",
                                   "import--discovery"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_point_at_files_and_headings(doc: Path):
  prose = _prose(doc.read_text())
  for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", prose):
    if "://" in target or target.startswith("mailto:"): continue
    path = doc.parent / target if target else doc
    assert path.exists(), f"{doc.name} links to {target}, which does not exist"
    if anchor and path.suffix == ".md":
      assert anchor in heading_anchors(path.read_text()), f"{doc.name} links to {target}#{anchor}: {path.name} has no such heading"


def _system_python_first(command: str) -> str:
  """A README command as CI runs it in a fresh clone: with Debian's externally managed python3 first on PATH."""
  return re.sub(r"(?<![\w/])(bash scripts/|scripts/run )", r"PATH=/usr/bin:$PATH \1", command)


def test_ci_runs_the_readme_commands():
  """The set-up section's commands: the install-and-doctor one and the test one (the two set-up commands), then the
  one that adds backends from the wheelhouse. CI runs the test command, and the other two in a fresh clone with the
  system python3 first on PATH."""
  readme = (REPO / "README.md").read_text()
  setup = readme.split("## Set up on a fresh machine")[1].split("\n## ")[0]
  commands = re.findall(r"```sh\n(.*?)\n```", setup, re.S)
  assert len(commands) == 3, "the README's set-up section keeps its two set-up commands and the one for extras"
  first, test, extras = commands
  assert first == "bash scripts/setup.sh && scripts/run plugrt doctor" and test.startswith("bash scripts/setup.sh --test && ")
  assert "scripts/wheelhouse.sh" in extras and "--find-links dist 'plugrt[" in extras
  ci = (REPO / ".ci" / "run").read_text()
  assert test in ci
  assert _system_python_first(first) in ci and _system_python_first(extras) in ci
  assert _system_python_first(first) == "PATH=/usr/bin:$PATH bash scripts/setup.sh && PATH=/usr/bin:$PATH scripts/run plugrt doctor"


def test_the_readme_links_the_guide_on_its_first_screen():
  first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:24])
  assert "](docs/guide.md)" in first_screen.split("## Set up")[0]


@pytest.mark.parametrize("doc", [REPO / "README.md", REPO / "docs" / "guide.md"], ids=lambda p: p.name)
def test_every_code_block_is_run(doc: Path):
  """Every fenced block of the README and the guide runs somewhere: python blocks here (test_examples_run_on_every_device),
  sh blocks in CI (.ci/run, as the README's set-up commands are), and only `text` blocks (a folder tree) run nowhere."""
  blocks = re.findall(r"^```(\w*)\n(.*?)^```", doc.read_text(), re.S | re.M)
  assert blocks
  ci = (REPO / ".ci" / "run").read_text()
  found = {code for d, _, code in EXAMPLES if d == doc.name}
  for lang, code in blocks:
    assert lang in ("python", "sh", "text"), f"{doc.name}: a ```{lang} block: say python, sh or text"
    if lang == "python": assert code in found
    if lang == "sh": assert code.strip() in ci or _system_python_first(code.strip()) in ci, f"{doc.name}: CI does not run\n{code}"


def _examples() -> list[tuple[str, int, str]]:
  """(document, index, code) of every python block of the README and the guides."""
  out = []
  for doc in (REPO / "README.md", REPO / "docs" / "guide.md"):
    out += [(doc.name, n, code) for n, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.S))]
  return out


EXAMPLES = _examples()
DEVICES = Device.available()


def _device_env(device: str) -> dict[str, str]:
  """The environment with `device` as the default: DEV set, every other device request taken out."""
  requests = {"DEV", "CLANG", "LLVM", "GPU", *Device.registry.backends}
  return {**{k: v for k, v in os.environ.items() if k not in requests}, "DEV": device}


def _run(code: str, path: Path, device: str, repeat: int = 1) -> subprocess.CompletedProcess:
  """Run `code` as the file `path` (@kernel reads its source) in a fresh process on `device`, `repeat` times in it."""
  path.write_text(code)
  runner = f"import runpy\nfor _ in range({repeat}): runpy.run_path({str(path)!r}, run_name='__main__')\n"
  cmd = [sys.executable, str(path)] if repeat == 1 else [sys.executable, "-c", runner]
  return subprocess.run(cmd, capture_output=True, text=True, env=_device_env(device), timeout=300)


def _refusal(code: str, device: str) -> str | None:
  """The documented error an example must raise on `device`, when the device refuses what it does (else None)."""
  if "from_blob" in code and not Device[device].allocator.supports_wrap: return f"UnsupportedError: {device} cannot wrap external memory"
  return None


def test_examples_are_found():
  assert sum(doc == "README.md" for doc, _, _ in EXAMPLES) >= 1 and sum(doc == "guide.md" for doc, _, _ in EXAMPLES) >= 5
  assert DEVICES, "no device is available: the examples ran nowhere"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("doc,n,code", EXAMPLES, ids=[f"{d}-{n}" for d, n, _ in EXAMPLES])
def test_examples_run_on_every_device(doc: str, n: int, code: str, device: str, tmp_path: Path):
  """Each python block runs as written on each available device, in a fresh process; its `print(...)  # output`
  comments hold. Where the device refuses what the block does, the block must fail with the documented error."""
  r = _run(code, tmp_path / f"example_{n}.py", device)
  if (refusal := _refusal(code, device)) is not None:
    assert r.returncode != 0 and refusal in r.stderr, f"{doc} example {n} on {device} should raise {refusal!r}:\n{code}\n{r.stderr[-2000:]}"
    return
  assert r.returncode == 0, f"{doc} example {n} failed on {device}:\n{code}\n{r.stderr[-2000:]}"
  for expected in re.findall(r"^\s*print\(.*\)\s*#\s*(.+?)\s*$", code, re.M):
    assert expected in r.stdout, f"{doc} example {n} on {device} should print {expected!r}, printed {r.stdout!r}"


@pytest.mark.parametrize("device", DEVICES)
def test_from_blob_example_owner_sees_assign_every_time(device: str, tmp_path: Path):
  """The guide's from_blob example, 50 times in one process: a stale owner is a race that one run can miss."""
  code = next(code for doc, _, code in EXAMPLES if "from_blob" in code)
  if _refusal(code, device) is not None: pytest.skip(f"{device} cannot wrap memory (the refusal is checked above)")
  r = _run(code, tmp_path / "from_blob.py", device, repeat=50)
  assert r.returncode == 0, f"the from_blob example failed on {device} in one of 50 runs:\n{r.stderr[-2000:]}"


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
  from plugrt_testing.conformance import ConformanceSuite
  text = (REPO / "docs" / "authoring.md").read_text()
  attrs = [a for a, v in vars(ConformanceSuite).items() if not a.startswith("_") and not callable(v) and not isinstance(v, property)]
  assert "device" in attrs and "transcendental_atol" in attrs
  assert [a for a in attrs if f"`{a}" not in text] == []
