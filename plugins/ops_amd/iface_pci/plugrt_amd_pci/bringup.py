"""The driverless bring-up of an AMD GPU, as far as plugrt implements it, on any `regs.GPURegisters`.

Steps (each recorded in `BringUp.steps`, in order):

1. VRAM size from RCC_CONFIG_MEMSIZE (a dead GPU reads 0 or 0xffffffff: `RegisterError`);
2. the IP discovery binary, `DISCOVERY_TMR_SIZE` bytes at `DISCOVERY_TMR_OFFSET` below the top of VRAM (through the
   VRAM BAR or MM_INDEX/MM_DATA); if its signature is wrong, amdgpu/ip_discovery.bin as the kernel's fallback does;
   validated and parsed (`discovery.parse`; corruption is a `DiscoveryError`);
3. the NBIO block's index/data pair for registers beyond the register BAR;
4. the firmware files the IP versions call for, and which are present;
5. on interfaces that boot the PSP, first the HDP flush's remap (`hdp`) and the MMHUB's GART and system aperture
   (`gmc`, as the kernel's GMC hw_init precedes the PSP's); then the PSP (`psp`): bootloader, sOS, KM ring, LOAD_TOC;
   then, when every IP firmware file is present (each split by `ucode`), the SMU, SDMA, CP, IMU and RLC ucodes through
   LOAD_IP_FW in the kernel's order around SETUP_TMR (`psp_load`), AUTOLOAD_RLC after RLC_G; then the SMU's ready flag
   and first messages (`smu`), the RLC autoload's completion and the RS64 CP set-up (`gfx`), the GFXHUB (`gmc`, VM
   contexts 1-15 configured on both hubs); then (`compute`) the golden registers, the compute VMIDs, doorbell routing,
   plugrt's page tables in VMID 8 (`vm`) and an AQL queue on the MEC (`mec`): `BringUp.compute` runs packets.

Then it stops: `stop()` raises `AMDNotImplemented` saying what was done and naming the next step that is not
implemented. Never run on an AMD GPU: tested on fake register files (docs/backends/amd.md).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from plugrt_amd_pci import compute, discovery, firmware, gc_init, gfx, gmc, hdp, psp, psp_firmware, psp_load, smu, ucode
from plugrt_amd_pci.compute import Compute
from plugrt_amd_pci.regs import GPURegisters

NOT_IMPLEMENTED = ("PSP firmware loading (SOS, then SMU/SDMA/GC microcode through the PSP ring) did not run (the reason is above), "
                   "so neither did SMU start-up, GMC/GART and VM set-up or the MEC compute queue; a device on that queue and the "
                   "interrupt handler are not implemented")
AFTER_PSP = ("next, not implemented: loading the IP firmwares through the PSP ring (GFX_CMD_ID_LOAD_IP_FW for SMU, SDMA, "
             "GC PFP/ME/MEC/RLC/IMU; RLC autoload) needs every IP firmware file; SMU start-up, {gmc}, interrupt handler")
AFTER_IP = "next, not implemented: SMU start-up for this MP1, {rlc}{gmc}, interrupt handler"
RLC_TODO = "waiting for the RLC autoload to complete, "
AFTER_SMU = ("next, not implemented: waiting for the RLC autoload to complete (gfx_v11_0_wait_for_rlc_autoload_complete) and "
             "the RS64 CP set-up, {gmc}, interrupt handler")
AFTER_RLC = ("next, not implemented: the RS64 CP set-up (gfx_v11_0/v12_0_config_gfx_rs64: the CP's ucode start addresses), {gmc}, "
             "interrupt handler")
AFTER_CP = "next, not implemented: {gmc} (gfx_v11_0/v12_0_hw_init's next steps), interrupt handler"
GMC_TODO = "GMC/GART and VM set-up (system aperture, GART page table), then the compute queue"
GMC_AFTER_MMHUB = ("the GFXHUB's GART and system aperture (gfxhub_v3_0/v12_0_gart_enable), then the golden registers, compute VMIDs, "
                   "doorbells, VMID 8's page tables and the MEC queue")
GMC_AFTER_GFXHUB = "the golden registers, compute VMIDs, doorbell routing, VMID 8's page tables and the MEC queue for this GC/NBIO"
GMC_AFTER_QUEUE = "a plugrt device on the MEC queue"
AFTER_QUEUE = ("next, not implemented: a plugrt device on this queue (the memory API and launch path of plugrt.open; host "
               "copies need SDMA queues or DMA, neither implemented; compute.load/launch run a code object when driven directly; "
               "only the PCI and USB interfaces keep the GPU here, as a plugrt_amd_pci.driverless.DriverlessGPU the device runs "
               "on), the interrupt handler "
               "(completion is polled), CWSR, scratch, MES, GART mappings of host memory (DMA)")
HINT = "use AMD_IFACE=KFD with the amdgpu kernel driver loaded"


class USBStaging(psp.Staging, Protocol):
  """psp.Staging plus its GART mapping, made once the MMHUB's GART is enabled (plugrt_amd_usb.staging)."""
  def attach(self, regs: GPURegisters, lay: gmc.Layout, mmhub: discovery.IPBlock | None, flush: Callable[[], None] | None,
             timeout: float) -> str: ...


@dataclass
class BringUp:
  """What bring-up found on one GPU, one line per step done (`steps`), and what each step read."""
  label: str
  steps: list[str] = field(default_factory=list)
  vram_size: int = 0
  table: discovery.DiscoveryTable | None = None
  source: str = ""                      # "VRAM" or the firmware file the table came from
  firmware: list[tuple[firmware.FirmwareNeed, str | None]] = field(default_factory=list)
  psp_booted: bool = False              # the sOS runs and answered GFX commands on the KM ring
  ip_loaded: list[str] = field(default_factory=list)   # ucodes the PSP took (LOAD_IP_FW), in order
  smu_started: bool = False             # the SMU's ready flag is up and it answered its first messages
  gart: bool = False                    # the MMHUB's GART and system aperture are programmed
  gmc_layout: gmc.Layout | None = None  # the MC layout the MMHUB got (the GFXHUB gets the same)
  gfxhub: bool = False                  # the GFXHUB's GART and system aperture are programmed
  hdp_flush: Callable[[], None] | None = None          # the HDP flush, when plugrt could set it up
  rlc_ready: bool = False               # the RLC autoload completed (CP_STAT 0, BOOTLOAD_COMPLETE)
  cp_ready: bool = False                # the RS64 CP pipes have their program start addresses and were reset
  mc_base: int = 0                      # VRAM's MC address and physical base (psp.vram_location)
  phys_base: int = 0
  heap_at: int = 0                      # first VRAM offset above plugrt's PSP and firmware buffers
  compute: Compute | None = None        # VMID 8's address space and the MEC queue, once set up

  @property
  def queue_ready(self) -> bool:
    """Whether bring-up reached a running compute queue: an interface then opens the device on it."""
    return self.compute is not None and self.compute.queue is not None and self.smu_started

  def summary(self) -> str:
    return "; ".join(self.steps)

  def stop(self) -> NoReturn:
    from plugrt_amd.device import AMDNotImplemented
    raise AMDNotImplemented(f"{self.label}: {self.summary()}; {self.next_step()}", HINT)

  def next_step(self) -> str:
    """What the open error names as the first step not implemented, from how far bring-up got."""
    if not self.psp_booted: return NOT_IMPLEMENTED
    if self.compute is not None and self.smu_started: return AFTER_QUEUE
    nxt = (AFTER_PSP if not self.ip_loaded else AFTER_IP if not self.smu_started else AFTER_SMU if not self.rlc_ready
           else AFTER_RLC if not self.cp_ready else AFTER_CP)
    hubs = (GMC_AFTER_QUEUE if self.compute is not None else GMC_AFTER_GFXHUB if self.gfxhub else GMC_AFTER_MMHUB if self.gart
            else GMC_TODO)
    return nxt.format(gmc=hubs, rlc="" if self.rlc_ready else RLC_TODO)


def read_discovery(regs: GPURegisters, vram_size: int, firmware_dir: str = firmware.FIRMWARE_DIR) -> tuple[discovery.DiscoveryTable, str]:
  """The discovery table from the top of VRAM; with a wrong signature there, from amdgpu/ip_discovery.bin."""
  blob = regs.read_vram(vram_size - discovery.DISCOVERY_TMR_OFFSET, discovery.DISCOVERY_TMR_SIZE)
  if int.from_bytes(blob[:4], "little") == discovery.BINARY_SIGNATURE: return discovery.parse(blob), "VRAM"
  path = os.path.join(firmware_dir, discovery.FIRMWARE_IP_DISCOVERY)
  try:
    with open(path, "rb") as f: blob = f.read()
  except OSError:
    raise discovery.DiscoveryError(f"IP discovery: no binary signature at VRAM offset 0x{vram_size - discovery.DISCOVERY_TMR_OFFSET:x} "
                                   f"(read 0x{int.from_bytes(blob[:4], 'little'):08x}) and no {path}",
                                   "the GPU's firmware has not written the table (power-cycle it), or supply the table as that file") from None
  return discovery.parse(blob), path


def boot_psp(regs: GPURegisters, b: BringUp, timeout: float = 2.0, base: int = psp.DEFAULT_BASE, staging: USBStaging | None = None) -> None:
  """Step 5, in the kernel's order: the HDP flush's remap and the MMHUB's GART (GMC hw_init), the PSP boot and its IP
  firmware loads (PSP hw_init), the SMU's first messages (SMU hw_init), the RLC autoload's completion, the CP set-up and
  the GFXHUB (GFX hw_init); as far as plugrt can, recording why not otherwise. PSP, firmware, GMC, SMU and GFX errors
  propagate, typed."""
  t = b.table
  assert t is not None
  if (mp0 := t.find("MP0")) is None:
    b.steps.append("no MP0 (PSP) block in IP discovery: PSP not booted")
    return
  if mp0.version not in psp.SUPPORTED:
    b.steps.append(f"PSP boot for MP0 {mp0.version_str} is not implemented "
                   f"(plugrt boots MP0 {', '.join('.'.join(map(str, v)) for v in sorted(psp.SUPPORTED))})")
    return
  sos = next(((n, p) for n, p in b.firmware if n.block == "MP0"), None)
  if sos is None or sos[1] is None:
    name = sos[0].name if sos else f"psp_{'_'.join(map(str, mp0.version))}_sos.bin"
    b.steps.append(f"PSP not booted: {name} not found (install linux-firmware or set PLUGRT_AMD_FIRMWARE)")
    return
  fw = psp_firmware.load(sos[1])
  crc = {None: "no crc32", True: "crc32 matches", False: "crc32 differs from the header's (not enforced)"}[fw.crc_matches]
  b.steps.append(f"{sos[1]}: {fw.describe()}; {crc}")
  try:
    mc_base, phys = psp.vram_location(regs, t)
  except psp.PSPUnsupported as e:
    b.steps.append(f"PSP not booted: {e.message}")
    return
  b.mc_base, b.phys_base = mc_base, phys
  files = ip_firmware(b)              # split before the GPU is touched: a corrupt file stops here, typed
  flusher, line = hdp.setup(regs, t.find("NBIF"))
  b.steps.append(line)
  flush = b.hdp_flush = flusher.flush if flusher else None
  enable_gart(regs, b, mc_base, phys, flush, timeout, gmc.GART_MIN if staging else gmc.GART_SIZE)  # GMC hw_init precedes the PSP's
  if staging is not None:               # the PSP's buffers reach it through the GART (the USB bridge's SRAM)
    if b.gmc_layout is None:
      b.steps.append(f"PSP not booted: {staging.where} is reached through the GART, which is not set up")
      return
    b.steps.append(staging.attach(regs, b.gmc_layout, t.find("MMHUB"), flush, timeout))
  p = psp.PSP(regs, mp0, b.vram_size, mc_base, phys, base=base, timeout=timeout, flush=flush, staging=staging)
  b.steps += p.boot(fw)
  b.steps.append(p.ring_create())
  size, steps = p.tmr_init(fw)
  b.steps += steps
  loader = psp_load.IPLoader(p, files) if files else None
  if loader is not None:
    b.steps.append(loader.place())
    b.heap_at = loader.end
  if loader is not None and loader.smu_first_before_tmr: b.steps += loader.load_smu()
  b.steps += p.tmr_load(size)
  if loader is not None:
    if not loader.smu_first_before_tmr: b.steps += loader.load_smu()
    b.steps += loader.load_rest()
    b.ip_loaded = list(loader.loaded)
    if loader.smu is not None: start_smu(regs, b, timeout)
    if "RLC_G" in b.ip_loaded: wait_rlc(regs, b, timeout, files)   # gfx hw_init, after the SMU's
  p.ring_destroy()
  b.steps.append("KM ring destroyed (as the kernel's psp_ring_stop on unload), the sOS and TMR left running")
  b.psp_booted = True


def _kind(need: firmware.FirmwareNeed) -> str:
  """The ucode kind of a firmware.needs row: smc for MP1, sdma for SDMA0, the file's suffix for GC (pfp, me, mec, ...)."""
  if need.block == "MP1": return "smc"
  if need.block.startswith("SDMA"): return "sdma"
  return need.name.rsplit("_", 1)[-1].removesuffix(".bin")


def ip_firmware(b: BringUp) -> list[ucode.IPFirmware] | None:
  """Every IP firmware file (SMU, SDMA, GC) split into ucodes, or None (recorded) when one is missing."""
  rows = [(n, path) for n, path in b.firmware if n.block in ("MP1", "SDMA0", "GC") and not n.legacy]
  missing = [n.name for n, path in rows if path is None]
  if missing or not rows:
    b.steps.append(f"IP firmware not loaded: {', '.join(missing) or 'no SMU/SDMA/GC firmware named'} not found "
                   "(the kernel refuses to start without them; install linux-firmware or set PLUGRT_AMD_FIRMWARE)")
    return None
  gc = b.table.version_of("GC") if b.table else None
  files = [ucode.load(path, _kind(n), gc[0] if gc else 11) for n, path in rows if path]
  b.steps.append("IP firmware: " + "; ".join(f.describe() for f in files))
  return files


def enable_gart(regs: GPURegisters, b: BringUp, fb_start: int, phys: int, flush: Callable[[], None] | None = None,
                timeout: float = 2.0, gart_size: int = gmc.GART_SIZE) -> None:
  """The MMHUB's GART and system aperture (gmc.enable); a hub version plugrt does not program is recorded."""
  mmhub = b.table.find("MMHUB") if b.table else None
  if mmhub is None: return
  try: b.gmc_layout, line = gmc.enable(regs, mmhub.version, mmhub.bases[0], fb_start, b.vram_size, phys, flush, timeout, gart_size)
  except gmc.GMCUnsupported as e: b.steps.append(f"GART not set up: {e}")
  else:
    b.steps.append(line)
    b.gart = True


def wait_rlc(regs: GPURegisters, b: BringUp, timeout: float, files: list[ucode.IPFirmware]) -> None:
  """The RLC autoload's completion (gfx.wait_autoload), then the RS64 CP set-up (gfx.config_rs64) when the CP files are
  RS64; a GC version plugrt lacks is recorded."""
  gc = b.table.find("GC") if b.table else None
  if gc is None: return
  line = gfx.wait_autoload(regs, gc, timeout)
  if line is None:
    b.steps.append(f"RLC autoload not awaited: its status register is not known for GC {gc.version_str}")
    return
  b.steps.append(line)
  b.rlc_ready = True
  if gc.version[0] >= 12:             # gfx_v12_0_hw_init: the golden registers right after the autoload, before the CP set-up
    b.steps.append(gc_init.golden(regs, gc, b.table.find("NBIF") if b.table else None) or f"no golden registers known for GC {gc.version_str}")
  starts = {f.kind.upper(): f.start_addr for f in files if f.kind in ("pfp", "me", "mec") and f.start_addr is not None}
  if len(starts) != 3:
    b.steps.append("CP not set up: the PFP/ME/MEC files are not RS64 (gfx v2) files; the F32 CP set-up is not implemented")
  elif (line := gfx.config_rs64(regs, gc, starts)) is None:
    b.steps.append(f"CP not set up: the RS64 CP set-up for GC {gc.version_str} is not implemented (plugrt sets up GC 11 and 12)")
  else:
    b.steps.append(line)
    b.cp_ready = True
  enable_gfxhub(regs, b, gc, timeout)


def enable_gfxhub(regs: GPURegisters, b: BringUp, gc: discovery.IPBlock, timeout: float) -> None:
  """gfx_v11_0/v12_0_gfxhub_enable after the CP set-up, with the MMHUB's layout; a GC whose GFXHUB plugrt lacks is recorded."""
  if b.gmc_layout is None: return
  try: line = gmc.enable_gfxhub(regs, gc.version, gc.bases[0], b.gmc_layout, b.hdp_flush, timeout)
  except gmc.GMCUnsupported as e: b.steps.append(f"GFXHUB not set up: {e}")
  else:
    b.steps.append(line)
    b.gfxhub = True
    start_compute(regs, b, timeout)


def start_compute(regs: GPURegisters, b: BringUp, timeout: float) -> None:
  """After the GFXHUB: golden registers, compute VMIDs, doorbells, VMID 8's page tables and the MEC queue (compute)."""
  assert b.table is not None
  b.compute, steps = compute.start(regs, b.table, b.mc_base, b.phys_base, b.heap_at, b.vram_size, b.hdp_flush, timeout)
  b.steps += steps


def start_smu(regs: GPURegisters, b: BringUp, timeout: float) -> None:
  """After the PSP loaded the SMU: its ready flag and first messages (recorded; a version plugrt lacks is recorded too)."""
  mp1 = b.table.find("MP1") if b.table else None
  if mp1 is None:
    b.steps.append("no MP1 (SMU) block in IP discovery: SMU not started")
    return
  try: s = smu.SMU(regs, mp1, timeout)
  except smu.SMUUnsupported as e:
    b.steps.append(f"SMU not started: {e.message}")
    return
  b.steps += s.start()
  b.smu_started = True


def bring_up(regs: GPURegisters, label: str, firmware_dir: str = firmware.FIRMWARE_DIR, psp_timeout: float = 2.0,
             staging: USBStaging | None = None) -> BringUp:
  """Run the implemented steps; returns the record (call `.stop()` to raise where bring-up stops). `staging` is
  where an interface without bulk VRAM writes puts the PSP's buffers (the USB bridge's SRAM, mapped in the GART)."""
  b = BringUp(label)
  b.vram_size = regs.vram_size()
  b.steps.append(f"VRAM {b.vram_size >> 20} MiB (RCC_CONFIG_MEMSIZE)")
  b.table, b.source = read_discovery(regs, b.vram_size, firmware_dir)
  t = b.table
  gc = f" ({t.gc.num_se} SE, wave{t.gc.wave_size})" if t.gc else ""
  b.steps.append(f"IP discovery read from {b.source}: {t.summary()}{gc}, {len(t.blocks)} IP blocks")
  if (nbio := t.find("NBIF")) is not None:
    regs.use_nbio(nbio.version, nbio.bases)
    b.steps.append(f"NBIO {nbio.version_str} index/data pair at dwords 0x{regs.smn_pair[0]:x}/0x{regs.smn_pair[1]:x}")
  b.firmware, line = firmware.report(t, firmware_dir)
  b.steps.append(line)
  boot_psp(regs, b, psp_timeout, staging=staging)
  return b
