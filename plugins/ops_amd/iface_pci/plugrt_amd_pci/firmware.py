"""Which firmware files the amdgpu driver would load for a GPU, from its IP discovery table, and whether they are here.

Since GC 11 (RDNA3), PSP 13, SMU 13 and SDMA 6 (and the GC 9.4.3+/SDMA 4.4.2+ of MI300) the kernel names firmware
after the IP version (`amdgpu_ucode_ip_version_decode`: "<ip>_<major>_<minor>_<rev>", e.g. psp_13_0_0_sos.bin,
gc_11_0_0_mec.bin); older blocks use the chip's name (navi21_sos.bin, ...), which the table does not give, so
plugrt lists those blocks as `legacy` without a file name. The files listed are the ones a compute-only bring-up
needs (PSP's secure OS, the SMU, SDMA, and GC's command processors and RLC; GFX11+ also the IMU), not every file
the driver can load (TA, MES, VCN, DMCUB). Presence counts compressed copies (.zst, .xz) as the kernel's firmware
loader does. Sources: docs/research/amd-pci.md.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from plugrt_amd_pci.discovery import DiscoveryTable

FIRMWARE_DIR = "/lib/firmware/amdgpu"
COMPRESSED = ("", ".zst", ".xz")
#: MP1 versions with an SMU firmware file (discrete GPUs; APUs have none)
SMU_FILES = {(13, 0, 0), (13, 0, 6), (13, 0, 7), (13, 0, 10), (13, 0, 14), (14, 0, 2), (14, 0, 3)}
#: versions that keep chip names although their family is versioned (MP0 13.0.1/13.0.3 yellow_carp, 13.0.2 aldebaran)
LEGACY_MP0 = {(13, 0, 1), (13, 0, 2), (13, 0, 3)}


@dataclass(frozen=True)
class FirmwareNeed:
  """One firmware file an IP block's version calls for (amdgpu's name for it), or a chip-named one plugrt cannot name."""
  block: str                 # GC, MP0, MP1, SDMA0
  version: tuple[int, int, int]
  name: str                  # file name under amdgpu/ ("" for legacy)
  what: str                  # what it is
  legacy: bool = False       # named after the chip: plugrt cannot name the file


def _v(v: tuple[int, int, int]) -> str: return "_".join(map(str, v))


def needs(table: DiscoveryTable) -> list[FirmwareNeed]:
  """The firmware the PSP, SMU, SDMA and GC versions of `table` call for, named as amdgpu names them."""
  out: list[FirmwareNeed] = []
  if (v := table.version_of("MP0")) is not None:
    if v[0] >= 13 and v not in LEGACY_MP0: out.append(FirmwareNeed("MP0", v, f"psp_{_v(v)}_sos.bin", "PSP secure OS (loads every other firmware)"))
    else: out.append(FirmwareNeed("MP0", v, "", "PSP firmware (chip-named)", legacy=True))
  if (v := table.version_of("MP1")) is not None:
    if v in SMU_FILES: out.append(FirmwareNeed("MP1", v, f"smu_{_v(v)}.bin", "SMU firmware"))
    elif v[0] < 13 or v == (13, 0, 2): out.append(FirmwareNeed("MP1", v, "", "SMU firmware (chip-named)", legacy=True))
  if (v := table.version_of("SDMA0")) is not None:
    if v[0] >= 6 or (v[:2] == (4, 4) and v[2] >= 2): out.append(FirmwareNeed("SDMA0", v, f"sdma_{_v(v)}.bin", "SDMA engine"))
    else: out.append(FirmwareNeed("SDMA0", v, "", "SDMA firmware (chip-named)", legacy=True))
  if (v := table.version_of("GC")) is not None:
    if v[0] >= 11: parts = ("pfp", "me", "mec", "rlc", "imu")
    elif v[:2] == (9, 4) and v[2] >= 3: parts = ("mec", "rlc")
    else: parts = ()
    if parts: out += [FirmwareNeed("GC", v, f"gc_{_v(v)}_{p}.bin", f"GC {p.upper()}") for p in parts]
    else: out.append(FirmwareNeed("GC", v, "", "GC firmware (chip-named)", legacy=True))
  return out


def locate(name: str, directory: str = FIRMWARE_DIR) -> str | None:
  """The path of `name` (or its .zst/.xz) in `directory`, else None."""
  for ext in COMPRESSED:
    if os.path.isfile(p := os.path.join(directory, name + ext)): return p
  return None


def report(table: DiscoveryTable, directory: str = FIRMWARE_DIR) -> tuple[list[tuple[FirmwareNeed, str | None]], str]:
  """Each need with where its file is (None: missing), and one line saying so."""
  rows = [(n, locate(n.name, directory) if n.name else None) for n in needs(table)]
  present = [n.name for n, p in rows if p]
  missing = [n.name for n, p in rows if n.name and not p]
  legacy = [f"{n.block} {'.'.join(map(str, n.version))}" for n, _ in rows if n.legacy]
  parts = [f"{len(present)} of {len(present) + len(missing)} firmware files in {directory}"]
  if missing: parts.append("missing " + ", ".join(missing))
  if legacy: parts.append("chip-named firmware not mapped for " + ", ".join(legacy))
  return rows, "; ".join(parts)
