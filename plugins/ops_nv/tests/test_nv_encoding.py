"""NV below the hardware boundary, on any machine: hardware tables, QMD packing for every layout, push-buffer and
GPFIFO encoding, cubin (ELF) parsing of kernels nvcc builds here, the driver structs' sizes, the VA allocator,
and what `plugrt devices` says when there is no GPU."""
from __future__ import annotations

import ctypes
import itertools
import os
import random
import struct

import pytest
from nv_tools import cubin, has_nv, nvcc

import plugrt_nv
import plugrt_nv_nvk
import plugrt_nv_pci
from plugrt.compiler import samples as K
from plugrt.context import PluginContext
from plugrt.errors import CompileError, DeviceUnavailable, Reason
from plugrt_nv import cmd, hw
from plugrt_nv import cubin as elf
from plugrt_nv_nvk import rm
from plugrt_nv_nvk.nvk import VASpace

needs_nvcc = pytest.mark.skipif(nvcc() is None, reason="nvcc is not installed (pip install nvidia-cuda-nvcc, see requirements-test.txt)")
# what the H200 of the lent machine lists (driver 580.159.04; docs/research/nv-driver.md)
H200_CLASSES = {0x41, 0x80, 0x2080, 0x90F1, 0xA06C, 0x9067, 0xC36F, 0xC46F, 0xC56F, 0xC86F, 0xC361, 0xC461, 0xC561, 0xC661, 0xC8B5, 0xCBC0, 0x83DE}


# ---------------------------------------------------------------- hardware tables

def test_class_choice():
  c = hw.pick_classes(H200_CLASSES)
  assert c is not None and (c.family.name, c.compute, c.copy, c.gpfifo, c.usermode) == ("Hopper", 0xCBC0, 0xC8B5, 0xC86F, 0xC661)
  assert c.family.qmd == 4 and c.family.tested
  ada = hw.pick_classes({0xC9C0, 0xC7B5, 0xC56F, 0xC461})
  assert ada is not None and (ada.family.name, ada.family.qmd, ada.usermode) == ("Ada", 3, 0xC461)
  assert hw.pick_classes({0xC56F, 0xC461}) is None  # a channel but no compute class: no family fits
  bw = hw.pick_classes({0xCEC0, 0xCAB5, 0xCA6F, 0xC761})
  assert bw is not None and (bw.family.name, bw.family.qmd, bw.compute) == ("Blackwell", 5, 0xCEC0)
  assert [hw.arch_of(v) for v in (0x900, 0x806, 0x809, 0xA04)] == ["sm_90", "sm_86", "sm_89", "sm_120"]


# a kernel that reads every driver word of constant bank 0: block and grid dims, the shared and local windows (cvta), the stack
CBUF0_PTX = """.version 8.7
.target {arch}
.address_size 64
.visible .entry k(.param .u64 p)
{{
 .reg .b32 r<8>; .reg .b64 rd<8>; .shared .align 4 .b8 sm[64]; .local .align 4 .b8 lm[64];
 ld.param.u64 rd1, [p]; cvta.to.global.u64 rd2, rd1;
 mov.u32 r1, %ntid.z; st.global.u32 [rd2], r1; mov.u32 r2, %nctaid.z; st.global.u32 [rd2+4], r2;
 mov.u64 rd3, sm; cvta.shared.u64 rd4, rd3; st.global.u64 [rd2+8], rd4;
 mov.u64 rd5, lm; cvta.local.u64 rd6, rd5; st.global.u64 [rd2+16], rd6;
 ret;
}}
"""


@pytest.mark.parametrize("family,arch", [("Ampere", "sm_86"), ("Ada", "sm_89"), ("Hopper", "sm_90"), ("Blackwell", "sm_120")])
def test_cbuf0_driver_area_lies_below_the_parameters_ptxas_puts(family, arch):
  """Each family's driver words of constant bank 0 (Family.cbuf0) are inside the bank and below where ptxas puts a
  kernel's parameters for that family's SM (nv.info's PARAM_CBANK), so plugrt's dims, windows and stack never overlap
  the arguments; the words do not overlap each other."""
  from plugrt_nvidia_toolchain import ptxas
  tool = ptxas.path(os.environ)
  if tool is None: pytest.skip("ptxas is not installed")
  k = elf.parse(ptxas.assemble(tool, CBUF0_PTX.format(arch=arch), arch))
  block, grid, windows, stack = next(f for f in hw.FAMILIES if f.name == family).cbuf0
  spans = sorted([(block, block + 12), (grid, grid + 12), (windows, windows + 16), (stack, stack + 4)])
  assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
  assert spans[-1][1] <= k.param_base, (family, hex(k.param_base), spans)


@pytest.mark.parametrize("version", sorted(hw.QMD))
def test_qmd_fields_are_disjoint_and_inside(version):
  L = hw.QMD[version]
  used: dict[int, str] = {}
  for name, (_, _, stride) in L.fields.items():
    for i in range(8 if stride else 1):
      h, lo_i = L.bits(name, i)
      assert 0 <= lo_i <= h < L.size * 8, (name, i)
      for b in range(lo_i, h + 1):
        assert b not in used, f"v{version}: {name}[{i}] overlaps {used[b]} at bit {b}"
        used[b] = f"{name}[{i}]"


def test_qmd_v4_positions_from_the_header():
  """Spot checks against NVIDIA's clcbc0qmd.h (NVCBC0_QMDV04_00_*), the layout the H200 runs."""
  L = hw.QMD[4]
  assert L.size == 384
  assert {n: L.fields[n][:2] for n in ("grid_x", "block_x", "regs", "barriers", "program_lo", "program_hi", "shared_size", "major", "type")} == {
    "grid_x": (1055, 1024), "block_x": (1167, 1152), "regs": (1208, 1200), "barriers": (1215, 1211), "program_lo": (1247, 1216),
    "program_hi": (1272, 1248), "shared_size": (601, 584), "major": (583, 580), "type": (25, 23)}
  assert L.bits("cbuf_addr_lo", 3) == (1567 + 192, 1536 + 192) and L.bits("cbuf_valid", 2) == (424, 424)


@pytest.mark.parametrize("version", sorted(hw.QMD))
def test_qmd_packing(version):
  q = cmd.Qmd(hw.QMD[version])
  q.set("major", version).set_dims((70000, 3, 2), (256, 2, 1)).set("regs", 40).set_shared(0x1000).set_program(0x12_3456_7800)
  assert (q.get("grid_x"), q.get("grid_y"), q.get("grid_z"), q.get("block_x"), q.get("block_y"), q.get("regs")) == (70000, 3, 2, 256, 2, 40)
  assert q.get("major") == version and q.get("minor") == 0
  shift = hw.QMD[version].shifts.get("program", 0)
  assert (q.get("program_hi") << 32 | q.get("program_lo")) << shift == 0x12_3456_7800
  with pytest.raises(ValueError, match="does not fit"): q.set("block_y", 1 << 16)
  if hw.QMD[version].shifts.get("cbuf_addr"):
    with pytest.raises(ValueError, match="multiple of 64"): q.set_cbuf(0, 0x1000_0020, 0x100)


@pytest.mark.parametrize("version", sorted(hw.QMD))
def test_cbuf_patch_matches_the_slow_path(version):
  """A launch moves constant bank 0 by rewriting two words; that must equal setting the fields."""
  rng = random.Random(version)
  base = cmd.Qmd(hw.QMD[version]).set_cbuf(0, 0, 0x250).set_cbuf(3, 0x40_0000_0040, 0x10)
  off, shift, hi = base.cbuf_patch(0)
  for _ in range(50):
    va = rng.randrange(0, 1 << 40) & ~0xFF
    fast = bytearray(base.buf)
    a = va >> shift
    struct.pack_into("<II", fast, off, a & 0xFFFFFFFF, hi | a >> 32)
    slow = cmd.Qmd(hw.QMD[version])
    slow.buf[:] = base.buf
    slow.set_cbuf(0, va, 0x250)
    assert bytes(fast) == bytes(slow.buf)


# ---------------------------------------------------------------- push buffer and GPFIFO

def test_method_headers():
  assert cmd.header(1, 0x2B4, 1) == 0x20012000 | 0x2B4 >> 2  # SEC_OP=1 (incrementing), count 1, subchannel 1
  assert cmd.method(4, 0x400, 1, 2, 3, 4) == [0x2004_8100, 1, 2, 3, 4]
  with pytest.raises(AssertionError): cmd.header(0, 0x5E, 1)  # methods are word aligned


def test_gpfifo_entry():
  e = cmd.gp_entry(0x10_0000_1000, 18)
  assert e & 0xFFFFFFFFFF == 0x10_0000_1000 and e >> 42 == 18 and e >> 41 & 1 == 1
  with pytest.raises(ValueError): cmd.gp_entry(1 << 40, 4)  # push buffers live below 2^40
  with pytest.raises(ValueError): cmd.gp_entry(0x1002, 4)


def test_semaphores_and_launch():
  rel = cmd.sem_release(0x12_3456_7890, 0x1_0000_0005)
  assert rel == [cmd.header(0, hw.Host.SEM_ADDR_LO, 5), 0x34567890, 0x12, 5, 0, 1 | 1 << 20 | 1 << 25]  # 32-bit payload, WFI, timestamp
  acq = cmd.sem_acquire(0x1000, 7)
  assert acq[3] == 7 and acq[5] == hw.Host.SEM_ACQ_CIRC_GEQ
  launch = cmd.launch(0x10_0000_0100)
  assert launch[3] == 0x10_0000_0100 >> 8 and launch[5] == hw.Compute.PCAS_PREFETCH_SCHEDULE
  with pytest.raises(ValueError): cmd.launch(0x10_0000_0180)  # QMDs are 256-byte aligned
  fast = cmd.launch(0x10_0000_0100, hw.Compute.INVALIDATE_GLOBAL_DATA) + cmd.sem_release(0x1000, 0, timestamp=False)
  assert len(fast) == 12 and fast[1] == 1 << 4 and fast[-1] == 1 | 1 << 20  # what NV's fast path writes: data invalidate, no timestamp
  assert cmd.launch(0x10_0000_0100, 0) == launch[2:]  # no invalidation: the two PCAS methods alone


def test_qmd_byte_fields_take_the_fast_path():
  """Whole-byte fields are written as bytes; the result equals the general bit-by-bit path."""
  L = hw.QMD[4]
  a, b = cmd.Qmd(L), cmd.Qmd(L)
  for f, v in (("grid_x", 0x12345678), ("grid_y", 0xBEEF), ("block_x", 256), ("program_lo", 0xCAFEBABE)):
    a.set(f, v)
    lo = L.bits(f)[1]
    n = int.from_bytes(b.buf, "little") | v << lo
    b.buf[:] = n.to_bytes(len(b.buf), "little")
    assert a.get(f) == v
  assert a.buf == b.buf


def test_copy_splits_large_copies():
  words = cmd.copy(0x20_0000_0000, 0x10_0000_0000, (2 << 31) + 5)
  assert len(words) == 3 * 9  # per piece: addresses (5 words), length (2), launch (2)
  assert [words[i + 6] for i in range(0, len(words), 9)] == [1 << 31, 1 << 31, 5]
  assert words[10:14] == [0x10, 0x8000_0000, 0x20, 0x8000_0000]  # the second piece starts 2 GiB further on both sides


# ---------------------------------------------------------------- cubins

@needs_nvcc
def test_cubin_of_a_rendered_kernel(tmp_path):
  from plugrt_nvidia_toolchain.cuda_c import CUDARenderer
  k = elf.parse(cubin(CUDARenderer().render(K.saxpy_kernel()), tmp_path))
  assert k.name == "saxpy" and k.regs > 0 and k.param_base == 0x210 and k.image[k.entry:k.entry + 4] != b"\0\0\0\0"
  assert k.params == [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4)]  # out, x, y pointers; a (float); n (int)
  assert len(k.cbuf0) == 0x210 + 32 and k.shared == 0 and not k.relocs
  r = elf.parse(cubin(CUDARenderer().render(K.reverse_case().kernel), tmp_path))
  assert r.shared >= 16 * 4 and r.barriers >= 1


@needs_nvcc
def test_cubin_relocations_and_constant_banks(tmp_path):
  src = '__device__ int table[4] = {7, 8, 9, 10};\nextern "C" __global__ void k(int* o, int i) { int* volatile p = table; o[threadIdx.x] = p[i]; }'
  k = elf.parse(cubin(src, tmp_path))
  assert k.relocs and k.banks
  base = 0x10_0000_0000
  img = k.relocated(base)
  for at, kind, target in k.relocs:
    assert kind == elf.R_CUDA_64 and struct.unpack_from("<Q", img, at)[0] == base + target
    assert struct.unpack_from("<4i", img, target) == (7, 8, 9, 10)  # the relocation points at the initialized table


def test_cubin_refusals():
  with pytest.raises(CompileError, match="not a cubin"): elf.parse(b"//\n.version 8.0\n")


# ---------------------------------------------------------------- the driver interface (no driver needed)

@pytest.mark.parametrize("major", [570, 580, 610])
def test_driver_struct_sizes(major):
  L = rm.layout(major)
  newer = major >= 580
  assert ctypes.sizeof(L.NVOS46) == (64 if newer else 56) and ctypes.sizeof(L.VASPACE_PARAMS) == (56 if newer else 48)
  assert ctypes.sizeof(L.CHANNEL_PARAMS) == (376 if major >= 610 else 368) and ctypes.sizeof(L.SCHEDULE) == (3 if newer else 2)
  assert L.CHANNEL_PARAMS.userdOffset.offset == (72 if major >= 610 else 64) and L.NVOS46.dmaOffset.offset == (48 if newer else 40)


def test_driver_structs_match_the_documented_offsets():
  assert (rm.CARD_INFO.gpu_id.offset, rm.CARD_INFO.minor_number.offset, ctypes.sizeof(rm.CARD_INFO)) == (16, 56, 72)
  assert (rm.DEVICE_PARAMS.vaMode.offset, rm.MEMORY_PARAMS.size.offset, rm.MEMORY_PARAMS.numaNode.offset) == (48, 64, 120)
  assert (rm.UVM_MAP_EXTERNAL_ALLOCATION_PARAMS.gpuAttributesCount.offset, rm.UVM_REGISTER_CHANNEL_PARAMS.base.offset) == (9240, 32)
  assert (rm.SM_ERRORS.mmuFaultValid.offset, rm.NVOS33_FD.fd.offset, rm.NVOS02_FD.fd.offset) == (4812, 48, 48)
  assert rm.iowr(rm.ESC_RM_ALLOC, 32) == 0xC020462B and rm.iowr(rm.ESC_CARD_INFO, 72 * 64) == 0xD20046C8
  with pytest.raises(Exception, match="not supported"): rm.layout(535)
  # peer access: NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS (32 GPU ids, count, caps, two CE masks, 9 status bytes, two
  # 32x32 peer-id matrices) and UVM's two-UUID peer calls, as ctrl0000system.h and uvm_ioctl.h lay them out
  assert (rm.P2P_CAPS_V2.p2pCaps.offset, rm.P2P_CAPS_V2.p2pCapsStatus.offset, rm.P2P_CAPS_V2.busPeerIds.offset) == (132, 144, 156)
  assert ctypes.sizeof(rm.P2P_CAPS_V2) == 8348 and rm.CTRL_P2P_CAPS_V2 == 0x12B and rm.P2P_READS == 2
  assert (rm.UVM_PEER_ACCESS_PARAMS.gpuUuidB.offset, ctypes.sizeof(rm.UVM_PEER_ACCESS_PARAMS)) == (16, 36)
  assert ctypes.sizeof(rm.UVM_UNREGISTER_GPU_PARAMS) == ctypes.sizeof(rm.UVM_UNREGISTER_GPU_VASPACE_PARAMS) == 20
  assert (rm.UVM_ENABLE_PEER_ACCESS, rm.UVM_DISABLE_PEER_ACCESS, rm.UVM_UNREGISTER_GPU, rm.UVM_UNREGISTER_GPU_VASPACE) == (29, 30, 38, 26)


def test_va_allocator():
  va = VASpace(0x1000, 0x100000)
  a = va.alloc(0x3000, 0x1000)
  b = va.alloc(0x1000, 0x10000)
  assert a == 0x1000 and b == 0x10000
  va.release(a, 0x3000)
  assert va.alloc(0x2000, 0x1000) == 0x1000
  va.release(0x1000, 0x2000); va.release(b, 0x1000)
  assert va.holes == [(0x1000, 0x100000)]
  with pytest.raises(MemoryError): va.alloc(1 << 62, 0x1000)


# ---------------------------------------------------------------- what plugrt says without a GPU

def test_probe_reasons(monkeypatch, tmp_path):
  if has_nv(): pytest.skip("there is an NVIDIA GPU here")
  p = plugrt_nv.probe_nv(PluginContext.from_process())
  assert not p.ok and p.reason is Reason.NO_DEVICE and "/dev/nvidia" in p.detail and p.hint
  assert not plugrt_nv_nvk.probe().ok and "not loaded" in plugrt_nv_nvk.probe().detail
  pci = plugrt_nv_pci.probe(PluginContext.from_process())
  assert not pci.ok and "no NVIDIA GPU on PCI" in pci.detail and "never run on hardware" in pci.detail
  ver = tmp_path / "version"
  ver.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)\n")
  assert plugrt_nv.driver_version(str(ver)) == "580.159.04" and plugrt_nv.driver_version(str(tmp_path / "missing")) is None


def test_device_and_interfaces_in_a_registry(plugrt_registry):
  if has_nv(): pytest.skip("there is an NVIDIA GPU here")
  with plugrt_registry([plugrt_nv, plugrt_nv_nvk, plugrt_nv_pci], env={"NV": "1"}) as reg:
    reg.load()
    assert [i.name for i, _ in reg.interfaces["NV"]] == ["NVK", "PCI"] and not reg.interfaces["NV"][1][0].auto
    with pytest.raises(DeviceUnavailable, match=r"no NVIDIA kernel driver.*\[no device\]"): reg.default  # noqa: B018
  with plugrt_registry([plugrt_nv, plugrt_nv_pci], env={"NV_IFACE": "PCI"}) as reg:
    reg.load()
    assert not reg.interface_probe(reg.interfaces["NV"][0][0]).ok


def test_compiler_specs():
  spec = plugrt_nv.plugrt_backends()[0]
  assert spec.name == "NV" and [c.name for c in spec.compilers] == ["CUDA", "PTX"] and spec.priority < 50  # below CUDA
  from plugrt_nvidia_toolchain import ptxas
  if ptxas.path(os.environ) is not None: assert plugrt_nv.probe_ptxas(PluginContext.from_process()).ok


def test_ptx_through_nvjitlink_matches_ptxas():
  """NV_PTX=1's assembler: nvJitLink in process gives a cubin with the same entry, parameters and registers as ptxas."""
  from plugrt.context import PluginContext
  from plugrt.hookspecs import DeviceInfo
  from plugrt_nv.compiler import PTXCompiler
  from plugrt_nvidia_toolchain import jitlink, ptxas
  if jitlink.path(os.environ) is None or ptxas.path(os.environ) is None: pytest.skip("needs both nvJitLink and ptxas")
  def compiler(assembler: str) -> PTXCompiler:
    ctx = PluginContext({**os.environ, "PLUGRT_NV_ASSEMBLER": assembler})
    return PTXCompiler(DeviceInfo(name="NV", index=0, compiler="PTX", arch="sm_90", context=ctx))
  j, p = compiler("nvjitlink"), compiler("ptxas")
  assert j.jitlink is not None and p.jitlink is None and j.toolchain()[0].startswith("nvjitlink")
  for kern in (K.saxpy_kernel(), K.tiny_kernel()):
    src = p.render(kern)
    a, b = elf.parse(j.compile_uncached(src), kern.name), elf.parse(p.compile_uncached(src), kern.name)
    assert (a.params, a.param_base, a.shared) == (b.params, b.param_base, b.shared)
  with pytest.raises(CompileError, match="nvJitLink failed"): j.compile_uncached(src.replace("ret;", "bogus_op;", 1))
  with pytest.raises(CompileError, match="use ptxas or nvjitlink"): compiler("cuobjdump")


def test_assembler_choice_reads_the_device_context(tmp_path):
  """PLUGRT_NV_ASSEMBLER and PLUGRT_PTXAS come from the device's context, not the process: a fake ptxas named there
  is the one chosen, and a bad choice is refused before anything is looked up."""
  from plugrt.context import PluginContext
  from plugrt.hookspecs import DeviceInfo
  from plugrt_nv.compiler import PTXCompiler
  fake = tmp_path / "ptxas"
  fake.write_text("#!/bin/sh\necho 'fake ptxas 1.0'\n")
  fake.chmod(0o755)
  def info(**env: str) -> DeviceInfo:
    return DeviceInfo(name="NV", index=0, compiler="PTX", arch="sm_90", context=PluginContext(env))
  c = PTXCompiler(info(PLUGRT_NV_ASSEMBLER="ptxas", PLUGRT_PTXAS=str(fake), PATH=""))
  assert c.ptxas == str(fake) and c.jitlink is None and c.toolchain() == ("ptxas fake ptxas 1.0", "sm_90")
  with pytest.raises(CompileError, match="use ptxas or nvjitlink"): PTXCompiler(info(PLUGRT_NV_ASSEMBLER="cuobjdump"))


def test_call_address_relocations():
  """CALL.ABS.NOINC's address field (nvJitLink's linked cubins): ABS55_16_34 holds the address in 4-byte units, its
  low 8 bits at bit 16 and the next 47 at bit 34 of the 128-bit instruction. Other bits stay; a filled field is refused."""
  insn = bytes.fromhex("43790000000000000000c00300ea1f00")
  va = 0x10_2340_0380
  img = bytearray(16) + insn + bytearray(16)
  elf.patch_insn(img, 16, elf.R_CUDA_ABS55_16_34, va)
  n = int.from_bytes(img[16:32], "little")
  assert (n >> 16 & 0xFF | (n >> 34 & (1 << 47) - 1) << 8) << 2 == va and img[:16] == bytes(16) and img[32:] == bytes(16)
  keep = ~((0xFF << 16) | ((1 << 47) - 1) << 34)
  assert n & keep == int.from_bytes(insn, "little") & keep
  with pytest.raises(CompileError, match="not empty"): elf.patch_insn(img, 16, elf.R_CUDA_ABS55_16_34, va)
  with pytest.raises(CompileError, match="does not fit"): elf.patch_insn(bytearray(insn), 0, elf.R_CUDA_ABS55_16_34, va + 2)
