"""Every Adreno value plugrt_qcom.adreno uses for the compute streams of both generations, checked against a vendored
excerpt of Mesa's freedreno register database (data/freedreno_excerpt.xml, sources and commits in its header), so
nothing there is typed by eye: a register's offset for its generation's variant, a field's (shift, mask) from its
low/high or pos, an enum's value. docs/research/qcom.md lists the same values with the same sources."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from plugrt_qcom import adreno as A
from plugrt_qcom import cmd

XML = ET.parse(Path(__file__).parent / "data" / "freedreno_excerpt.xml").getroot()


def _file(name: str) -> ET.Element:
  f = XML.find(f"file[@name='{name}']")
  assert f is not None, name
  return f


def _covers(variants: str | None, gen: int) -> bool:
  """Whether an element's variants attribute ("A6XX", "A7XX-", "A2XX-A6XX", none) includes generation `gen`."""
  if variants is None: return True
  lo, dash, hi = variants.partition("-")
  first, last = int(lo[1]), (int(hi[1]) if hi else 99) if dash else int(lo[1])
  return first <= gen <= last


def enum(file: str, name: str, gen: int = 6) -> int:
  hits = [v for v in _file(file).iter("value") if v.get("name") == name and _covers(v.get("variants"), gen)]
  assert len(hits) == 1, f"{name} ({gen}xx) in {file}: {len(hits)} matches"
  return int(hits[0].get("value", ""), 0)


def register(name: str, gen: int) -> ET.Element:
  hits = [r for r in _file("a6xx.xml").iter() if r.tag in ("reg32", "reg64") and r.get("name") == name and _covers(r.get("variants"), gen)]
  assert len(hits) == 1, f"register {name} ({gen}xx): {len(hits)} matches"
  return hits[0]


def field(parent: ET.Element, name: str) -> tuple[int, int]:
  hits = [b for b in parent.iter("bitfield") if b.get("name") == name]
  assert len(hits) == 1, f"field {name}: {len(hits)} matches"
  b = hits[0]
  low, high = (int(b.get("pos", "")),) * 2 if b.get("pos") else (int(b.get("low", "")), int(b.get("high", "")))
  shr = int(b.get("shr", "0"))  # a field holding value >> shr: adreno.py packs the shifted value, so its mask is the raw field
  assert shr in (0, 2), "adreno.py writes shifted fields only where the table says so"
  return low, ((1 << (high - low + 1)) - 1) << low


def domain(file: str, name: str) -> ET.Element:
  d = _file(file).find(f"domain[@name='{name}']")
  assert d is not None, name
  return d


def bitset(name: str) -> ET.Element:
  b = _file("a6xx.xml").find(f".//bitset[@name='{name}']")
  assert b is not None, name
  return b


PM4 = "adreno_pm4.xml"
ENUMS = [  # adreno.py name, XML file, XML name, generation
  ("CP_TYPE4_PKT", PM4, "CP_TYPE4_PKT", 6), ("CP_TYPE7_PKT", PM4, "CP_TYPE7_PKT", 6),
  *[(n, PM4, n, 6) for n in ("CP_NOP", "CP_WAIT_MEM_WRITES", "CP_WAIT_FOR_IDLE", "CP_RUN_OPENCL", "CP_EXEC_CS", "CP_LOAD_STATE6_FRAG",
                             "CP_REG_TO_MEM", "CP_EVENT_WRITE", "CP_SET_MODE", "CP_SET_MARKER")],
  ("CP_EVENT_WRITE7", PM4, "CP_EVENT_WRITE7", 7), ("CP_SET_MARKER", PM4, "CP_SET_MARKER", 7), ("CP_RUN_OPENCL", PM4, "CP_RUN_OPENCL", 7),
  ("CP_LOAD_STATE6_FRAG", PM4, "CP_LOAD_STATE6_FRAG", 7), ("CP_WAIT_FOR_IDLE", PM4, "CP_WAIT_FOR_IDLE", 7),
  ("CACHE_FLUSH_TS", PM4, "CACHE_FLUSH_TS", 6), ("CACHE_INVALIDATE", PM4, "CACHE_INVALIDATE", 6),
  ("CACHE_CLEAN", PM4, "CACHE_CLEAN", 7), ("CACHE_INVALIDATE7", PM4, "CACHE_INVALIDATE7", 7),
  ("EV_WRITE_USER_32B", PM4, "EV_WRITE_USER_32B", 7), ("EV_DST_RAM", PM4, "EV_DST_RAM", 7), ("RM6_COMPUTE", PM4, "RM6_COMPUTE", 7),
  ("ST6_SHADER", PM4, "ST6_SHADER", 6), ("ST6_CONSTANTS", PM4, "ST6_CONSTANTS", 6), ("ST6_UBO", PM4, "ST6_UBO", 6),
  ("ST6_UAV", PM4, "ST6_IBO", 6), ("SS6_DIRECT", PM4, "SS6_DIRECT", 6), ("SS6_BINDLESS", PM4, "SS6_BINDLESS", 6),
  ("SS6_INDIRECT", PM4, "SS6_INDIRECT", 6), ("SB6_CS_TEX", PM4, "SB6_CS_TEX", 6), ("SB6_CS_SHADER", PM4, "SB6_CS_SHADER", 6),
  ("CONSTLEN_256", "a6xx.xml", "CONSTLEN_256", 7), ("ISAMMODE_CL", "a6xx.xml", "ISAMMODE_CL", 7),
  ("WORKITEMRASTORDER_LINEAR", "a6xx.xml", "WORKITEMRASTORDER_LINEAR", 7),
]

REGISTERS = [  # adreno.py name, XML register name, generation
  *[(f"REG_A6XX_{n}", n, g) for g in (6, 7) for n in (
    "SP_CS_CNTL_0", "SP_CS_CNTL_1", "SP_CS_PROGRAM_COUNTER_OFFSET", "SP_CS_BASE", "SP_CS_PVT_MEM_PARAM", "SP_CS_PVT_MEM_BASE",
    "SP_CS_PVT_MEM_SIZE", "SP_CS_TSIZE", "SP_CS_CONFIG", "SP_CS_INSTR_SIZE", "SP_CS_PVT_MEM_STACK_OFFSET", "SP_CS_SAMPLER_BASE",
    "SP_CS_TEXMEMOBJ_BASE", "SP_CS_USIZE", "SP_MODE_CNTL", "TPL1_MODE_CNTL", "SP_CS_WIE_CNTL_0", "SP_CS_WIE_CNTL_1")],
  *[(f"REG_A6XX_{n}", n, 6) for n in ("SP_CS_UAV_BASE", "SP_CS_CONST_CONFIG", "SP_CS_NDRANGE_0", "SP_CS_CONST_CONFIG_0", "SP_CS_WGE_CNTL",
                                      "SP_CS_KERNEL_GROUP_X", "SP_UPDATE_CNTL")],
  *[(f"REG_A7XX_{n}", n, 7) for n in ("SP_CS_UAV_BASE", "SP_CS_CONST_CONFIG", "SP_CS_NDRANGE_0", "SP_CS_WGE_CNTL", "SP_CS_KERNEL_GROUP_X",
                                      "SP_UPDATE_CNTL", "SP_CS_UNKNOWN_A9BE", "SP_CS_VGS_CNTL", "SP_PS_WAVE_CNTL", "SP_CS_NDRANGE_7")],
]

FIELDS = [  # adreno.py name, where the XML defines it: (register name, generation) or ("domain"/"bitset", name), field name
  ("CP_EVENT_WRITE_0_EVENT", ("domain", "CP_EVENT_WRITE"), "EVENT"),
  *[(f"CP_EVENT_WRITE7_0_{f}", ("domain", "CP_EVENT_WRITE7"), f) for f in ("EVENT", "WRITE_SRC", "WRITE_DST", "WRITE_ENABLED")],
  ("CP_SET_MARKER_0_MODE", ("domain", "CP_SET_MARKER"), "MODE"),
  *[(f"CP_LOAD_STATE6_0_{f}", ("domain", "CP_LOAD_STATE6"), f) for f in ("DST_OFF", "STATE_TYPE", "STATE_SRC", "STATE_BLOCK", "NUM_UNIT")],
  *[(f"A6XX_SP_CS_NDRANGE_0_{f}", ("SP_CS_NDRANGE_0", g), f) for g in (6, 7) for f in ("KERNELDIM", "LOCALSIZEX", "LOCALSIZEY", "LOCALSIZEZ")],
  *[(f"A7XX_SP_CS_NDRANGE_7_{f}", ("SP_CS_NDRANGE_7", 7), f) for f in ("LOCALSIZEX", "LOCALSIZEY", "LOCALSIZEZ")],
  ("A6XX_SP_CS_CNTL_0_THREADSIZE", ("SP_CS_CNTL_0", 7), "THREADSIZE"),
  *[(f"A6XX_SP_CS_CNTL_1_{f}", ("SP_CS_CNTL_1", g), f) for g in (6, 7) for f in ("SHARED_SIZE", "CONSTANTRAMMODE")],
  *[(f"A6XX_SP_CS_CONST_CONFIG_{f}", ("bitset", "a6xx_xs_const_config"), f) for f in ("CONSTLEN", "ENABLED")],
  *[(f"A6XX_SP_CS_WGE_CNTL_{f}", ("SP_CS_WGE_CNTL", g), f) for g in (6, 7) for f in ("LINEARLOCALIDREGID", "THREADSIZE")],
  *[(f"A6XX_SP_CS_CONST_CONFIG_0_{f}", (reg, g), f) for reg, g in (("SP_CS_CONST_CONFIG_0", 6), ("SP_CS_WIE_CNTL_0", 7))
    for f in ("WGIDCONSTID", "WGSIZECONSTID", "WGOFFSETCONSTID", "LOCALIDREGID")],
  *[(f"A7XX_SP_CS_WIE_CNTL_1_{f}", ("SP_CS_WIE_CNTL_1", 7), f) for f in ("LINEARLOCALIDREGID", "THREADSIZE", "WORKITEMRASTORDER")],
  ("A7XX_SP_PS_WAVE_CNTL_THREADSIZE", ("bitset", "a6xx_sp_ps_wave_cntl"), "THREADSIZE"),
  *[(f"A6XX_SP_UPDATE_CNTL_{f}", ("SP_UPDATE_CNTL", g), f) for g in (6, 7) for f in ("CS_STATE", "CS_UAV")],
  ("A6XX_SP_MODE_CNTL_ISAMMODE", ("SP_MODE_CNTL", 7), "ISAMMODE"), ("A6XX_TPL1_MODE_CNTL_ISAMMODE", ("TPL1_MODE_CNTL", 7), "ISAMMODE"),
]


@pytest.mark.parametrize("name,file,xml_name,gen", ENUMS)
def test_enum_values(name: str, file: str, xml_name: str, gen: int) -> None:
  assert getattr(A, name) == enum(file, xml_name, gen)


@pytest.mark.parametrize("name,xml_name,gen", REGISTERS)
def test_register_offsets(name: str, xml_name: str, gen: int) -> None:
  assert getattr(A, name) == int(register(xml_name, gen).get("offset", ""), 0)


@pytest.mark.parametrize("name,where,xml_field", FIELDS)
def test_fields(name: str, where: tuple[str | int, ...], xml_field: str) -> None:
  kind, what = where
  parent = domain(PM4, str(what)) if kind == "domain" else bitset(str(what)) if kind == "bitset" else register(str(kind), int(what))
  assert getattr(A, name) == field(parent, xml_field)


def test_the_streams_use_only_checked_values() -> None:
  """The offsets each Generation writes at are among the registers checked above, for that generation."""
  checked = {(getattr(A, n), g) for n, _, g in REGISTERS}
  for gen in (cmd.A6XX, cmd.A7XX):
    for reg in (gen.update_cntl, gen.const_config, gen.ndrange_0, gen.wge_cntl, gen.kernel_group_x, gen.uav_base, gen.work_item):
      assert (reg, gen.number) in checked, f"{gen!r} writes {reg:#x}, which no XML check covers"
  words = cmd.launch(cmd.Shader(0x10000, 300), 0x20000, (8, 2, 1), (4, 1, 1), ntex=1, nsamp=1, nuav=1, gen=cmd.A7XX)
  written = {p.code for p in cmd.decode(words) if p.type == 4}
  assert all((r, 7) in checked for r in written), sorted(hex(r) for r in written if (r, 7) not in checked)
  words = cmd.launch(cmd.Shader(0x10000, 300), 0x20000, (8, 2, 1), (4, 1, 1), ntex=1, nsamp=1, nuav=1, gen=cmd.A6XX)
  written = {p.code for p in cmd.decode(words) if p.type == 4}
  assert all((r, 6) in checked for r in written), sorted(hex(r) for r in written if (r, 6) not in checked)
