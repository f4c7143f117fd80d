"""The LLVM compiler of the CPU: kernel IR -> LLVM IR -> ELF object (llvmlite), linked in-process by MCJIT.

The renderer is the core's LLVM renderer with the CPU calling convention shared with
the C renderer (see plugrt_cpu.program):

    void NAME(ptr %args, i32 %gid0, i32 %gid1, i32 %gid2)

args holds the buffer addresses, one 8-byte slot per scalar, then the number of
groups and the group size per axis; the function runs one group. The kernel is first
lowered (plugrt.compiler.lowering.serialize_groups) so that one call runs a group's threads; the
grid is run by plugrt_cpu.grid's runner (a kernel has no loop over groups: that loop
was half of a small kernel's compile time). float16/bfloat16 are emulated (held as float,
rounded after every op), because LLVM's own half conversions call compiler-rt
functions that an in-process JIT cannot resolve.

The compiler optimises at O2 with the host CPU's features and emits a relocatable
object (ET_REL), which is what the disk cache stores. A straight-line module (every function one basic
block: no loop, no branch, see straight_line) is given to code generation at LLVM's lowest level: for one
block the fast instruction selector and register allocator give the same instructions, less two register
moves, in less time (docs/performance.md); the O2 IR pipeline
still runs on it. load_object load_object links one into the
process with a fresh MCJIT engine per program, so two kernels with the same name
never see each other's code.
"""
from __future__ import annotations

import struct
import threading
import warnings
from typing import Any

from plugrt.compiler.ir import Kernel, Ops, UOp
from plugrt.compiler.lowering import THREAD_LOOP, serialize_groups
from plugrt.compiler.renderer.llvmir import IRFunction, LLVMRenderer
from plugrt.dtype import DType, dtypes
from plugrt.errors import CompileError, PluginError, RenderError
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Compiler
from plugrt_cpu.span import RenderedSources
from plugrt_cpu.toolchain import MAX_SHARED_BYTES

OPT_LEVEL = 2
#: a straight-line module up to this many lines of IR is code-generated at level 0 (see the module doc); a larger
#: block, where the fast register allocator's simpler spilling could cost run time, gets the O2 code generator
STRAIGHT_LINE_MAX_LINES = 400
STRAIGHT_LINE_RULE = f"codegen O0 for straight-line modules of <= {STRAIGHT_LINE_MAX_LINES} lines"  # part of the cache key
# Every address is absolute in the large code model: the JIT may place code, constants and
# libm's functions anywhere in the address space, and RuntimeDyld then needs no 32-bit reach.
RELOC, CODE_MODEL = "static", "large"


class CPULLVMRenderer(LLVMRenderer):
  device_name = "CPU"
  emulated = frozenset({dtypes.float16, dtypes.bfloat16})
  vector_align = False  # an unaligned vector move: a vector access the caller failed to align still gives the right elements

  def prepare(self, kernel: Kernel) -> Kernel:
    if kernel.has_barrier or any(u.op is Ops.SPECIAL and u.arg[0] == "local_id" for u in kernel.uops):
      return serialize_groups(kernel)
    return kernel

  def plain_loop(self, rng: UOp) -> bool:  # the outer thread loops (y, z) rarely run more than once
    return rng.arg in (THREAD_LOOP + (1,), THREAD_LOOP + (2,))

  def special(self, f: IRFunction, kind: str, axis: int) -> str:
    if kind == "local_id": raise RenderError("CPU renderer got a kernel with local_id: lower it with serialize_groups first")
    return {"group_id": "%gid", "num_groups": "%ng", "local_size": "%ls"}[kind] + str(axis)

  def barrier(self, f: IRFunction) -> None:
    raise RenderError("CPU renderer got a kernel with a barrier: lower it with serialize_groups first")

  def _scalar(self, f: IRFunction, slot: str, dt: DType, name: str) -> str:
    """A scalar parameter from its 8-byte slot (two's complement ints, float bits in the low half)."""
    if dt is dtypes.bool: return f.op(f"icmp ne i64 {slot}, 0", name)
    if dt in self.emulated: return self.from_storage(f, dt, f.op(f"trunc i64 {slot} to i16"))
    if dt is dtypes.float64: return f.op(f"bitcast i64 {slot} to double", name)
    if dt is dtypes.float32: return f.op(f"bitcast i32 {f.op(f'trunc i64 {slot} to i32')} to float", name)
    return slot if dt.bits == 64 else f.op(f"trunc i64 {slot} to {self.value_type(dt)}", name)

  def function(self, f: IRFunction, kernel: Kernel) -> str:
    params: dict[UOp, str] = {}
    nslot = 0

    def slot(name: str, ty: str = "i64") -> str:  # the next 8-byte slot of args
      nonlocal nslot
      addr = "%args" if nslot == 0 else f.op(f"getelementptr inbounds i64, ptr %args, i64 {nslot}")
      nslot += 1
      return f.op(f"load {ty}, ptr {addr}, align 8", f"%{name}")

    for b in kernel.buffers: params[b] = slot(f"b{b.arg[0]}.{b.arg[1]}", "ptr")
    for s in kernel.scalars: params[s] = self._scalar(f, slot(f"slot{nslot}"), s.dtype, f"%s{s.arg[0]}.{s.arg[1]}")
    # the launch sizes the kernel reads, and only those: every instruction costs parse and pipeline time
    used = {u.arg for u in kernel.uops if u.op is Ops.SPECIAL}
    for k, d in enumerate(("ng0", "ng1", "ng2", "ls0", "ls1", "ls2")):
      if (("num_groups", "local_size")[k // 3], k % 3) not in used: continue
      addr = f.op(f"getelementptr inbounds i64, ptr %args, i64 {nslot + k}")
      f.op(f"trunc i64 {f.op(f'load i64, ptr {addr}, align 8', f'%{d}.64')} to i32", f"%{d}")
    # one group per call: a SPILL array (a dynamic alloca) is given back when the call returns
    self.emit_body(f, kernel, params)
    f.emit("ret void")
    # args is read-only and no buffer overlaps it: the slot loads stay out of the thread loops
    return self.define(f, f"define void @{kernel.name}(ptr noalias readonly %args, i32 %gid0, i32 %gid1, i32 %gid2) {self.fn_attrs}")


def straight_line(src: str) -> bool:
  """Whether LLVM IR text `src` is straight-line code of at most STRAIGHT_LINE_MAX_LINES lines: no branch of any kind
  (`br`, `switch`, `indirectbr`, `callbr`, `invoke`), so every function is one basic block before and after the IR
  pipeline (which adds no control flow to such a function)."""
  return src.count("\n") <= STRAIGHT_LINE_MAX_LINES and not any(t in src for t in (" br ", " switch ", " indirectbr ", " callbr ", " invoke "))


# ---------------------------------------------------------------- llvmlite, initialised once

_init_lock = threading.Lock()
_llvm: Any = None


def llvmlite_binding() -> Any:
  """llvmlite.binding with the native target and asm printer initialised (once per process)."""
  global _llvm
  if _llvm is None:
    with _init_lock:
      if _llvm is None:
        try:
          import llvmlite.binding as llvm
        except ImportError as e:
          raise CompileError("llvmlite is not installed", str(e), "pip install llvmlite") from None
        try:  # older llvmlite needs this; newer ones initialise the LLVM core themselves and raise here
          with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            llvm.initialize()
        except RuntimeError: pass
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        _llvm = llvm
  return _llvm


_host_target: tuple[str, str, str] | None = None


def host_target() -> tuple[str, str, str]:
  """(triple, CPU name, CPU features) of this machine, looked up once (asking LLVM for the features is not free)."""
  global _host_target
  if _host_target is None:
    llvm = llvmlite_binding()
    _host_target = (llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())
  return _host_target


def _target_machine(host_cpu: bool = True, jit: bool = False, opt: int = OPT_LEVEL) -> Any:
  llvm = llvmlite_binding()
  triple, cpu, features = host_target()
  if not host_cpu: cpu = features = ""
  return llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=opt, reloc=RELOC,
                                                                 codemodel=CODE_MODEL, jit=jit)


class LLVMCompiler(Compiler):
  name = "LLVM"
  cache_namespace = "cpu-llvm"
  max_shared_bytes = MAX_SHARED_BYTES

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    self.renderer = CPULLVMRenderer()
    self.rendered = RenderedSources()  # for the span variants (plugrt_cpu.span)
    llvm = self.llvm = llvmlite_binding()
    self.triple, self.cpu, self.features = host_target()
    self.target_machine = _target_machine()
    self.straight_line_machine = _target_machine(opt=0)  # code generation of straight-line modules (see straight_line)
    self.data_layout = str(self.target_machine.target_data)
    self._tuning = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
    self._lock = threading.Lock()  # one LLVM compile at a time per compiler: the target machine is shared

  def render(self, kernel: Kernel) -> str:
    src = self.renderer.render(kernel)
    self.rendered.remember(kernel.name, src)
    return src

  def toolchain(self) -> tuple[str, ...]:
    import llvmlite
    return (f"llvmlite {llvmlite.__version__}", "LLVM " + ".".join(map(str, self.llvm.llvm_version_info)), self.triple,
            self.cpu, self.features, f"O{OPT_LEVEL} reloc={RELOC} codemodel={CODE_MODEL}", STRAIGHT_LINE_RULE)

  def compile_uncached(self, src: str) -> bytes:
    llvm = self.llvm
    with self._lock:
      ctx = llvm.create_context()  # a context per module: nothing accumulates across compiles
      try:
        mod = llvm.parse_assembly(src, ctx)
        mod.verify()
      except RuntimeError as e:
        raise CompileError("LLVM rejected a CPU kernel's IR", str(e),
                           "this is a renderer bug if the kernel came from plugrt's IR; please report it") from None
      try:
        mod.triple, mod.data_layout = self.triple, self.data_layout
        # a pass builder per run: llvmlite registers per-run instrumentation on it, so reusing one is unsafe
        pb = llvm.create_pass_builder(self.target_machine, self._tuning)
        pb.getModulePassManager().run(mod, pb)
        return (self.straight_line_machine if straight_line(src) else self.target_machine).emit_object(mod)
      finally: mod.close()


# ---------------------------------------------------------------- loading

def object_symbols(obj: bytes) -> tuple[list[str], list[str]]:
  """(defined, undefined) global symbols of an ELF64 little-endian object."""
  shoff, = struct.unpack_from("<Q", obj, 0x28)
  shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
  sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
  defined: list[str] = []
  undefined: list[str] = []
  for _, sh_type, _, _, off, size, link, _, _, entsize in sections:
    if sh_type != 2 or not entsize: continue  # SHT_SYMTAB
    stroff = sections[link][4]
    for pos in range(off + entsize, off + size, entsize):  # entry 0 is the null symbol
      st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", obj, pos)
      if st_info >> 4 in (1, 2) and st_name:  # STB_GLOBAL or STB_WEAK
        (undefined if st_shndx == 0 else defined).append(obj[stroff + st_name:obj.index(b"\0", stroff + st_name)].decode())
  return defined, undefined


_load_lock = threading.Lock()


class JITProgram:
  """Owns one MCJIT engine (and with it the code of one program); the code is freed with it."""
  __slots__ = ("engine", "lib")

  def __init__(self, engine: Any, lib: bytes): self.engine, self.lib = engine, lib


def load_object(lib: bytes, name: str) -> tuple[int, object]:
  """Link an ELF relocatable object into this process; returns (address of `name`, owner of the code).

  Every call makes its own engine: symbols are looked up in that engine only, so another
  program with a function of the same name can never be returned.
  """
  llvm = llvmlite_binding()
  if lib[:6] != b"\x7fELF\x02\x01": raise PluginError(f"CPU program {name}: the binary is not a 64-bit little-endian ELF object")
  defined, undefined = object_symbols(lib)
  if name not in defined: raise PluginError(f"CPU program {name}: the object defines no function {name!r}")
  with _load_lock:  # engine creation and linking touch LLVM's process-wide symbol tables
    # MCJIT wants a module and a target machine, and owns both. It compiles nothing here (the module is
    # taken out again), so a generic target machine will do: far cheaper to make than one with the host's features
    empty = llvm.parse_assembly("")
    engine = llvm.create_mcjit_compiler(empty, _target_machine(host_cpu=False, jit=True))
    engine.remove_module(empty)  # else finalize_object runs the whole codegen pipeline on it
    # an unresolved symbol is a fatal error (abort) inside MCJIT: check first, and raise instead
    missing = [s for s in undefined if not llvm.address_of_symbol(s)]
    if missing:
      raise PluginError(f"CPU program {name} needs symbols this process does not have: {', '.join(missing)}",
                        "the kernel calls a runtime function (compiler-rt?) that the in-process JIT cannot link; use CLANG")
    engine.add_object_file(llvm.ObjectFileRef.from_data(lib))
    engine.finalize_object()
    addr = engine.get_function_address(name)
  if not addr: raise PluginError(f"CPU program {name}: MCJIT did not find {name!r} in the object")
  return addr, JITProgram(engine, lib)
