"""The register tables of the driverless bring-up (plugrt_amd_pci.regtables) are data: each module is its docstring and
assignments of literal values, and each table names the kernel source it was copied from."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import plugrt_amd_pci.regtables

TABLES = Path(plugrt_amd_pci.regtables.__file__).parent
SOURCE = re.compile(r"\b\w+\.[ch]\b")   # a kernel header or driver file: mmhub_3_0_0_offset.h, gfxhub_v3_0.c


def test_register_tables_are_data_with_their_sources() -> None:
  modules = sorted(p for p in TABLES.glob("*.py") if p.name != "__init__.py")
  assert modules, f"no register tables in {TABLES}"
  for path in [TABLES / "__init__.py", *modules]:
    text = path.read_text()
    tree = ast.parse(text, str(path))
    doc, *body = tree.body
    assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str), f"{path.name}: no docstring"
    lines = text.splitlines()
    before = doc.end_lineno or 0
    for node in body:
      where = f"{path.name}:{node.lineno}"
      assert isinstance(node, ast.Assign) and all(isinstance(t, (ast.Name, ast.Tuple)) for t in node.targets), f"{where}: not a table"
      ast.literal_eval(node.value)   # literals only: no names, calls or operators
      gap = lines[before:node.lineno - 1]
      if gap:                        # a table directly under another one shares its comment
        comment = " ".join(line for line in gap if line.startswith("#:"))
        assert SOURCE.search(comment), f"{where}: its comment names no source file: {comment!r}"
      before = node.end_lineno or node.lineno
    assert SOURCE.search(ast.get_docstring(tree) or "") or path.name == "__init__.py", f"{path.name}: its docstring names no source"


def test_the_gmc_code_reads_its_tables_from_regtables() -> None:
  from plugrt_amd_pci import gmc
  from plugrt_amd_pci.regtables import gmc as tables
  assert gmc.MMHUBS[(3, 0, 0)].offsets is tables.MMHUB_3_0_0 and gmc.GFXHUBS[(12, 0, 1)].offsets is tables.GC_12_0_0
  assert gmc.FIELDS_12["MMVM_CONTEXT1_CNTL"] is tables.FIELDS_12_MOVED["MMVM_CONTEXT1_CNTL"]
  assert gmc.FIELDS_12["MMVM_L2_CNTL"] is tables.FIELDS["MMVM_L2_CNTL"]
