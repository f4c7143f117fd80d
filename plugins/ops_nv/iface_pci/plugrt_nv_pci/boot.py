"""The GSP boot of a GA10x/AD10x GPU from user space, step by step (docs/research/nv-pci.md, "Boot sequence"), and the
parts GB20x's boot through the FSP (plugrt_nv_pci.boot_fsp) shares (arguments, queues, sequencer, GSP-RM's init):

1. identify: NV_PMC_BOOT_42 names the chip (chips.CHIPS); one plugrt does not know stops here.
2. GFW boot: the VBIOS's own boot (devinit) has finished: bit 0 of NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_PRIV_LEVEL_MASK
   and the low byte of NV_PGC6_AON_SECURE_SCRATCH_GROUP_05(0) = 0xFF (kgspWaitForGfwBootOk_TU102), bounded.
3. WPR2 is down: NV_PFB_PRI_MMU_WPR2_ADDR_HI = 0. Non-zero means a GSP already runs (the driver left it booted):
   it must be reset before a new boot, which plugrt refuses to do on its own.
4. VRAM: NV_USABLE_FB_SIZE_IN_MB (NV_PGC6_AON_SECURE_SCRATCH_GROUP_42) MiB.
5. firmware: gsp-, bootloader- and booter_load-570.144.bin from linux-firmware, parsed (firmware.py).
6. arguments in host memory the GSP reads by DMA (contiguous where it reads a range rather than pages): the message
   queues (msgq.py, the command queue's header written), GSP_ARGUMENTS_CACHED (the queues' page table address and
   offsets), the LibOS memory regions (log buffers, RMARGS), GSP-RM's image behind a radix-3 page table, its
   signature, the bootloader, and GspFwWprMeta with the VRAM layout of kgspCalculateFbLayout_TU102; then
   GSP_SET_SYSTEM_INFO (the BARs' bus addresses, the function's PCI ids) and SET_REGISTRY queued in the command queue,
   which GSP-RM reads at its init.
7. FWSEC-FRTS: the FWSEC ucode from the VBIOS (vbios.py), patched with the FRTS command and the signature for the
   fused ucode version, run in heavy-secure mode on the GSP's falcon from VRAM; afterwards WPR2 is up and
   NV_PBUS_VBIOS_SCRATCH(0x0E) holds no FRTS error.
8. GSP-RM: the GSP reset into RISC-V with the LibOS arguments in its mailboxes; booter_load on SEC2 with the WPR
   metadata's address in its mailboxes (mailbox 0 = 0 on success); NV_PFALCON_FALCON_OS = 0; the RISC-V core active;
   then the status queue, GSP_RUN_CPU_SEQUENCER events run by the CPU, and GSP_INIT_DONE (`start_gsp`).
9. BAR1 in physical mode (NV_PBUS_BAR1_BLOCK = 0: BAR1 offset = VRAM address), which GSP-RM's init changed.
`bring_up` returns the queues and the VRAM layout; the RM objects, page tables and channels are plugrt_nv_pci.gpu's.
Afterwards `unload` stops GSP-RM (UNLOADING_GUEST_DRIVER); the caller resets the function before binding the driver
back, since WPR2 stays up.
"""
from __future__ import annotations

import ctypes
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from plugrt.errors import DeviceUnavailable, Reason
from plugrt_nv_pci import firmware, msgq, rpc, vbios
from plugrt_nv_pci.chips import BOOT_42, GSP_VERSION, Chip, decode_boot42
from plugrt_nv_pci.dma import PAGE, DMAAllocator, DMABuffer
from plugrt_nv_pci.errors import GSPError, RPCError
from plugrt_nv_pci.falcon import (
  GSP_BASE,
  GSP_ENGINE,
  MMIO,
  OS,
  RISCV_CPUCTL,
  RISCV_CPUCTL_ACTIVE_STAT,
  RISCV_OFFSET,
  SEC2_BASE,
  SEC2_ENGINE,
  Falcon,
  wait_for,
)

SCRATCH_05_PRIV_LEVEL_MASK, SCRATCH_05_0, SCRATCH_42 = 0x118128, 0x118234, 0x1183A4  # dev_gc6_island.h (GA102)
WPR2_ADDR_HI = 0x1FA828                                                                # NV_PFB_PRI_MMU_WPR2_ADDR_HI (dev_fb.h)
GSP_MAILBOX0, GSP_MAILBOX1 = 0x110040, 0x110044                                        # NV_PGSP_FALCON_MAILBOX0/1 (dev_gsp.h)
BSI_SECURE_SCRATCH_14, BOOT_STAGE_3_HANDOFF = 0x1180F8, 1 << 26                         # dev_gc6_island.h: SEC2's hand-off after a resume
BAR1_BLOCK = 0x1704                        # NV_PBUS_BAR1_BLOCK (dev_bus.h): mode 31:31 (0 physical), target 29:28, ptr 27:0
MB = 1 << 20
PRAMIN_SIZE = MB                              # DRF_SIZE(NV_PRAMIN): the VGA workspace when the display's is not known
FRTS_SIZE, NON_WPR_HEAP_SIZE = MB, MB         # kgspGetFrtsSize_TU102, kgspGetNonWprHeapSize (GA10x/AD10x)
# the GSP-RM heap (gsp_fw_heap.h): LibOS 3's carveout, RM's base on Turing to Ada, per GiB of VRAM, 2048 channels' clients, minimum
HEAP_OS, HEAP_BASE, HEAP_PER_GB, HEAP_CLIENTS, HEAP_MIN = 22 << 20, 8 << 20, 96 << 10, (48 << 10) * 2048, 88 << 20
WPR_META_MAGIC, WPR_META_REVISION = 0xDC3AAE21371A60B3, 1
LOG_REGIONS = ("LOGINIT", "LOGINTR", "LOGRM")  # LibOS log buffers the kernel driver gives GSP-RM (kgspInitLogging)
LOG_SIZE = 0x10000
# LibOS region kinds and locations (libos_init_args.h)
REGION_CONTIGUOUS, LOC_SYSMEM = 1, 1
# booter_load's boot-ROM parameters (kernel_gsp_booter_tu102.c: the signature's offset in DMEM, SEC2's engine id mask, ucode id)
BOOTER_PKC_OFFSET, BOOTER_ENGINE_MASK, BOOTER_UCODE_ID = 0x10, 1, 3
# GSP_RUN_CPU_SEQUENCER opcodes (rmgspseq.h) and their argument counts
SEQ_ARGS = {0: 2, 1: 3, 2: 5, 3: 1, 4: 2, 5: 0, 6: 0, 7: 0, 8: 0}
SEQ_NAMES = ("REG_WRITE", "REG_MODIFY", "REG_POLL", "DELAY_US", "REG_STORE", "CORE_RESET", "CORE_START", "CORE_WAIT_FOR_HALT", "CORE_RESUME")

u8, u32, u64 = ctypes.c_uint8, ctypes.c_uint32, ctypes.c_uint64


class GspFwWprMeta(ctypes.LittleEndianStructure):
  """gsp_fw_wpr_meta.h (570.144): 256 bytes."""
  _fields_ = [(n, u64) for n in ("magic", "revision", "sysmemAddrOfRadix3Elf", "sizeOfRadix3Elf", "sysmemAddrOfBootloader", "sizeOfBootloader",
                                 "bootloaderCodeOffset", "bootloaderDataOffset", "bootloaderManifestOffset", "sysmemAddrOfSignature",
                                 "sizeOfSignature", "gspFwRsvdStart", "nonWprHeapOffset", "nonWprHeapSize", "gspFwWprStart", "gspFwHeapOffset",
                                 "gspFwHeapSize", "gspFwOffset", "bootBinOffset", "frtsOffset", "frtsSize", "gspFwWprEnd", "fbSize",
                                 "vgaWorkspaceOffset", "vgaWorkspaceSize", "bootCount", "partitionRpcAddr")] + [
    ("partitionRpcRequestOffset", ctypes.c_uint16), ("partitionRpcReplyOffset", ctypes.c_uint16),
    *[(n, u32) for n in ("elfCodeOffset", "elfDataOffset", "elfCodeSize", "elfDataSize", "lsUcodeVersion")],
    ("gspFwHeapVfPartitionCount", u8), ("flags", u8), ("padding", u8 * 2), ("pmuReservedSize", u32), ("verified", u64)]


class MessageQueueInitArguments(ctypes.LittleEndianStructure):
  _fields_ = [("sharedMemPhysAddr", u64), ("pageTableEntryCount", u32), ("cmdQueueOffset", u64), ("statQueueOffset", u64)]


class GspArgumentsCached(ctypes.LittleEndianStructure):
  """gsp_init_args.h: what GSP-RM reads from its RMARGS region."""
  _fields_ = [("messageQueueInitArguments", MessageQueueInitArguments), ("oldLevel", u32), ("srFlags", u32), ("bInPMTransition", u8),
              ("gpuInstance", u32), ("bDmemStack", u8), ("profilerPa", u64), ("profilerSize", u64)]


class LibosMemoryRegionInitArgument(ctypes.LittleEndianStructure):
  _fields_ = [("id8", u64), ("pa", u64), ("size", u64), ("kind", u8), ("loc", u8)]


assert ctypes.sizeof(GspFwWprMeta) == 256 and ctypes.sizeof(LibosMemoryRegionInitArgument) == 32
assert ctypes.sizeof(MessageQueueInitArguments) == 32 and ctypes.sizeof(GspArgumentsCached) == 72


def id8(name: str) -> int: return int.from_bytes(name.encode(), "big")


@dataclass
class Record:
  """What the boot did so far, for the message of whatever stops it."""
  label: str
  steps: list[str] = field(default_factory=list)
  chip: Chip | None = None
  vram: int = 0

  def done(self, what: str) -> None: self.steps.append(what)
  def so_far(self) -> str: return "; ".join(self.steps) or "nothing"


def identify(regs: MMIO, rec: Record) -> Chip:
  boot42 = regs.read32(BOOT_42)
  chip = decode_boot42(boot42)
  if chip is None:
    raise DeviceUnavailable(f"{rec.label}: NV_PMC_BOOT_42 = {boot42:#010x} names a chip plugrt-nv-pci does not know "
                            f"(architecture {boot42 >> 24 & 0x3F:#x}, implementation {boot42 >> 20 & 0xF})", Reason.NO_DEVICE,
                            "use the NVK interface; plugrt_nv_pci/chips.py lists the chips of the PCI interface")
  if not chip.generation.supported:
    raise DeviceUnavailable(f"{rec.label}: {chip.name}: {chip.generation.why_not}", Reason.NO_DEVICE, "NV_IFACE=NVK")
  rec.chip = chip
  rec.done(f"chip {chip.name} ({chip.generation.name}, NV_PMC_BOOT_42 {boot42:#010x})")
  return chip


def preboot_checks(regs: MMIO, rec: Record, timeout: float) -> int:
  """Steps 2-4: the VBIOS's boot done, no GSP running, the VRAM size; returns the VRAM size in bytes."""
  step = "waiting for the VBIOS's boot (GFW) to finish"
  wait_for(regs, SCRATCH_05_PRIV_LEVEL_MASK, lambda v: bool(v & 1), step, "read access to the GFW boot scratch", timeout)
  wait_for(regs, SCRATCH_05_0, lambda v: v & 0xFF == 0xFF, step, "the GFW boot-complete mark", timeout)
  rec.done("GFW boot complete")
  if (hi := regs.read32(WPR2_ADDR_HI)):
    raise GSPError(f"{rec.label}: a GSP already runs on this GPU (WPR2 is up: NV_PFB_PRI_MMU_WPR2_ADDR_HI = {hi:#x}); plugrt boots the GSP only "
                   "from a reset GPU", "reset the function first (echo 1 | sudo tee /sys/bus/pci/devices/<address>/reset) and retry",
                   step="checking that no GSP runs")
  rec.done("WPR2 down")
  mib = regs.read32(SCRATCH_42)
  if not mib: raise GSPError(f"{rec.label}: NV_USABLE_FB_SIZE_IN_MB reads 0: the VBIOS did not size the VRAM", step="reading the VRAM size")
  rec.vram = mib * MB
  rec.done(f"{mib} MiB of VRAM")
  return rec.vram


@dataclass
class Firmware:
  gsp_image: bytes
  signature: bytes
  bootloader_desc: firmware.RiscvUcodeDesc
  bootloader: bytes
  booter: firmware.Booter | None = None   # the booter flow's (GA10x, AD10x)
  fmc: firmware.Fmc | None = None         # the FSP flow's (GB20x)


#: what GB20x's FSP takes of the FMC file (NVDM_PAYLOAD_COT version 2: a SHA-384 hash, a 96-byte signature, a 97-byte key)
FMC_SIZES = {"hash": 48, "signature": 96, "publickey": 97}


def load_firmware(root: str, chip: Chip, rec: Record) -> Firmware:
  files = {name: firmware.read_file(root, chip, name, what) for name, what in firmware.needed(chip)}
  gsp_path = firmware.path_of(root, chip, "gsp")
  sections = firmware.elf_sections(files["gsp"], gsp_path)
  desc, bl = firmware.bootloader(files["bootloader"], firmware.path_of(root, chip, "bootloader"))
  fw = Firmware(firmware.section(sections, ".fwimage", gsp_path), firmware.section(sections, chip.signature_section, gsp_path), desc, bl)
  if "booter_load" in files: fw.booter = firmware.booter(files["booter_load"], firmware.path_of(root, chip, "booter_load"))
  if "fmc" in files: fw.fmc = firmware.fmc(files["fmc"], firmware.path_of(root, chip, "fmc"), FMC_SIZES)
  rec.done(f"firmware {GSP_VERSION} read ({len(fw.gsp_image) >> 20} MiB GSP-RM image)")
  return fw


def wpr_layout(vram: int, bootloader_size: int, image_size: int) -> GspFwWprMeta:
  """The VRAM layout GSP-RM and the booter agree on (kgspCalculateFbLayout_TU102), from the top of VRAM down."""
  def down(x: int, a: int) -> int: return x // a * a
  m = GspFwWprMeta(magic=WPR_META_MAGIC, revision=WPR_META_REVISION, fbSize=vram)
  m.vgaWorkspaceOffset = vram - PRAMIN_SIZE
  m.vgaWorkspaceSize = vram - m.vgaWorkspaceOffset
  m.gspFwWprEnd = down(m.vgaWorkspaceOffset, 0x20000)
  m.frtsSize, m.frtsOffset = FRTS_SIZE, m.gspFwWprEnd - FRTS_SIZE
  m.sizeOfBootloader, m.bootBinOffset = bootloader_size, down(m.frtsOffset - bootloader_size, 0x1000)
  m.sizeOfRadix3Elf, m.gspFwOffset = image_size, down(m.bootBinOffset - image_size, 0x10000)
  gib = -(-vram // (1 << 30))
  heap = max(HEAP_OS + HEAP_BASE + -(-HEAP_PER_GB * gib // MB) * MB + -(-HEAP_CLIENTS // MB) * MB, HEAP_MIN)
  m.gspFwHeapOffset = down(m.gspFwOffset - heap, MB)
  m.gspFwHeapSize = down(m.gspFwOffset - m.gspFwHeapOffset, MB)
  m.gspFwWprStart = m.gspFwHeapOffset - MB  # the WPR metadata's own megabyte
  m.nonWprHeapSize = NON_WPR_HEAP_SIZE
  m.nonWprHeapOffset = m.gspFwWprStart - m.nonWprHeapSize
  m.gspFwRsvdStart = m.nonWprHeapOffset
  return m


@dataclass
class GSPArgs:
  """Everything the boot hands the GSP in host memory."""
  queues: DMABuffer
  queue_ptes: int
  rm_args: DMABuffer
  libos: DMABuffer
  logs: DMABuffer
  radix3: DMABuffer
  signature: DMABuffer
  bootloader: DMABuffer
  wpr_meta: DMABuffer
  meta: GspFwWprMeta

  @property
  def cmd_queue(self) -> int: return self.queues.cpu + _pt_size(self.queue_ptes)
  @property
  def stat_queue(self) -> int: return self.cmd_queue + msgq.QUEUE_SIZE


def _pt_size(ptes: int) -> int: return -(-ptes * 8 // PAGE) * PAGE


def queue_page_table_entries() -> int:
  """_getMsgQueueParams: one entry per page of both queues, plus the pages of the table itself."""
  n = 2 * msgq.QUEUE_SIZE // PAGE
  return n + -(-n * 8 // PAGE)


def radix3(dma: DMAAllocator, image: bytes) -> DMABuffer:
  """GSP-RM's image behind a three-level table of bus addresses (LIBOS_MEMORY_REGION_RADIX3, 4 KiB pages): level 0 is one
  page pointing at level 1's pages, and so on down to the image's pages, which follow the tables in the buffer."""
  pages = [0, 0, 0, -(-len(image) // PAGE)]
  for i in (3, 2, 1): pages[i - 1] = (pages[i] - 1 >> 9) + 1
  buf = dma.alloc(sum(pages) * PAGE)
  first = [sum(pages[:i]) for i in range(4)]
  buf.write(first[3] * PAGE, image)
  for level in range(3):  # level i's entries: the bus addresses of level i+1's pages
    targets = buf.pages[first[level + 1]:first[level + 1] + pages[level + 1]]
    buf.write(first[level] * PAGE, struct.pack(f"<{len(targets)}Q", *targets))
  return buf


def build_args(dma: DMAAllocator, fw: Firmware, vram: int, rec: Record,
               layout: Callable[[int, int, int], GspFwWprMeta] = lambda v, b, i: wpr_layout(v, b, i)) -> GSPArgs:
  """Step 6: the queues, GSP-RM's and LibOS's arguments, the images and the WPR metadata, in host memory. `layout`
  makes the WPR metadata from (VRAM size, bootloader size, image size): the booter flow's full layout by default."""
  ptes = queue_page_table_entries()
  queues = dma.alloc(_pt_size(ptes) + 2 * msgq.QUEUE_SIZE)
  queues.write(0, struct.pack(f"<{ptes}Q", *queues.pages[:ptes]))
  queues.write(_pt_size(ptes), msgq.tx_header())  # the command queue exists before the GSP starts (GspMsgQueuesInit)
  cached = GspArgumentsCached(bDmemStack=1)
  cached.messageQueueInitArguments = MessageQueueInitArguments(queues.bus(0), ptes, _pt_size(ptes), _pt_size(ptes) + msgq.QUEUE_SIZE)
  rm_args = dma.alloc(PAGE)
  rm_args.write(0, bytes(cached))
  logs = dma.alloc(LOG_SIZE * len(LOG_REGIONS), contiguous=True)
  regions = [LibosMemoryRegionInitArgument(id8(n), logs.bus(i * LOG_SIZE), LOG_SIZE, REGION_CONTIGUOUS, LOC_SYSMEM)
             for i, n in enumerate(LOG_REGIONS)]
  regions.append(LibosMemoryRegionInitArgument(id8("RMARGS"), rm_args.bus(0), PAGE, REGION_CONTIGUOUS, LOC_SYSMEM))
  libos = dma.alloc(PAGE)
  libos.write(0, b"".join(bytes(r) for r in regions))
  image = radix3(dma, fw.gsp_image)
  sig = dma.alloc(len(fw.signature), contiguous=True)
  sig.write(0, fw.signature)
  bl = dma.alloc(len(fw.bootloader), contiguous=True)
  bl.write(0, fw.bootloader)
  meta = layout(vram, len(fw.bootloader), len(fw.gsp_image))
  meta.sysmemAddrOfRadix3Elf, meta.sysmemAddrOfBootloader, meta.sysmemAddrOfSignature = image.bus(0), bl.bus(0), sig.bus(0)
  meta.sizeOfSignature = len(fw.signature)
  d = fw.bootloader_desc
  meta.bootloaderCodeOffset, meta.bootloaderDataOffset, meta.bootloaderManifestOffset = d.monitorCodeOffset, d.monitorDataOffset, d.manifestOffset
  wpr = dma.alloc(PAGE)
  wpr.write(0, bytes(meta))
  rec.done(f"GSP arguments in host memory (WPR {meta.gspFwWprStart >> 20}-{meta.gspFwWprEnd >> 20} MiB)" if meta.gspFwWprEnd else
           "GSP arguments in host memory (WPR sizes for the FMC to lay out)")
  return GSPArgs(queues, ptes, rm_args, libos, logs, image, sig, bl, wpr, meta)


class Sequencer:
  """Runs GSP_RUN_CPU_SEQUENCER buffers: register writes, modifies, bounded polls, delays, stores, and the GSP core's
  reset, start, halt wait and resume (kgspExecuteSequencerBuffer in kernel_gsp.c)."""

  def __init__(self, regs: MMIO, gsp: Falcon, sec2: Falcon, libos_bus: int, timeout: float):
    self.regs, self.gsp, self.sec2, self.libos_bus, self.timeout = regs, gsp, sec2, libos_bus, timeout
    self.ran: list[str] = []

  def run(self, payload: bytes) -> None:
    if len(payload) < 40: raise GSPError(f"a CPU sequencer message of {len(payload)} bytes is shorter than its header", step="CPU sequencer")
    _, count = struct.unpack_from("<II", payload)  # bufferSizeDWord, cmdIndex (rpc_run_cpu_sequencer_v17_00)
    words = struct.unpack_from(f"<{min(count, (len(payload) - 40) // 4)}I", payload, 40)
    if count * 4 > len(payload) - 40: raise GSPError(f"a CPU sequencer buffer says {count} words but carries {len(words)}", step="CPU sequencer")
    i = 0
    while i < len(words):
      op = words[i]
      if op not in SEQ_ARGS: raise GSPError(f"the GSP's CPU sequencer sent opcode {op}, which plugrt does not know", step="CPU sequencer")
      args = words[i + 1:i + 1 + SEQ_ARGS[op]]
      if len(args) < SEQ_ARGS[op]: raise GSPError(f"the CPU sequencer's {SEQ_NAMES[op]} is cut short", step="CPU sequencer")
      self.op(op, args)
      self.ran.append(SEQ_NAMES[op])
      i += 1 + SEQ_ARGS[op]

  def op(self, op: int, a: tuple[int, ...]) -> None:
    r = self.regs
    if op == 0: r.write32(a[0], a[1])
    elif op == 1: r.write32(a[0], r.read32(a[0]) & ~a[1] | a[2] & a[1])
    elif op == 2:
      wait_for(r, a[0], lambda v: v & a[1] == a[2], "CPU sequencer", f"register {a[0]:#x} to read {a[2]:#x} under mask {a[1]:#x} "
               f"(GSP sequencer error {a[4]})", min(self.timeout, a[3] / 1000 if a[3] else self.timeout))
    elif op == 3: time.sleep(min(a[0], 1_000_000) / 1e6)
    elif op == 4: pass  # REG_STORE: the value goes to the sequencer's save area, which plugrt does not send back
    elif op == 5: self.gsp.reset(riscv=False, step="CPU sequencer: core reset")
    elif op == 6: self.gsp.start()
    elif op == 7: self.gsp.wait(0x100, lambda v: bool(v & 0x10), "CPU sequencer", "the GSP core to halt")
    elif op == 8:
      self.gsp.reset(riscv=True, step="CPU sequencer: core resume")
      r.write32(GSP_MAILBOX0, self.libos_bus & 0xFFFFFFFF)
      r.write32(GSP_MAILBOX1, self.libos_bus >> 32)
      self.sec2.start()
      wait_for(r, BSI_SECURE_SCRATCH_14, lambda v: bool(v & BOOT_STAGE_3_HANDOFF), "CPU sequencer: core resume", "SEC2's hand-off",
               self.timeout)
      if (mb := self.sec2.r(0x40)): raise GSPError(f"SEC2 failed to resume the GSP: mailbox 0 = {mb:#x}", step="CPU sequencer: core resume")


@dataclass
class Starting:
  """GSP-RM's queues before it runs: the messages queued for its init, the CPU sequencer that will answer its requests
  and the error logs it sent."""
  queues: msgq.GSPQueues
  sequencer: list[Sequencer]
  errors: list[str]


def open_queues(regs: MMIO, args: GSPArgs, rec: Record, timeout: float, before: tuple[tuple[int, bytes], ...]) -> Starting:
  """The queues in host memory with `before` ((function, payload) messages for GSP-RM's init) queued; events that come
  while waiting for GSP_INIT_DONE go to the sequencer (set by the caller) and the error log."""
  seq_box: list[Sequencer] = []
  errors: list[str] = []

  def event(m: msgq.Message) -> None:
    if m.function == msgq.Function.GSP_RUN_CPU_SEQUENCER: seq_box[0].run(m.payload)
    elif m.function == msgq.Function.OS_ERROR_LOG: errors.append(m.payload[16:16 + 0x100].split(b"\0")[0].decode(errors="replace"))
  q = msgq.GSPQueues(args.cmd_queue, args.stat_queue, lambda v: regs.write32(msgq.PGSP_QUEUE_HEAD0, v), timeout, event)
  for function, payload in before: q.send(function, payload, f"queueing {msgq.name_of(function)} for GSP-RM's init")
  if before: rec.done(f"{' and '.join(msgq.name_of(f) for f, _ in before)} queued")
  return Starting(q, seq_box, errors)


def await_init(s: Starting, seq: Sequencer, rec: Record) -> msgq.GSPQueues:
  """GSP-RM running: link its status queue, run its sequencer requests until GSP_INIT_DONE (a timeout carries the
  error log GSP-RM sent)."""
  s.sequencer.append(seq)
  q = s.queues
  q.link(step="waiting for GSP-RM's status queue")
  try: q.wait(msgq.Function.GSP_INIT_DONE, step="waiting for GSP_INIT_DONE")
  except GSPError as e:
    if not s.errors: raise
    log = " | ".join(s.errors)
    raise GSPError(f"{e.message}; GSP-RM's error log: {log}", e.hint, step=e.step, reason=f"{e.reason}; the GSP's error log: {log}",
                   timed_out=e.timed_out) from None
  rec.done(f"GSP-RM up (CPU sequencer ran {len(seq.ran)} commands)")
  return q


def start_gsp(regs: MMIO, vram_write: Callable[[int, bytes], None], args: GSPArgs, fw: Firmware, rec: Record, timeout: float,
              booter_at: int, before: tuple[tuple[int, bytes], ...] = ()) -> msgq.GSPQueues:
  """Step 8: booter_load on SEC2 starts GSP-RM; the CPU then runs the GSP's sequencer requests until GSP_INIT_DONE.
  `booter_at`: where in VRAM the booter image is put for SEC2's DMA (below the WPR region); `vram_write` writes VRAM
  through BAR1; `before`: (function, payload) messages queued for GSP-RM's init before it starts. Returns the queues,
  linked and ready for RPCs."""
  gsp, sec2 = Falcon(regs, GSP_BASE, GSP_ENGINE, "GSP", timeout), Falcon(regs, SEC2_BASE, SEC2_ENGINE, "SEC2", timeout)
  starting = open_queues(regs, args, rec, timeout, before)
  gsp.reset(riscv=True, step="resetting the GSP into RISC-V")
  libos = args.libos.bus(0)
  regs.write32(GSP_MAILBOX0, libos & 0xFFFFFFFF)
  regs.write32(GSP_MAILBOX1, libos >> 32)
  rec.done("GSP reset into RISC-V, LibOS arguments in its mailboxes")
  b = fw.booter
  assert b is not None, "the booter flow needs booter_load"
  vram_write(booter_at, b.image)
  sec2.reset(riscv=False, step="resetting SEC2 for the booter")
  mb0, mb1 = sec2.run_hs(booter_at, (b.code_offset, 0, b.code_size), (b.data_offset, 0, b.data_size), b.code_offset, BOOTER_PKC_OFFSET,
                         BOOTER_ENGINE_MASK, BOOTER_UCODE_ID, args.wpr_meta.bus(0), step="running booter_load on SEC2")
  if mb0: raise GSPError(f"booter_load failed on SEC2: mailbox 0 = {mb0:#x}, mailbox 1 = {mb1:#x}", "the firmware does not match this GPU, or "
                         "WPR2 was not set up (FWSEC-FRTS); reset the GPU", step="running booter_load on SEC2", reason=f"mailbox {mb0:#x} {mb1:#x}")
  rec.done("booter_load ran on SEC2")
  gsp.w(OS, 0)
  if not gsp.r(RISCV_OFFSET + RISCV_CPUCTL) & RISCV_CPUCTL_ACTIVE_STAT:
    raise GSPError("the GSP's RISC-V core is not active after the booter", step="starting GSP-RM")
  return await_init(starting, Sequencer(regs, gsp, sec2, libos, timeout), rec)


FWSEC_AT, BOOTER_AT = 1 << 20, 4 << 20   # where in VRAM the heavy-secure images go for the falcons' DMA (far below the WPR region)
UNLOAD_FAST = 1 << 6                      # __GPU_STATE_FLAGS_FAST_UNLOAD, the newLevel of UNLOADING_GUEST_DRIVER


def run_fwsec(regs: MMIO, vram_write: Callable[[int, bytes], None], meta: GspFwWprMeta, rec: Record, timeout: float) -> None:
  """Step 7: FWSEC-FRTS on the GSP's falcon; WPR2 up afterwards, or a GSPError with FWSEC's error code."""
  fw = vbios.find_fwsec(regs)
  sig = vbios.signature_for(fw, regs.read32(vbios.FUSE_GSP_UCODE1_VERSION + 4 * (fw.ucode_id - 1)))
  image = vbios.patch_frts(fw, meta.frtsOffset, sig)
  vram_write(FWSEC_AT, image)
  gsp = Falcon(regs, GSP_BASE, GSP_ENGINE, "GSP", timeout)
  step = "running FWSEC-FRTS on the GSP's falcon"
  gsp.reset(riscv=False, step=step)
  gsp.run_hs(FWSEC_AT, (0, fw.imem_pa, fw.imem_size), (fw.imem_size, fw.dmem_pa, fw.dmem_size), fw.imem_va, fw.pkc_offset, fw.engine_mask,
             fw.ucode_id, None, step)
  err = regs.read32(vbios.VBIOS_SCRATCH_0E) >> 16
  if err or not regs.read32(WPR2_ADDR_HI):
    raise GSPError(f"FWSEC-FRTS did not set up WPR2 (FRTS error code {err:#x}, WPR2_ADDR_HI {regs.read32(WPR2_ADDR_HI):#x})",
                   "reset the GPU and retry; a VBIOS plugrt does not know may need the NVIDIA driver", step=step, reason=f"FRTS error {err:#x}")
  rec.done(f"FWSEC-FRTS ran (ucode {fw.ucode_id}, FRTS at {meta.frtsOffset >> 20} MiB), WPR2 up")


@dataclass
class Booted:
  """GSP-RM up: its queues, the VRAM layout (memory below meta.gspFwRsvdStart is the client's), the chip, the record."""
  queues: msgq.GSPQueues
  meta: GspFwWprMeta
  chip: Chip
  rec: Record


def init_messages(system_info: bytes) -> tuple[tuple[int, bytes], ...]:
  """What GSP-RM's init reads from the command queue: GSP_SET_SYSTEM_INFO (rpc.system_info), then SET_REGISTRY."""
  return ((msgq.Function.GSP_SET_SYSTEM_INFO, system_info), (msgq.Function.SET_REGISTRY, rpc.registry_table()))


def bring_up(regs: MMIO, vram_write: Callable[[int, bytes], None], dma: DMAAllocator, firmware_root: str, rec: Record, chip: Chip,
             timeout: float, system_info: bytes, started: Callable[[], None] = lambda: None) -> Booted:
  """Steps 2-9 on an identified GA10x/AD10x. `started()` is called once the GPU's state was changed (FWSEC ran), after
  which only a reset of the function returns it to what the driver expects. `system_info`: the GSP_SET_SYSTEM_INFO
  payload (rpc.system_info)."""
  vram = preboot_checks(regs, rec, timeout)
  fw = load_firmware(firmware_root, chip, rec)
  args = build_args(dma, fw, vram, rec)
  started()
  run_fwsec(regs, vram_write, args.meta, rec, timeout)
  q = start_gsp(regs, vram_write, args, fw, rec, timeout, BOOTER_AT, before=init_messages(system_info))
  regs.write32(BAR1_BLOCK, 0)
  rec.done("BAR1 in physical mode")
  return Booted(q, args.meta, chip, rec)


def unload(q: msgq.GSPQueues) -> str:
  """Stop GSP-RM (UNLOADING_GUEST_DRIVER, fast unload); "" when it answered, else why not (the reset follows anyway)."""
  try: q.call(msgq.Function.UNLOADING_GUEST_DRIVER, struct.pack("<BBxxI", 0, 0, UNLOAD_FAST), "unloading GSP-RM")
  except (GSPError, RPCError) as e: return f"GSP-RM did not unload: {e.message}"
  return ""
