"""AMD_LLVM: kernel IR -> LLVM IR for amdgcn-amd-amdhsa (llvmlite) -> relocatable object -> HSA code object v5.

The renderer is the core's LLVM IR renderer with AMDGPU's conventions:

- the kernel is `define amdgpu_kernel void @NAME(ptr addrspace(1) %buf..., <scalar> %s...)`: buffers are global
  pointers (address space 1), scalars are passed by value in the kernel argument segment (bool as a byte);
- thread ids are llvm.amdgcn.workitem.id.{x,y,z}, group ids llvm.amdgcn.workgroup.id.{x,y,z}; the group size and
  the number of groups come from code object v5's hidden arguments (hidden_group_size_*, hidden_block_count_*,
  read through llvm.amdgcn.implicitarg.ptr, address space 4), which the dispatcher fills in;
- shared arrays are `internal addrspace(3)` globals (LDS), private values allocas in address space 5;
- a barrier is a workgroup-scope release fence, llvm.amdgcn.s.barrier, and an acquire fence (what HIP's
  __syncthreads is), so shared memory written before it is seen after it;
- every IR dtype is native (half and bfloat arithmetic included: LLVM rounds each bfloat op to bfloat);
  float64 EXP2, LOG2 and SIN, which the backend cannot lower, are plugrt's own helpers (plugrt_amd.llvm_math).

The module carries `amdhsa_code_object_version = 500`; ld.lld (-shared) links the relocatable object into the
loadable code object (an ELF shared object), the form ROCm's loader and plugrt's dispatcher take.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
from typing import Any

from plugrt.compiler.ir import Kernel, Ops, UOp
from plugrt.compiler.renderer.llvmir import IRFunction, LLVMRenderer
from plugrt.dtype import DType, dtypes
from plugrt.errors import CompileError, RenderError
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Compiler
from plugrt_amd import hw, llvm_math
from plugrt_amd.iface import GPUInterface
from plugrt_amd.toolchain import LLD_HINT, llvm_tool

TRIPLE = "amdgcn-amd-amdhsa"
OPT_LEVEL = 2
_AXES = "xyz"
#: what LLVM's AMDGPU backend cannot lower: handing it these ends the process (a fatal error, not an exception)
_FATAL = re.compile(r"@llvm\.(exp2|exp|exp10|log2|log|log10|sin|cos|tan|pow|powi)\.f64\b")


class AMDLLVMRenderer(LLVMRenderer):
  device_name = "AMD"
  addrspace = {"global": 1, "shared": 3, "private": 5}
  fn_attrs = "nounwind"
  #: the kernel's attributes: any group size up to 1024, and launches are whole groups (plugrt's global_size counts groups)
  kernel_attrs = 'nounwind "amdgpu-flat-work-group-size"="1,1024" "uniform-work-group-size"="true"'

  def __init__(self, arch: str = hw.DEFAULT_ARCH):
    self.arch = arch

  def spill(self, f: IRFunction, dt: DType, count: str, count_dt: DType) -> str:
    raise RenderError("the AMD renderer got a lowered kernel (SPILL): GPU kernels are rendered as written", "render the kernel unlowered")

  def special(self, f: IRFunction, kind: str, axis: int) -> str:
    a = _AXES[axis]
    if kind in ("local_id", "group_id"):
      name = f"llvm.amdgcn.{'workitem' if kind == 'local_id' else 'workgroup'}.id.{a}"
      return f.op(f"call i32 {f.declare(name, f'declare i32 @{name}()')}()")
    imp = f.op(f"call ptr addrspace(4) {f.declare('llvm.amdgcn.implicitarg.ptr', 'declare ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()')}()")
    if kind == "num_groups":
      p = f.op(f"getelementptr inbounds i8, ptr addrspace(4) {imp}, i64 {hw.HIDDEN_BLOCK_COUNT + 4 * axis}")
      return f.op(f"load i32, ptr addrspace(4) {p}, align 4, !invariant.load !{_empty_node(f)}")
    p = f.op(f"getelementptr inbounds i8, ptr addrspace(4) {imp}, i64 {hw.HIDDEN_GROUP_SIZE + 2 * axis}")
    size = f.op(f"load i16, ptr addrspace(4) {p}, align 2, !invariant.load !{_empty_node(f)}")
    return f.op(f"zext i16 {size} to i32")

  def barrier(self, f: IRFunction) -> None:
    f.emit('fence syncscope("workgroup") release')
    f.emit(f"call void {f.declare('llvm.amdgcn.s.barrier', 'declare void @llvm.amdgcn.s.barrier()')}()")
    f.emit('fence syncscope("workgroup") acquire')

  def shared(self, f: IRFunction, name: str, dt: DType, count: int) -> str:
    g = "@" + name.replace(".", "_")
    f.globals.append(f"{g} = internal addrspace(3) global [{count} x {self.storage_type(dt)}] poison, align 16")
    return g

  def math(self, f: IRFunction, op: Ops, ty: str, x: str) -> str:
    if ty == "double" and op in (Ops.EXP2, Ops.LOG2, Ops.SIN):
      sym, text, decls = llvm_math.helper({Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin"}[op])
      f.decls.setdefault(sym, text)  # module-level text, emitted once
      for k, v in decls.items(): f.decls.setdefault(k, v)
      return f.op(f"call double @{sym}(double {x})")
    return super().math(f, op, ty, x)

  def function(self, f: IRFunction, kernel: Kernel) -> str:
    params: dict[UOp, str] = {}
    args: list[str] = []
    taken: set[str] = set()
    for u in (*kernel.buffers, *kernel.scalars):
      name = u.arg[1]
      while name in taken or re.fullmatch(r"[a-z]+\d+", name): name += "_"  # never one of the renderer's own names
      taken.add(name)
      if u.op is Ops.BUFFER:
        args.append(f"ptr addrspace(1) %{name}")
        params[u] = f"%{name}"
      elif u.dtype is dtypes.bool:  # a byte in the argument segment
        args.append(f"i8 %{name}")
        params[u] = f.op(f"icmp ne i8 %{name}, 0")
      else:
        args.append(f"{self.value_type(u.dtype)} %{name}")
        params[u] = f"%{name}"
    self.emit_body(f, kernel, params)
    f.emit("ret void")
    f.metadata.append(f'!980 = !{{i32 1, !"amdhsa_code_object_version", i32 {hw.CODE_OBJECT_VERSION}00}}')
    f.metadata.append("!llvm.module.flags = !{!980}")
    return self.define(f, f"define amdgpu_kernel void @{kernel.name}({', '.join(args)}) #0") + f"\nattributes #0 = {{ {self.kernel_attrs} }}"


def _empty_node(f: IRFunction) -> int:
  """The metadata number of `!{}` (for !invariant.load), added to the module once."""
  if "!981 = !{}" not in f.metadata: f.metadata.append("!981 = !{}")
  return 981


# ---------------------------------------------------------------- llvmlite with the AMDGPU target

_init_lock = threading.Lock()
_llvm: Any = None


def llvmlite_amdgpu() -> Any:
  """llvmlite.binding with every target initialised (the AMDGPU target is in llvmlite's wheels); CompileError when
  llvmlite is missing or was built without AMDGPU."""
  global _llvm
  if _llvm is None:
    with _init_lock:
      if _llvm is None:
        try:
          import llvmlite.binding as llvm
        except ImportError as e: raise CompileError("llvmlite is not installed", str(e), "pip install llvmlite") from None
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        try: llvm.Target.from_triple(TRIPLE)
        except RuntimeError as e:
          raise CompileError("this llvmlite has no AMDGPU target", str(e), "pip install -U llvmlite (its wheels include AMDGPU)") from None
        _llvm = llvm
  return _llvm


def resolve_arch(device: DeviceInfo) -> str:
  """The arch to build for: DEV's ARCH, else the opened interface's GPU, else hw.DEFAULT_ARCH (compiling without a device)."""
  from plugrt.errors import EnvError, did_you_mean
  iface = device.iface_object
  name = device.arch or (iface.arch if isinstance(iface, GPUInterface) else "") or hw.DEFAULT_ARCH
  try: return hw.lookup(name).name
  except KeyError:
    raise EnvError(f"AMD has no architecture {name!r}{did_you_mean(name, hw.ARCHS)}",
                   f"known: {', '.join(hw.ARCHS)}; e.g. DEV=AMD:LLVM:{hw.DEFAULT_ARCH}") from None


def lld_version(path: str) -> str:
  try: out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
  except (OSError, subprocess.SubprocessError): return "?"
  return out.strip().splitlines()[0] if out.strip() else "?"


def link(obj: bytes, lld: str, what: str) -> bytes:
  """The loadable code object: `obj` (a relocatable AMDGPU object) linked by ld.lld -shared."""
  with tempfile.TemporaryDirectory(prefix="plugrt-amd-") as d:
    src, out = os.path.join(d, "kernel.o"), os.path.join(d, "kernel.co")
    with open(src, "wb") as fh: fh.write(obj)
    try: r = subprocess.run([lld, "-shared", "--no-undefined", "--build-id=none", src, "-o", out], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"{what}: ld.lld ({lld}) could not run: {e}", hint=LLD_HINT) from None
    if r.returncode != 0: raise CompileError(f"{what}: ld.lld failed to link the code object", r.stderr + r.stdout)
    with open(out, "rb") as fh: return fh.read()


class AMDLLVMCompiler(Compiler):
  name = "LLVM"
  cache_namespace = "amd-llvm"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.arch = resolve_arch(device)
    self.renderer = AMDLLVMRenderer(self.arch)
    self.lld = llvm_tool(device.context, "ld.lld")
    if self.lld is None:
      raise CompileError("ld.lld is not installed: AMD_LLVM links its code objects with it", hint=LLD_HINT)
    llvm = self.llvm = llvmlite_amdgpu()
    self.target_machine = llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=self.arch, opt=OPT_LEVEL, reloc="pic")
    self.data_layout = str(self.target_machine.target_data)
    self._tuning = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
    self._lock = threading.Lock()
    self._lld_version = ""

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)

  def toolchain(self) -> tuple[str, ...]:
    import llvmlite
    if not self._lld_version: self._lld_version = lld_version(self.lld)  # type: ignore[arg-type]
    return (f"llvmlite {llvmlite.__version__}", "LLVM " + ".".join(map(str, self.llvm.llvm_version_info)), TRIPLE, self.arch,
            f"code object v{hw.CODE_OBJECT_VERSION}", f"O{OPT_LEVEL}", self._lld_version)

  def compile_object(self, src: str) -> bytes:
    """The relocatable object of LLVM IR `src` (before linking)."""
    if (m := _FATAL.search(src)):
      raise CompileError(f"AMD_LLVM: the AMDGPU backend cannot lower {m.group(0)[1:]} (LLVM would end the process)",
                         hint="render float64 transcendentals with plugrt_amd.llvm_math's helpers")
    llvm = self.llvm
    with self._lock:
      ctx = llvm.create_context()
      try:
        mod = llvm.parse_assembly(src, ctx)
        mod.verify()
      except RuntimeError as e:
        raise CompileError("LLVM rejected an AMD kernel's IR", str(e),
                           "this is a renderer bug if the kernel came from plugrt's IR; please report it") from None
      try:
        mod.triple, mod.data_layout = TRIPLE, self.data_layout
        pb = llvm.create_pass_builder(self.target_machine, self._tuning)
        pb.getModulePassManager().run(mod, pb)
        return self.target_machine.emit_object(mod)
      finally: mod.close()

  def compile_uncached(self, src: str) -> bytes:
    return link(self.compile_object(src), self.lld, f"AMD_LLVM ({self.arch})")  # type: ignore[arg-type]
