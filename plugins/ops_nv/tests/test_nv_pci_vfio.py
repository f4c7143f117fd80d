"""plugrt-nv-pci's VFIO path against fake_vfio's kernel and fake sysfs trees: the call order and struct contents the
kernel checks, buffers at IOVAs the fake IOMMU translates for the fake GPU, the choice between pagemap and VFIO (and the
probe's words for it), the typed error of each way VFIO refuses, and a whole open and close through vfio-pci."""
from __future__ import annotations

import errno
import os

import fake_nvpci_board
import pytest
from fake_nvpci import AMPERE, KernelWrites, make_sysfs
from fake_vfio import FakeVFIO, add_group, bind

import plugrt_nv_pci
from plugrt.context import DeviceInfo, PluginContext
from plugrt.errors import EnvError
from plugrt_nv_pci import vfio
from plugrt_nv_pci.dma import PAGE
from plugrt_nv_pci.errors import GroupNotViable, NoDMAPath, VFIOError
from plugrt_nv_pci.vfio import VFIODMA, dma_path

A, AUDIO = "0000:01:00.0", "0000:01:00.1"
ORDER = ["open vfio", "GET_API_VERSION", "CHECK_EXTENSION", "open 7", "GROUP_GET_STATUS", "GROUP_SET_CONTAINER", "SET_IOMMU",
         "IOMMU_GET_INFO", "IOMMU_GET_INFO", "GROUP_GET_DEVICE_FD"]


def tree(tmp_path, driver: str = "vfio-pci", kind: str = "DMA", group: bool = True, audio: str = "") -> tuple[str, str]:
  """A fake tree with the GPU at A bound to `driver`, in IOMMU group 7 of type `kind` (with its audio function bound to
  `audio` when given)."""
  devices, drivers = make_sysfs(str(tmp_path / "sys"), [(A, AMPERE[0], "nvidia")])
  if group: add_group(devices, "7", [A, *([AUDIO] if audio else [])], kind)
  if driver != "nvidia":
    if driver: bind(devices, A, driver)
    else: os.unlink(os.path.join(devices, A, "driver"))
  if audio: bind(devices, AUDIO, audio)
  return devices, drivers


def opened(tmp_path, **fake) -> tuple[FakeVFIO, VFIODMA]:
  devices, _ = tree(tmp_path)
  kernel = FakeVFIO(devices, **fake)
  return kernel, VFIODMA(os.path.join(devices, A), kernel)


def test_vfio_opens_in_the_kernels_order_and_maps_buffers_at_iovas(tmp_path) -> None:
  kernel, d = opened(tmp_path)
  try:
    assert kernel.calls == ORDER and kernel.violations == [] and d.iommu == vfio.TYPE1V2_IOMMU
    a, b = d.alloc(3 * PAGE + 5), d.alloc(PAGE, contiguous=True)
    assert a.size == 4 * PAGE and a.pages == [a.pages[0] + i * PAGE for i in range(4)] and a.pages[0] >= vfio.LOW_IOVA
    assert kernel.maps == {a.pages[0]: (a.cpu, 4 * PAGE), b.pages[0]: (b.cpu, PAGE)}   # read and write, checked by the fake
    a.write(2 * PAGE + 7, b"through the IOMMU")
    assert kernel.read(a.bus(2 * PAGE + 7), 17) == b"through the IOMMU"              # what the GPU reads at that IOVA
    hole = d.alloc(2 * PAGE)            # a range the process just had: free again once unmapped
    at = hole.cpu
    d.free(hole)
    placed = d.alloc(2 * PAGE, at=at)
    assert placed.cpu == at
    with pytest.raises(FileExistsError): d.alloc(PAGE, at=at)
    d.free(a)
    assert kernel.unmapped[-1] == (a.pages[0], 4 * PAGE) and a.pages[0] not in kernel.maps
    assert d.alloc(4 * PAGE).pages[0] == a.pages[0]                                    # the IOVA range is free again
  finally: d.close()
  assert kernel.maps == {} and kernel.open_fds() == [] and kernel.violations == []
  assert kernel.calls[-3:] == ["close device", "close group", "close container"]


def test_iovas_come_from_the_ranges_the_iommu_reports(tmp_path) -> None:
  kernel, d = opened(tmp_path, ranges=((0, 0xFFFFF), (0x10000000, 0x10003FFF)))
  try:
    assert d.alloc(2 * PAGE).pages[0] == 0x10000000                     # below 1 MiB stays unused
    with pytest.raises(VFIOError, match="no IOVA range of 12288 bytes is left"): d.alloc(3 * PAGE)
    assert kernel.violations == []
  finally: d.close()
  kernel, d = opened(tmp_path / "nocaps", caps=False)                   # a kernel without the IOVA-range capability
  try: assert d.ranges == [(vfio.LOW_IOVA, 0xFEE00000)] and kernel.calls.count("IOMMU_GET_INFO") == 1
  finally: d.close()


def test_a_group_that_is_not_viable_names_the_device_that_holds_it(tmp_path) -> None:
  devices, _ = tree(tmp_path, audio="snd_hda_intel")
  kernel = FakeVFIO(devices)
  with pytest.raises(GroupNotViable) as e: VFIODMA(os.path.join(devices, A), kernel)
  assert e.value.blockers == {AUDIO: "snd_hda_intel"} and e.value.group == "7"
  assert f"{AUDIO} (bound to snd_hda_intel) not bound to vfio-pci" in e.value.message
  assert f"echo vfio-pci | sudo tee {devices}/{AUDIO}/driver_override" in e.value.hint
  assert "GROUP_SET_CONTAINER" not in kernel.calls and kernel.open_fds() == []


def test_no_type1_iommu_is_a_typed_error(tmp_path) -> None:
  devices, _ = tree(tmp_path)
  kernel = FakeVFIO(devices, types=(vfio.TYPE1V2_IOMMU + 5,))
  with pytest.raises(VFIOError, match="offers no type-1 IOMMU") as e: VFIODMA(os.path.join(devices, A), kernel)
  assert e.value.step == "VFIO_CHECK_EXTENSION" and "vfio_iommu_type1" in e.value.hint and kernel.open_fds() == []
  assert VFIODMA(os.path.join(devices, A), FakeVFIO(devices, types=(vfio.TYPE1_IOMMU,))).iommu == vfio.TYPE1_IOMMU


def test_a_group_nobody_bound_to_vfio_pci_is_refused_with_the_steps(tmp_path) -> None:
  devices, _ = tree(tmp_path, driver="")
  with pytest.raises(VFIOError, match=r"cannot open IOMMU group 7 .*No such file") as e: VFIODMA(os.path.join(devices, A), FakeVFIO(devices))
  assert e.value.errno == errno.ENOENT and f"echo {A} | sudo tee" in e.value.hint and "drivers_probe" in e.value.hint


def test_map_dma_refusals_are_clear_errors(tmp_path) -> None:
  kernel, d = opened(tmp_path, pin_limit=2 * PAGE)
  try:
    with pytest.raises(VFIOError, match=r"cannot pin that much memory .*RLIMIT_MEMLOCK") as e: d.alloc(3 * PAGE)
    assert e.value.errno == errno.ENOMEM and "ulimit -l" in e.value.hint and e.value.step == "VFIO_IOMMU_MAP_DMA"
    first = d.alloc(PAGE)                                 # nothing of the failed buffer is left: its IOVA is handed out again
    assert first.pages[0] == vfio.LOW_IOVA
    kernel.ranges = ((0x100000000, 0x1FFFFFFFF),)          # the IOMMU now refuses what it reported before
    with pytest.raises(VFIOError, match="the IOMMU refused the range") as e: d.alloc(PAGE)
    assert e.value.errno == errno.EINVAL
  finally: d.close()


def test_overlapping_iovas_are_refused_by_the_kernel(tmp_path) -> None:
  """The fake kernel's own rule, which plugrt's allocator never meets: a second mapping over the first is EEXIST."""
  kernel, d = opened(tmp_path)
  try:
    a = d.alloc(2 * PAGE)
    d.spaces[0].release(a.pages[0], 2 * PAGE)             # an allocator that forgot the range
    with pytest.raises(VFIOError, match="overlaps a mapping already there") as e: d.alloc(PAGE)
    assert e.value.errno == errno.EEXIST and kernel.maps == {a.pages[0]: (a.cpu, 2 * PAGE)}
  finally: d.close()


# ---- which path opening takes --------------------------------------------------------------------------------------------

def test_the_dma_path_is_chosen_from_sysfs_and_the_variable(tmp_path) -> None:
  def path(name, asked="", **kw):
    devices, drivers = tree(tmp_path / name, **kw)
    return dma_path(os.path.join(devices, A), drivers, asked)
  assert path("none", driver="nvidia", group=False) == ("pagemap", "no IOMMU translates its DMA")
  assert path("identity", driver="nvidia", kind="identity")[0] == "pagemap"
  assert path("bound") == ("vfio", "bound to vfio-pci, IOMMU group 7")
  assert path("asked", "vfio", driver="nvidia") == ("vfio", "PLUGRT_NV_PCI_DMA=vfio, IOMMU group 7; opening binds it to vfio-pci "
                                                     "(driver_override) and back to nvidia on close")
  with pytest.raises(NoDMAPath) as e: path("both", driver="nvidia")
  assert "pagemap's physical addresses are refused (its IOMMU group (7) translates DMA (type DMA))" in e.value.message
  assert "VFIO is not used: the function is bound to nvidia, not vfio-pci" in e.value.message
  assert "driver_override" in e.value.hint and "PLUGRT_NV_PCI_DMA=vfio" in e.value.hint
  with pytest.raises(NoDMAPath, match="has no IOMMU group"): path("nogroup", "vfio", driver="nvidia", group=False)
  with pytest.raises(NoDMAPath, match="PLUGRT_NV_PCI_DMA=pagemap, but its IOMMU group"): path("forced", "pagemap")


def info(**env: str) -> DeviceInfo: return DeviceInfo("NV", 0, "PTX", "PCI", context=PluginContext(env))


def test_the_probe_says_which_path_and_a_bad_value_is_an_env_error(tmp_path) -> None:
  devices, drivers = tree(tmp_path, driver="nvidia")
  p = plugrt_nv_pci.probe_tree(devices)
  assert p.ok and "host memory: none usable (" in p.detail and "not vfio-pci" in p.detail
  p = plugrt_nv_pci.probe_tree(devices, PluginContext({"PLUGRT_NV_PCI_DMA": "vfio"}))
  assert "host memory through VFIO (PLUGRT_NV_PCI_DMA=vfio, IOMMU group 7; opening binds it to vfio-pci" in p.detail
  p = plugrt_nv_pci.probe_tree(devices, PluginContext({"PLUGRT_NV_PCI_DMA": "iommu"}))
  assert not p.ok and "PLUGRT_NV_PCI_DMA" in p.detail
  kernel = KernelWrites(devices)
  with pytest.raises(EnvError, match="PLUGRT_NV_PCI_DMA"):
    plugrt_nv_pci.open_pci(info(PLUGRT_NV_ALLOW_UNBIND="1", PLUGRT_NV_PCI_DMA="iommu"), devices, drivers, kernel, vfio=FakeVFIO(devices))
  with pytest.raises(NoDMAPath):
    plugrt_nv_pci.open_pci(info(PLUGRT_NV_ALLOW_UNBIND="1"), devices, drivers, kernel, vfio=FakeVFIO(devices))
  assert kernel.log == []                                    # refused before anything was unbound


# ---- a whole open and close through vfio-pci ------------------------------------------------------------------------------

def test_open_binds_vfio_pci_boots_through_the_iommu_and_gives_the_gpu_back(tmp_path) -> None:
  fake = fake_nvpci_board.FakePCINV("ga102", root=str(tmp_path), dma="vfio")
  try:
    iface = fake.open(info(**{**fake.env(), "PLUGRT_NV_BOOT_TIMEOUT": "2"}))
    try:
      assert "booter_load ran on SEC2" in iface.rec.so_far() and fake.violations() == []
      assert fake.vfio.calls[:len(ORDER)] == [c.replace("open 7", "open 42") for c in ORDER] and fake.vfio.mapped_regions == [0, 1]
      assert len(fake.vfio.maps) > 3 and os.path.basename(os.path.realpath(os.path.join(fake.devices, A, "driver"))) == "vfio-pci"
      host = iface.alloc(3 * PAGE, "host")
      assert iface.dma.maps[host.private["host"].cpu][0] == host.private["host"].pages[0]
    finally: iface.close()
    assert fake.vfio.open_fds() == [] and fake.vfio.maps == {} and fake.violations() == []
    assert fake.kernel.log == [(f"devices/{A}/driver_override", "vfio-pci"), (f"devices/{A}/driver/unbind", A), ("drivers/vfio-pci/bind", A),
                               (f"devices/{A}/reset", "1"), (f"devices/{A}/driver/unbind", A), (f"devices/{A}/driver_override", "\n"),
                               ("drivers/nvidia/bind", A)]
    assert iface.released[-5:] == ["bus mastering off", "VFIO closed", "reset", "unbound from vfio-pci", "bound back to nvidia"]
  finally: fake.shutdown()
