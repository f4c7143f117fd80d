"""The GPUs the NVIDIA kernel driver lists, and the order CUDA numbers them in, read without touching a GPU.

Both NVIDIA backends list their devices in their probes (`plugrt devices`) from /proc/driver/nvidia/gpus/<bus>/information:
the kernel driver writes the model, UUID, PCI location and device minor there for every GPU it bound. Reading it
opens no device node, loads no library and makes no ioctl, so it is cheaper than the driver API (cuInit alone takes
tens to hundreds of ms and creates driver state) and has no side effects, which a probe must not have. What it cannot say (free
memory, peer access) is asked when a device opens.

CUDA numbers GPUs fastest first by default (CUDA_DEVICE_ORDER=FASTEST_FIRST), breaking ties by PCI bus id, and
nvidia-smi numbers them by PCI bus id: on a machine of identical GPUs (every multi-GPU server plugrt runs on) both are
the PCI order, which is what `cuda_order` predicts; with mixed models it says the order is a guess unless
CUDA_DEVICE_ORDER=PCI_BUS_ID. CUDA_VISIBLE_DEVICES then picks and renumbers, as the driver does: indices into that
order, `GPU-<uuid prefix>` and `MIG-<uuid>` names; the first entry that names nothing ends the list (the driver ignores
the rest), and an empty value hides every GPU. plugrt-nv numbers GPUs in the kernel driver's order (device minor).
"""
from __future__ import annotations

import os
from typing import NamedTuple

PROC_GPUS = "/proc/driver/nvidia/gpus"


class DriverGPU(NamedTuple):
  model: str      # as the driver names it ("NVIDIA ...")
  bus_id: str     # "0000:18:00.0" (lower case, as the folder is named)
  uuid: str       # "GPU-5f2c...", "" where the driver hides it
  minor: int      # N of /dev/nvidiaN, -1 when not listed


class VisibleGPU(NamedTuple):
  """One GPU CUDA would see: its index in CUDA's numbering, the driver's GPU (None for a MIG instance, which
  the proc files do not list) and the CUDA_VISIBLE_DEVICES entry that picked it ("" when the variable is unset)."""
  index: int
  gpu: DriverGPU | None
  entry: str = ""


def driver_gpus(root: str | None = None) -> list[DriverGPU]:
  """Every GPU the kernel driver lists (under `root`, default PROC_GPUS), in PCI bus order; [] when the proc files are
  not there or not readable."""
  root = root or PROC_GPUS
  try: buses = sorted(os.listdir(root))
  except OSError: return []
  out = []
  for bus in buses:
    fields: dict[str, str] = {}
    try:
      with open(os.path.join(root, bus, "information"), encoding="utf-8", errors="replace") as f:
        for line in f:
          k, sep, v = line.partition(":")
          if sep: fields.setdefault(k.strip(), v.strip())
    except OSError: continue
    minor = fields.get("Device Minor", "")
    out.append(DriverGPU(fields.get("Model", "NVIDIA GPU"), fields.get("Bus Location", bus).lower(), fields.get("GPU UUID", ""),
                         int(minor) if minor.isdigit() else -1))
  return out


def present(gpus: list[DriverGPU], nodes: list[str]) -> list[DriverGPU]:
  """The GPUs whose device node this process has (`nodes`: /dev/nvidia0, ...). A container given some of a host's GPUs
  has only their nodes, and the drivers (CUDA's, and RM's GPU list that NV reads) skip or cannot open the others."""
  have = set(nodes)
  return [g for g in gpus if g.minor < 0 or f"/dev/nvidia{g.minor}" in have]


def by_minor(gpus: list[DriverGPU]) -> list[DriverGPU]:
  """The driver's own order (device minor; the order its card list gives plugrt-nv), PCI order for unlisted minors."""
  return sorted(gpus, key=lambda g: (g.minor < 0, g.minor))


def order_is_exact(gpus: list[DriverGPU], device_order: str | None) -> bool:
  """Whether the PCI order is CUDA's for certain: CUDA_DEVICE_ORDER=PCI_BUS_ID, or every GPU the same model."""
  return (device_order or "").strip().upper() == "PCI_BUS_ID" or len({g.model for g in gpus}) <= 1


def cuda_order(gpus: list[DriverGPU], visible: str | None, nodes: int | None = None) -> list[VisibleGPU]:
  """The GPUs CUDA would number 0, 1, ... given CUDA_VISIBLE_DEVICES=`visible` (None: unset). `gpus` is driver_gpus();
  where it is empty (no proc files) `nodes` GPUs of unknown model are assumed, so indices can still be checked."""
  base: list[DriverGPU | None] = list(gpus) if gpus else [None] * (nodes or 0)
  if visible is None: return [VisibleGPU(i, g) for i, g in enumerate(base)]
  out: list[VisibleGPU] = []
  used: set[int] = set()
  for raw in visible.split(","):
    entry = raw.strip()
    if entry.upper().startswith("MIG-"):
      out.append(VisibleGPU(len(out), None, entry))
      continue
    if not gpus and entry.upper().startswith("GPU-") and len(entry) > 4:  # no proc files to check it against: the driver will
      out.append(VisibleGPU(len(out), None, entry))
      continue
    pick = _pick(entry, gpus, len(base))
    if pick is None or pick in used: break  # the driver stops at the first entry that names nothing (or a repeat)
    used.add(pick)
    out.append(VisibleGPU(len(out), base[pick], entry))
  return out


def _pick(entry: str, gpus: list[DriverGPU], count: int) -> int | None:
  """The position in CUDA's base order that one CUDA_VISIBLE_DEVICES entry names, or None."""
  if entry.isdigit(): return int(entry) if int(entry) < count else None
  if entry.upper().startswith("GPU-") and len(entry) > 4:
    hits = [i for i, g in enumerate(gpus) if g.uuid.lower().startswith(entry.lower())]
    return hits[0] if len(hits) == 1 else None  # an ambiguous prefix names nothing, as for the driver
  return None
