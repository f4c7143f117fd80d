"""HEVC on the NV device's own video decode engine: plugrt.video's decoder `NV_NVDEC` (device="NV"), with no
libnvcuvid and no libcuda.

Per stream: plugrt_nv.nvdec_setup walks the pictures in decode order (picture setup, slices, picture indices, output
order). Per picture, the setup block and the slices go into one of a few CPU-written buffers in GPU memory, and one
submission on the video channel (NVState.video_ring) points the engine at them, at the surfaces of the picture and
its references, at the collocated-motion-vector and filter buffers, runs EXECUTE and releases the device's timeline.
The engine writes block-linear pictures; when a picture leaves for display, a plugrt kernel (from plugrt's IR)
copies it into a pitch-linear NV12/P016 surface, which plugrt.video's conversion kernel reads. Every submission goes
through the device's one timeline, so the copy waits for the decode and a later decode into the same surface waits
for the copy. A picture's status (nvdec_status_s) is read when its setup buffer comes round again, and at the end.
"""
from __future__ import annotations

import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from plugrt.compiler.ir import Kernel, KernelBuilder
from plugrt.dtype import DType, dtypes
from plugrt.errors import Reason, VideoDecoderUnavailable, VideoStreamError
from plugrt.hwqueue import round_up
from plugrt.video.hevc import StreamInfo
from plugrt_nv import nvdec
from plugrt_nv.iface import Mem, NVError
from plugrt_nv.nvdec_setup import Decode, Output, Planner, check_sps

NAME = "NV_NVDEC"
SLOTS = 4                 # setup + bitstream buffers in flight
BITSTREAM_MIN = 1 << 20   # a slot's first bitstream room; grows to the largest picture
DETILE_GROUP = (16, 16, 1)  # the detile kernel's work-group
_KERNELS: dict[DType, Kernel] = {}


def detile_kernel(sample: DType) -> Kernel:
  """Block-linear picture (both planes) -> pitch-linear semi-planar surface, `sample` (uint8 or uint16) elements:
  out[y * pitch + x] for rows 0..height-1 (luma) then height..height+chroma_rows-1 (Cb/Cr), x < pitch."""
  if (k := _KERNELS.get(sample)) is not None: return k
  b = KernelBuilder(f"nvdec_detile_{sample.name}")
  dst, src = b.buffer("surface", sample), b.buffer("blocks", sample)
  i32 = dtypes.int32
  pitch, height, rows, src_pitch, chroma, log2_size = (b.scalar(n, i32) for n in ("pitch", "height", "rows", "src_pitch", "chroma", "log2_size"))
  x, y = b.global_id(0), b.global_id(1)
  with b.if_((x < pitch) & (y < rows)):
    is_chroma = y >= height
    yy = is_chroma.where(y - height, y)
    xb = x << log2_size  # the byte column
    gob = ((yy >> 4) * (src_pitch >> 6) + (xb >> 6)) * 2 + ((yy >> 3) & 1)
    inner = (xb & 15) | ((yy & 3) << 4) | ((xb & 16) << 2) | ((yy & 4) << 5) | ((xb & 32) << 3)
    dst[y * pitch + x] = src[(is_chroma.where(chroma, 0) + gob * 512 + inner) >> log2_size]
  k = _KERNELS[sample] = b.finish()
  return k


@dataclass
class Slot:
  """One picture's buffer in mapped GPU memory: its setup block (SETUP_SIZE bytes: picture setup, tile sizes, the
  status the engine writes), then its slices."""
  mem: Mem
  size: int             # bytes, setup block included
  last_use: int = 0     # the timeline value of the submission that last read it
  offset: int = -1      # the stream offset of the picture that last used it (-1: its status was read)


class NVVideoDecoder:
  """One stream on the NV device's video engine; see the module docstring."""

  def __init__(self, device: Any, stream: bytes, info: StreamInfo, options: dict[str, Any]):
    st = device.info.state
    self.device, self.state, self.stream, self.info = device, st, stream, info
    if not st.iface.classes.video:
      fam = st.iface.classes.family
      raise VideoDecoderUnavailable(f"NV:{st.index} ({fam.name}) offers no video decoder class plugrt-nv knows "
                                    f"({', '.join(f'{c:#06x}' for c in fam.video) or 'none listed for this family'})", Reason.NO_DEVICE,
                                    "decode on the CUDA device (NVDEC through libnvcuvid) or in software")
    for s in info.sequences: check_sps(s, 0)
    try: self.ring = st.video_ring()
    except NVError as e: raise VideoDecoderUnavailable(f"NV:{st.index}'s video engine cannot be used: {e.message}", Reason.OPEN_FAILED,
                                                       e.hint or "decode in software") from None
    self.slots: list[Slot] = []
    self.next_slot = 0
    self.surfaces: dict[int, Any] = {}  # picture index -> Buffer (block linear)
    self.layout: nvdec.Layout | None = None
    self.sample = dtypes.uint8
    self.coloc: Any = None
    self.filter: Any = None
    self.closed = False

  # ------------------------------------------------------------ buffers
  def _configure(self, lay: nvdec.Layout) -> None:
    """Surfaces and work buffers for a new picture format (after the pictures of the old one are done)."""
    import numpy as np

    from plugrt.device import Buffer
    self.state.synchronize()
    self.surfaces.clear()
    self.layout, self.sample = lay, (dtypes.uint8 if lay.bit_depth <= 8 else dtypes.uint16)
    self.coloc = Buffer(self.device, lay.coloc_size, dtypes.uint8).copyin(np.zeros(lay.coloc_size, np.uint8))
    self.filter = Buffer(self.device, lay.filter_size, dtypes.uint8).copyin(np.zeros(lay.filter_size, np.uint8))

  def _surface(self, index: int) -> Any:
    from plugrt.device import Buffer
    if (s := self.surfaces.get(index)) is None:
      assert self.layout is not None
      s = self.surfaces[index] = Buffer(self.device, self.layout.surface_size // self.sample.itemsize, self.sample)
    return s

  def _slot(self, need: int) -> Slot:
    st = self.state
    if len(self.slots) < SLOTS:
      size = nvdec.SETUP_SIZE + max(BITSTREAM_MIN, round_up(need + 256, 1 << 16))
      with st.lock: self.slots.append(Slot(st.iface.alloc(size, "mapped"), size))
      return self.slots[-1]
    slot = self.slots[self.next_slot]
    self.next_slot = (self.next_slot + 1) % SLOTS
    if slot.last_use: st.wait(slot.last_use)
    self._check(slot)
    if nvdec.SETUP_SIZE + need + 256 > slot.size:  # a larger picture than this buffer took so far
      size = nvdec.SETUP_SIZE + round_up(need + 256, 1 << 20)
      with st.lock:
        st.iface.free(slot.mem)
        slot.mem, slot.size = st.iface.alloc(size, "mapped"), size
    return slot

  def _check(self, slot: Slot) -> None:
    """The status the engine wrote for the picture that last used `slot` (its work is done)."""
    if slot.offset < 0: return
    status = nvdec.STATUS.from_address(slot.mem.va + nvdec.STATUS_OFFSET)
    if status.error_status:
      raise VideoStreamError(f"the video engine reported error status {status.error_status:#x} for the picture at byte {slot.offset} "
                             f"({status.mbs_in_error} blocks in error, slice header error {status.slice_header_error_code:#x}, "
                             f"error CTB {status.hevc.error_ctb_pos})", slot.offset)
    slot.offset = -1

  # ------------------------------------------------------------ the work
  def _decode(self, step: Decode) -> None:
    if step.layout != self.layout: self._configure(step.layout)
    slot = self._slot(len(step.bitstream))
    va = slot.mem.va
    ctypes.memmove(va, step.setup, len(step.setup))
    ctypes.memset(va + nvdec.STATUS_OFFSET, 0, ctypes.sizeof(nvdec.STATUS))
    ctypes.memmove(va + nvdec.SETUP_SIZE, step.bitstream, len(step.bitstream))
    ctypes.memset(va + nvdec.SETUP_SIZE + len(step.bitstream), 0, 256)  # zeros after the last slice
    surfaces = {i: self._surface(i).handle for i in (*step.references, step.picture.index)}
    assert self.layout is not None
    words = nvdec.decode_hevc(va, va + nvdec.SETUP_SIZE, surfaces, self.layout, self.coloc.handle, self.filter.handle)
    slot.last_use, slot.offset = self.state.submit(self.ring, words), step.picture.offset

  def _output(self, step: Output) -> Any:
    """The picture as a pitch-linear surface, copied out of its block-linear one by the detile kernel."""
    from plugrt.device import Buffer
    from plugrt.video import Surface
    lay, s = step.layout, step.sps
    pitch = lay.width + (lay.width & 1)
    rows = lay.height + (lay.height + 1) // 2
    out = Buffer(self.device, pitch * rows + (-(pitch * rows) % 4), self.sample)
    prg = self.device.program(detile_kernel(self.sample))
    log2 = 0 if self.sample is dtypes.uint8 else 1
    groups = (-(-pitch // DETILE_GROUP[0]), -(-rows // DETILE_GROUP[1]), 1)
    prg(out, self.surfaces[step.picture.index], global_size=groups, local_size=DETILE_GROUP,
        vals=(pitch, lay.height, rows, lay.pitch, lay.chroma_offset, log2))
    left, _, top, _ = s.conformance_window
    return Surface(out, *s.display_size, pitch, pitch * lay.height, s.bit_depth_luma,
                   0 if log2 == 0 else 16 - s.bit_depth_luma, left, top, s.vui.full_range, s.vui.matrix_coefficients)

  def frames(self) -> Iterator[Any]:
    from plugrt.video import Frame
    shown = 0
    try:
      for step in Planner(self.stream, self.info).steps():
        if isinstance(step, Decode): self._decode(step)
        else:
          yield Frame(shown, self._output(step), None)
          shown += 1
      self.state.synchronize()
      for slot in self.slots: self._check(slot)
    finally: self.close()

  def close(self) -> None:
    if self.closed: return
    self.closed = True
    st = self.state
    try:
      with st.lock:
        if not st.broken:  # (a broken device may still hold them: they stay, as NVAllocator leaves its memory then)
          st.synchronize()
          for slot in self.slots: st.iface.free(slot.mem)
    except Exception: pass  # a device that failed meanwhile: the process is going down with it
    self.slots.clear()
    self.surfaces.clear()
    self.coloc = self.filter = None


def open_decoder(device: Any, stream: bytes, info: StreamInfo, options: dict[str, Any]) -> NVVideoDecoder:
  return NVVideoDecoder(device, stream, info, options)
