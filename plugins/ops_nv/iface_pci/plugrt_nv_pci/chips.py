"""NVIDIA GPU generations the PCI interface knows, as data: which PCI device ids belong to which generation (for the
probe, which reads only sysfs), which chips a generation's NV_PMC_BOOT_42 names (read once the BARs are mapped),
where the chip's GSP firmware lives in linux-firmware, how it boots and which GPU-MMU format it has.

A new chip is a line in `CHIPS`; a new generation an entry in `GENERATIONS`. Sources (docs/research/nv-pci.md):
BOOT_42's fields and architecture codes from open-gpu-kernel-modules' nv_ref.h; the device-id ranges from the
generations' released product ids (open-gpu-kernel-modules' g_nv_name_released.h) and tinygrad's PCI device list;
the firmware folders and names from linux-firmware's WHENCE (nvidia/<chip>/gsp/*-570.144.bin).
"""
from __future__ import annotations

from dataclasses import dataclass

#: the GSP-RM release whose firmware files (and so whose RPC and RM structure layouts) this interface speaks: the
#: firmware has no stable ABI, so the layouts in plugrt_nv_pci are those of open-gpu-kernel-modules tag 570.144
GSP_VERSION = "570.144"
NVIDIA_VENDOR = 0x10DE
DISPLAY_CLASS = 0x03  # PCI base class "display controller" (VGA 0x0300, 3D 0x0302)

# NV_PMC_BOOT_42 (BAR0 + 0xA00): ARCHITECTURE 29:24, IMPLEMENTATION 23:20 (nv_ref.h)
BOOT_0, BOOT_42 = 0x000000, 0x000A00


@dataclass(frozen=True)
class Generation:
  name: str                      # the family name plugrt_nv.hw uses for its classes (Ampere, Ada, Blackwell, Hopper)
  chips: str                     # what NVIDIA calls the chips ("GA10x")
  architecture: int              # NV_PMC_BOOT_42_ARCHITECTURE
  device_prefixes: tuple[int, ...]  # PCI device id >> 8 of this generation's products
  boot: str                      # "booter": FWSEC-FRTS from the VBIOS, then the booter on SEC2; "fsp": the FSP boots the FMC
  mmu: int                       # GPU-MMU page table format (2: five levels, 49-bit VA; 3: six levels, 57-bit VA)
  supported: bool                # in the seeds' PCI list (tinygrad's driver runs it); Hopper is not
  why_not: str = ""


GENERATIONS = (
  Generation("Ampere", "GA10x", 0x17, (0x22, 0x24, 0x25), boot="booter", mmu=2, supported=True),
  Generation("Ada", "AD10x", 0x19, (0x26, 0x27, 0x28), boot="booter", mmu=2, supported=True),
  Generation("Blackwell", "GB20x", 0x1B, (0x2B, 0x2C, 0x2D, 0x2F), boot="fsp", mmu=3, supported=True),
  Generation("Hopper", "GH100", 0x18, (0x23,), boot="fsp", mmu=3, supported=False,
             why_not="Hopper (GH100) is not in the seeds' PCI list: its driverless boot (FSP with chain of trust, MMU v3, "
                     "confidential-computing defaults) is not built here; use the NVK interface"),
)

#: (architecture, implementation) -> chip name; the firmware folder is its lower case (linux-firmware links the
#: chips of one generation to one set of files)
CHIPS = {(0x17, 2): "GA102", (0x17, 3): "GA103", (0x17, 4): "GA104", (0x17, 6): "GA106", (0x17, 7): "GA107",
         (0x19, 2): "AD102", (0x19, 3): "AD103", (0x19, 4): "AD104", (0x19, 6): "AD106", (0x19, 7): "AD107",
         (0x1B, 2): "GB202", (0x1B, 3): "GB203", (0x1B, 5): "GB205", (0x1B, 6): "GB206", (0x1B, 7): "GB207",
         (0x18, 0): "GH100"}


def generation_of_device(device_id: int) -> Generation | None:
  """The generation a PCI device id belongs to by its range (the probe's guess; BOOT_42 decides at open)."""
  return next((g for g in GENERATIONS if device_id >> 8 in g.device_prefixes), None)


def generation_of_arch(architecture: int) -> Generation | None:
  return next((g for g in GENERATIONS if g.architecture == architecture), None)


@dataclass(frozen=True)
class Chip:
  name: str           # "GA102"
  generation: Generation
  boot42: int

  @property
  def firmware_dir(self) -> str: return f"nvidia/{self.name.lower()}/gsp"

  @property
  def signature_section(self) -> str:
    """The ELF section of gsp-<version>.bin that holds this chip family's signature (.fwsignature_ga10x)."""
    return f".fwsignature_{self.name[:4].lower()}x"


def decode_boot42(boot42: int) -> Chip | None:
  """The chip NV_PMC_BOOT_42 names, when the table has it."""
  arch, impl = boot42 >> 24 & 0x3F, boot42 >> 20 & 0xF
  name, gen = CHIPS.get((arch, impl)), generation_of_arch(arch)
  return Chip(name, gen, boot42) if name and gen else None
