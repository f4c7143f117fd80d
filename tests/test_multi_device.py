"""Several devices of one backend, below any hardware: a probe's per-device listing (Probe.devices) in index errors
and `plugrt devices`, and the warning a staged copy between two devices gives (once a pair and direction)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from plugrt import cli
from plugrt.device import Buffer
from plugrt.errors import DeviceUnavailable, Reason, StagedCopyWarning
from plugrt.registry import Registry

LISTED = """

def probe() -> Probe:
  from plugrt.hookspecs import DeviceListing
  return Probe.found(2, "2 fake GPUs").with_devices([DeviceListing(0, "Fake GPU A", "0000:18:00.0"),
                                                     DeviceListing(1, "Fake GPU B", "0000:19:00.0", {"uuid": "GPU-b"})])
"""


@pytest.fixture
def reg(fake_plugins):
  fake_plugins.backend("MULTI", priority=200, count=2, extra=LISTED)
  return Registry(env={"PLUGRT_PLUGINS": "multi,cpu,reference"}).load()


def test_index_error_names_the_count_and_the_devices(reg):
  assert reg.probe("MULTI").count == 2 and reg.probe("MULTI").devices[1].bus_id == "0000:19:00.0"
  with pytest.raises(DeviceUnavailable) as ei: reg.open("MULTI:3")
  msg = ei.value.message
  assert msg.startswith("MULTI:3 does not exist: MULTI has 2 devices here (indices 0-1: 2 fake GPUs)"), msg
  assert "MULTI:1 is Fake GPU B at 0000:19:00.0" in msg and ei.value.reason is Reason.NO_DEVICE
  assert "below 2" in ei.value.hint and ei.value.available[:2] == ("MULTI:0", "MULTI:1")  # the indices that exist
  assert reg.open("MULTI:1") is not reg.open("MULTI:0")  # each index its own device


def test_devices_lists_each_device(reg, monkeypatch, capsys):
  monkeypatch.setattr(cli, "_registry", lambda: reg)
  rows, _, _ = cli.device_rows()
  row = next(r for r in rows if r["device"] == "MULTI")
  assert row["devices"] == [{"index": 0, "name": "Fake GPU A", "bus_id": "0000:18:00.0", "info": {}},
                            {"index": 1, "name": "Fake GPU B", "bus_id": "0000:19:00.0", "info": {"uuid": "GPU-b"}}]
  cli.cmd_devices(type("A", (), {"json": False})())
  out = capsys.readouterr().out
  assert "MULTI:0  Fake GPU A  0000:18:00.0" in out and "MULTI:1  Fake GPU B  0000:19:00.0  (uuid GPU-b)" in out


def test_staged_copy_between_two_devices_warns_once(reg):
  a, b = reg.open("MULTI:0"), reg.open("MULTI:1")
  src = Buffer(a, 5).copyin(np.arange(5, dtype=np.float32))
  with pytest.warns(StagedCopyWarning, match="copies from MULTI to MULTI:1 are staged through host memory"):
    dst = src.to(b)
  assert np.array_equal(dst.numpy(), np.arange(5, dtype=np.float32))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    src.to(b)  # said once a pair
  with pytest.warns(StagedCopyWarning, match="from MULTI:1 to MULTI"): dst.to(a)  # the other direction is its own


def test_a_listing_that_is_not_device_listings_is_the_plugins_error(fake_plugins):
  bad = "\n\ndef probe() -> Probe:\n  return Probe.found(2)._replace(devices=({'index': 0},))\n"
  fake_plugins.backend("BADLIST", priority=200, count=2, extra=bad)
  p = Registry(env={"PLUGRT_PLUGINS": "badlist,cpu"}).load().probe("BADLIST")
  assert not p.ok and p.reason is Reason.HOOK_ERROR and "not plugrt.hookspecs.DeviceListing" in p.detail
