"""Code comments say why, not where or how fast it was measured: no comment or docstring of the core or a plugin
(tests left out) names an NVIDIA GPU model, or gives a microsecond, millisecond or bandwidth figure. Those figures
live in docs/performance.md (or the backend's page), with the machine they came from; the code keeps the reason.
An interval the code (or a driver) sets is a constant's meaning, not a measurement: "every 20 ms", "20 ms at a
time", "polls of 1 us" stay where they are."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: NVIDIA's GPU products by model name (a chip such as GH100 or an architecture such as Hopper is a fact about the
#: hardware the code targets, not a machine something ran on)
GPU_MODEL = re.compile(r"\b(?:[HA][128]00|H20|A10G?|A16|A30|A40|L4|L40S?|B[123]00|GB[23]00|GH200|V100|P100|P40|T4"
                       r"|(?:GeForce )?(?:RTX|GTX) ?\d{3,4})\b")
#: a linter's directive, whose codes (B018, A001) are no GPUs
LINT_CODES = re.compile(r"noqa:\s*[A-Z]+\d+(?:\s*,\s*[A-Z]+\d+)*")
FIGURE = re.compile(r"(?<![\w.])~?\d+(?:\.\d+)?(?:\s?-\s?\d+(?:\.\d+)?)?\s?"
                    r"(?:us|µs|μs|ms|ns|microseconds?|milliseconds?|nanoseconds?|[KMGT]i?B/s|Gbit/s)(?!\w)")
INTERVAL_BEFORE = re.compile(r"(?:every|polls? of)\s+\Z")
INTERVAL_AFTER = re.compile(r"\s+(?:at a time|polls?\b)")


def documentation(source: str) -> Iterator[tuple[int, str]]:
  """(first line, text) of every comment and every string statement (docstrings, attribute docstrings) of a module."""
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT: yield tok.start[0], LINT_CODES.sub("noqa", tok.string)
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
      yield node.lineno, node.value.value


def findings(source: str) -> list[tuple[int, str]]:
  """(line, what) for each GPU model or figure the module's comments and docstrings name."""
  out = []
  for line, text in documentation(source):
    out += [(line + text.count("\n", 0, m.start()), f"GPU model {m.group()!r}") for m in GPU_MODEL.finditer(text)]
    for m in FIGURE.finditer(text):
      if INTERVAL_BEFORE.search(text, 0, m.start()) or INTERVAL_AFTER.match(text, m.end()): continue
      out.append((line + text.count("\n", 0, m.start()), f"figure {m.group()!r}"))
  return sorted(set(out))


def code_files() -> list[Path]:
  files = [*(ROOT / "core").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]
  return sorted(p for p in files if not {"tests", "build", "__pycache__"} & set(p.relative_to(ROOT).parts))


@pytest.mark.parametrize("source, found", [
  ("x = 1  # about 43 ms on an H200\n", [(1, "GPU model 'H200'"), (1, "figure '43 ms'")]),
  ('"""Costs ~1.4 us of Python.\n\nThe copy engine: 43 GB/s, the SMs 1.8 TB/s."""\n',
   [(1, "figure '~1.4 us'"), (3, "figure '1.8 TB/s'"), (3, "figure '43 GB/s'")]),
  ("def f():\n  '''3.5-5.5 us an SELECT on an A100 or RTX 4090'''\n",
   [(2, "GPU model 'A100'"), (2, "GPU model 'RTX 4090'"), (2, "figure '3.5-5.5 us'")]),
  ("X = 1\n'''An attribute docstring: 90 us before.'''\n", [(2, "figure '90 us'")]),
  ("x = f()  # noqa: B018, A001  (P016 surfaces; GH100 has eight; every 20 ms; 20 ms at a time; polls of 1 us)\n", []),
  ('"""The kernel polls of\n1 us each, its 50 ms poll; 1024 threads a block, 48 KiB, 8 bits, 16-bit."""\n', []),
  ("s = 'a string that is data, not documentation: 43 ms on an H200'\n", []),
])
def test_the_scan_finds_models_and_figures_in_comments_and_docstrings(source: str, found: list) -> None:
  assert findings(source) == found


def test_the_scan_reads_every_module_of_the_core_and_the_plugins() -> None:
  names = {p.relative_to(ROOT).as_posix() for p in code_files()}
  assert {"core/plugrt/runtime.py", "plugins/ops_cuda/plugrt_cuda/device.py", "plugins/nvidia_toolchain/plugrt_nvidia_toolchain/ptx.py",
          "plugins/ops_nv/iface_nvk/plugrt_nv_nvk/nvk.py"} <= names
  assert not [n for n in names if "/tests/" in n]


def test_no_comment_or_docstring_names_a_gpu_model_or_a_timing_figure() -> None:
  bad = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in code_files() for line, what in findings(p.read_text())]
  assert bad == [], "move these to docs/performance.md (or the backend's page) and keep the reason:\n" + "\n".join(bad)
