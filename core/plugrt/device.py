"""Devices and buffers: what users hold.

`Device["CPU"]` opens a device once (its hooks build the allocator, program factory and compiler then) and returns the
same RuntimeDevice every later time. `Device.DEFAULT` is the default device's name. A Buffer is typed memory on one
device; programs take Buffers as arguments. RuntimeDevice and Buffer live in plugrt.opened, below the registry; this
module is the process-wide registry's face.
"""
from __future__ import annotations

from plugrt.context import canonicalize
from plugrt.opened import Buffer, RuntimeDevice, _device
from plugrt.registry import Registry, current


class _DeviceAccess:
  """`Device["CUDA:1"]` opens a device; `Device.DEFAULT` names the default one."""

  def __getitem__(self, device: str) -> RuntimeDevice: return _device(device)

  @property
  def DEFAULT(self) -> str: return current().default

  @property
  def registry(self) -> Registry: return current().load()

  def available(self) -> list[str]:
    """Devices whose backend finds hardware here, in automatic-choice order (nothing is opened)."""
    return self.registry.available()

  @staticmethod
  def canonicalize(device: str) -> str: return canonicalize(device)

  def __repr__(self) -> str: return "<plugrt.Device: Device['CPU'], Device.DEFAULT, Device.available()>"


Device = _DeviceAccess()

__all__ = ["Buffer", "Device", "RuntimeDevice"]
