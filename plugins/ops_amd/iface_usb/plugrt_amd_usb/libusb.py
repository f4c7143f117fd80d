"""A SCSI transport to the ASM24xx bridge over libusb (ctypes), USB mass storage Bulk-Only Transport.

Each command is a 31-byte Command Block Wrapper on the bulk OUT endpoint, its data phase (in on bulk IN, or out on
bulk OUT: the SRAM window's WRITE(16), up to 64 KiB), and a 13-byte Command Status Wrapper on bulk IN; the data phase
must move the whole length the CBW announced and the CSW's residue must agree (a stalled data phase is cleared and the
CSW still read, as BOT 1.0 section 6.7 asks) (USB Mass Storage Class, Bulk-Only Transport 1.0). Bulk-Only rather than
UAS: it is synchronous (plain libusb_bulk_transfer, no stream IDs or asynchronous transfer structs to lay out in
ctypes), the vendor CDBs are the same SCSI commands in either, and the bridge's interface 0 offers Bulk-Only as
alternate setting 0. Whether the bridge's stock firmware answers the vendor CDBs over Bulk-Only as it does over UAS
is not verified (no bridge was lent).

libusb-1.0 is found at run time (`PLUGRT_LIBUSB`, else the system's libusb-1.0.so.0); missing, opening is
`DeviceUnavailable` with reason `missing toolchain`. Opening detaches the kernel driver (usb-storage or uas) from
interface 0 only when the caller allows it, and `close()` re-attaches it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import struct
from typing import Any

from plugrt.errors import DeviceUnavailable, Reason

CBW_SIGNATURE, CSW_SIGNATURE = 0x43425355, 0x53425355   # "USBC", "USBS"
CBW_SIZE, CSW_SIZE = 31, 13
CBW_DATA_IN = 0x80
CSW_PHASE_ERROR = 2
LIBUSB_ERROR_PIPE = -9            # libusb_error: the endpoint halted (stalled)
EP_OUT, EP_IN = 0x02, 0x81        # the bridge's bulk endpoints on interface 0, alternate setting 0
INTERFACE = 0
LIBUSB_HINT = "install libusb-1.0 (apt-get install libusb-1.0-0), or set PLUGRT_LIBUSB to its path"


def cbw(tag: int, cdb: bytes, length: int, data_in: bool) -> bytes:
  if not 0 < len(cdb) <= 16: raise ValueError(f"a CDB is 1..16 bytes, not {len(cdb)}")
  return struct.pack("<IIIBBB16s", CBW_SIGNATURE, tag, length, CBW_DATA_IN if data_in else 0, 0, len(cdb), cdb)


def parse_csw(data: bytes, tag: int) -> tuple[int, int]:
  """(residue, status) of a Command Status Wrapper; ValueError when it is not the one for `tag`."""
  if len(data) != CSW_SIZE: raise ValueError(f"CSW of {len(data)} bytes (expected {CSW_SIZE})")
  sig, got, residue, status = struct.unpack("<IIIB", data)
  if sig != CSW_SIGNATURE or got != tag: raise ValueError(f"CSW signature 0x{sig:08x} tag {got} (expected tag {tag})")
  return residue, status


def load(path: str = "") -> ctypes.CDLL:
  """libusb-1.0, or DeviceUnavailable(missing toolchain)."""
  names = [path] if path else [n for n in (ctypes.util.find_library("usb-1.0"), "libusb-1.0.so.0", "libusb-1.0.so") if n]
  for n in names:
    try: lib = ctypes.CDLL(n)
    except OSError: continue
    c_int, vp = ctypes.c_int, ctypes.c_void_p
    for fn, res, args in (("libusb_init", c_int, [ctypes.POINTER(vp)]), ("libusb_exit", None, [vp]),
                          ("libusb_open_device_with_vid_pid", vp, [vp, ctypes.c_uint16, ctypes.c_uint16]), ("libusb_close", None, [vp]),
                          ("libusb_kernel_driver_active", c_int, [vp, c_int]), ("libusb_detach_kernel_driver", c_int, [vp, c_int]),
                          ("libusb_attach_kernel_driver", c_int, [vp, c_int]), ("libusb_claim_interface", c_int, [vp, c_int]),
                          ("libusb_release_interface", c_int, [vp, c_int]), ("libusb_set_interface_alt_setting", c_int, [vp, c_int, c_int]),
                          ("libusb_bulk_transfer", c_int, [vp, ctypes.c_ubyte, ctypes.c_char_p, c_int, ctypes.POINTER(c_int), ctypes.c_uint]),
                          ("libusb_clear_halt", c_int, [vp, ctypes.c_ubyte]), ("libusb_error_name", ctypes.c_char_p, [c_int])):
      f = getattr(lib, fn); f.restype, f.argtypes = res, args
    return lib
  raise DeviceUnavailable(f"libusb-1.0 is not installed (looked for {', '.join(names) or 'libusb-1.0'})", Reason.MISSING_TOOLCHAIN, LIBUSB_HINT)


class LibUSBTransport:
  """Bulk-Only SCSI commands to the USB device vendor:product through libusb."""

  def __init__(self, vendor: int, product: int, allow_detach: bool, lib: Any = None, timeout_ms: int = 2000):
    self.lib = lib or load()
    self.timeout_ms, self.tag, self.detached = timeout_ms, 0, False
    self.ctx, self.handle = ctypes.c_void_p(), None
    self._check(self.lib.libusb_init(ctypes.byref(self.ctx)), "libusb_init")
    self.handle = self.lib.libusb_open_device_with_vid_pid(self.ctx, vendor, product)
    if not self.handle:
      self.close()
      raise DeviceUnavailable(f"cannot open USB device {vendor:04x}:{product:04x}", Reason.NO_DEVICE,
                              "give this user access to it (a udev rule), or run as root")
    if self.lib.libusb_kernel_driver_active(self.handle, INTERFACE) == 1:
      if not allow_detach:
        self.close()
        raise DeviceUnavailable(f"USB device {vendor:04x}:{product:04x} is held by a kernel driver", Reason.NO_DEVICE,
                                "set PLUGRT_AMD_ALLOW_UNBIND=1 to let plugrt detach it (it is re-attached on close)")
      self._check(self.lib.libusb_detach_kernel_driver(self.handle, INTERFACE), "detach the kernel driver")
      self.detached = True
    self._check(self.lib.libusb_claim_interface(self.handle, INTERFACE), "claim interface 0")
    self._check(self.lib.libusb_set_interface_alt_setting(self.handle, INTERFACE, 0), "select Bulk-Only (alternate setting 0)")

  def _check(self, rc: int, what: str) -> None:
    if rc < 0:
      name = (self.lib.libusb_error_name(rc) or b"?").decode()
      self.close()
      raise DeviceUnavailable(f"USB bridge: {what} failed ({name})", Reason.NO_DEVICE)

  def _bulk(self, ep: int, buf: ctypes.Array, n: int, stall_ok: bool = False) -> int:
    done = ctypes.c_int(0)
    rc = self.lib.libusb_bulk_transfer(self.handle, ep, buf, n, ctypes.byref(done), self.timeout_ms)
    if rc == LIBUSB_ERROR_PIPE and stall_ok:
      # BOT 6.7.2/6.7.3: the device stalls a data phase it cuts short; clear the halt and go on to the CSW
      self.lib.libusb_clear_halt(self.handle, ep)
      return done.value
    if rc < 0:
      from plugrt_amd_usb.asm24 import BridgeError
      raise BridgeError(f"USB bulk transfer on endpoint 0x{ep:02x} failed ({(self.lib.libusb_error_name(rc) or b'?').decode()})")
    return done.value

  def execute(self, cdb: bytes, read: int = 0, data: bytes = b"") -> bytes:
    """One command: CBW, data phase (in: `read` bytes; out: `data`), CSW. The data phase must move exactly the
    length the CBW announced: a short phase, a residue that disagrees with it, or a phase error is a BridgeError."""
    from plugrt_amd_usb.asm24 import BridgeError
    if read and data: raise ValueError("a Bulk-Only command has one data phase: read or write, not both")
    length = read or len(data)
    self.tag = (self.tag + 1) & 0xFFFFFFFF
    out = ctypes.create_string_buffer(cbw(self.tag, cdb, length, read > 0), CBW_SIZE)
    self._bulk(EP_OUT, out, CBW_SIZE)
    got, result = 0, b""
    if read:
      buf = ctypes.create_string_buffer(read)
      got = self._bulk(EP_IN, buf, read, stall_ok=True)          # transfer first: .raw copies the buffer as it is when read
      result = buf.raw[:got]
    elif data:
      got = self._bulk(EP_OUT, ctypes.create_string_buffer(bytes(data), len(data)), len(data), stall_ok=True)
    csw = ctypes.create_string_buffer(CSW_SIZE)
    n = self._bulk(EP_IN, csw, CSW_SIZE)
    try: residue, status = parse_csw(csw.raw[:n], self.tag)
    except ValueError as e: raise BridgeError(f"USB bridge: bad status wrapper for CDB 0x{cdb[0]:02x}: {e}") from None
    what = f"CDB 0x{cdb[0]:02x} ({'in' if read else 'out'} {length} bytes)"
    if status == CSW_PHASE_ERROR:
      raise BridgeError(f"USB bridge: {what}: phase error (CSW status 2)",
                        "unplug and replug the bridge (Bulk-Only reset recovery is not implemented)")
    if status: raise BridgeError(f"USB bridge: {what} failed (CSW status {status}, residue {residue})")
    if got != length or residue != length - got:
      raise BridgeError(f"USB bridge: {what}: the data phase moved {got} bytes, the CSW's residue is {residue}",
                        "the bridge did not take or give the whole transfer; a WRITE(16) over its SRAM or a firmware without the vendor commands")
    return result

  def close(self) -> None:
    if self.handle:
      self.lib.libusb_release_interface(self.handle, INTERFACE)
      if self.detached: self.lib.libusb_attach_kernel_driver(self.handle, INTERFACE)
      self.lib.libusb_close(self.handle)
      self.handle, self.detached = None, False
    if self.ctx:
      self.lib.libusb_exit(self.ctx)
      self.ctx = ctypes.c_void_p()
