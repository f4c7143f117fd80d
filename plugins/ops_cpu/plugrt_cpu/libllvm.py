"""An opt-in LLVM compiler on the system's release-built libLLVM, through LLVM's C API by ctypes.

llvmlite (the default, pip-installable everywhere) ships an LLVM built with assertions on; a distribution's
libLLVM is a release build, and compiles a small kernel in about two thirds of the time (docs/performance.md).
PLUGRT_CPU_LIBLLVM=system picks the newest libLLVM (version 15 or later: the IR uses opaque pointers) under the
usual library directories, PLUGRT_CPU_LIBLLVM=/path/to/libLLVM.so that one. It renders the same IR as the
llvmlite compiler, runs the same `default<O2>` pipeline with the same tuning, and emits the same kind of object
(no PIC, the large code model), which plugrt_cpu.llvm.load_object links (llvmlite's JIT still loads it: objects
are plain ELF). Its cache entries are its own: the library's path and version are part of the key.

C API facts (enum values, ownership) are from LLVM's llvm-c headers: TargetMachine.h (LLVMCodeGenOptLevel,
LLVMRelocMode, LLVMCodeModel, LLVMCodeGenFileType), Analysis.h (LLVMVerifierFailureAction), IRReader.h
(LLVMParseIRInContext takes the memory buffer), Transforms/PassBuilder.h (LLVMRunPasses, the options).
"""
from __future__ import annotations

import ctypes
import glob
import os
import platform
import re
import threading
from typing import Any

from plugrt.errors import CompileError
from plugrt.hookspecs import DeviceInfo
from plugrt_cpu.llvm import OPT_LEVEL, STRAIGHT_LINE_RULE, CPULLVMRenderer, LLVMCompiler, straight_line
from plugrt_cpu.span import RenderedSources

VARIABLE = "PLUGRT_CPU_LIBLLVM"
MIN_VERSION = 15  # opaque pointers (`ptr`) by default
_SEARCH = ("/usr/lib/llvm-*/lib", "/usr/lib/*-linux-gnu*", "/usr/lib64", "/usr/local/lib", "/usr/lib")
_VERSION = re.compile(r"libLLVM(?:-(\d+)(?:\.[\d.]*)?\.so|\.so\.(\d+))")
# llvm-c/TargetMachine.h, llvm-c/Analysis.h
CODEGEN_NONE, CODEGEN_DEFAULT, RELOC_STATIC, CODE_MODEL_LARGE, OBJECT_FILE, RETURN_STATUS = 0, 2, 1, 6, 1, 2
_ARCH = {"x86_64": "X86", "amd64": "X86", "aarch64": "AArch64", "arm64": "AArch64", "riscv64": "RISCV", "ppc64le": "PowerPC"}


def library_version(path: str) -> int | None:
  """The major version in a libLLVM file name (libLLVM-19.so, libLLVM.so.19.1), or None."""
  m = _VERSION.search(os.path.basename(path))
  return int(m.group(1) or m.group(2)) if m else None


def find_libllvm(setting: str) -> tuple[str | None, str]:
  """(path, "") of the libLLVM that `setting` (PLUGRT_CPU_LIBLLVM's value) names, or (None, why not)."""
  if setting != "system":
    if not os.path.isabs(setting): return None, f"{VARIABLE}={setting!r} is neither 'system' nor an absolute path to libLLVM"
    if not os.path.isfile(setting): return None, f"{VARIABLE}={setting}: no such file"
    v = library_version(setting)
    if v is not None and v < MIN_VERSION: return None, f"{setting} is LLVM {v}; plugrt's IR needs LLVM {MIN_VERSION} or later"
    return setting, ""
  found: dict[str, int] = {}
  for pattern in _SEARCH:
    for path in glob.glob(os.path.join(pattern, "libLLVM*.so*")):
      if (v := library_version(path)) is not None and v >= MIN_VERSION and os.path.isfile(path):
        found.setdefault(os.path.realpath(path), v)
  if not found: return None, f"no libLLVM {MIN_VERSION} or later in {', '.join(_SEARCH)}"
  return max(found, key=lambda p: (found[p], p)), ""


class LibLLVM:
  """The C API functions plugrt uses, bound once per library."""

  def __init__(self, path: str):
    self.path, self.version = path, library_version(path)
    lib = self.lib = ctypes.CDLL(path)
    P, S, B, I, U = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_size_t
    PP = ctypes.POINTER(ctypes.c_void_p)
    for name, res, args in (
        ("LLVMContextCreate", P, ()), ("LLVMContextDispose", None, (P,)),
        ("LLVMCreateMemoryBufferWithMemoryRangeCopy", P, (S, U, S)),
        ("LLVMParseIRInContext", B, (P, P, PP, PP)), ("LLVMVerifyModule", B, (P, I, PP)),
        ("LLVMSetTarget", None, (P, S)), ("LLVMSetDataLayout", None, (P, S)), ("LLVMDisposeModule", None, (P,)),
        ("LLVMGetTargetFromTriple", B, (S, PP, PP)), ("LLVMCreateTargetMachine", P, (P, S, S, S, I, I, I)),
        ("LLVMCreateTargetDataLayout", P, (P,)), ("LLVMCopyStringRepOfTargetData", P, (P,)), ("LLVMDisposeTargetData", None, (P,)),
        ("LLVMGetDefaultTargetTriple", P, ()), ("LLVMGetHostCPUName", P, ()), ("LLVMGetHostCPUFeatures", P, ()), ("LLVMDisposeMessage", None, (P,)),
        ("LLVMCreatePassBuilderOptions", P, ()), ("LLVMPassBuilderOptionsSetLoopInterleaving", None, (P, B)),
        ("LLVMPassBuilderOptionsSetLoopVectorization", None, (P, B)), ("LLVMPassBuilderOptionsSetSLPVectorization", None, (P, B)),
        ("LLVMPassBuilderOptionsSetLoopUnrolling", None, (P, B)), ("LLVMRunPasses", P, (P, S, P, P)),
        ("LLVMGetErrorMessage", P, (P,)), ("LLVMDisposeErrorMessage", None, (P,)),
        ("LLVMTargetMachineEmitToMemoryBuffer", B, (P, P, I, PP, PP)),
        ("LLVMGetBufferStart", P, (P,)), ("LLVMGetBufferSize", U, (P,)), ("LLVMDisposeMemoryBuffer", None, (P,))):
      fn = getattr(lib, name)
      fn.restype, fn.argtypes = res, list(args)
    arch = _ARCH.get(platform.machine().lower())
    if arch is None: raise CompileError(f"libLLVM: plugrt does not know LLVM's target for {platform.machine()}")
    for part in ("TargetInfo", "Target", "TargetMC", "AsmPrinter"): getattr(lib, f"LLVMInitialize{arch}{part}")()

  def message(self, ptr: int | None) -> str:
    """A C string LLVM allocated, copied and disposed."""
    if not ptr: return ""
    try: return ctypes.string_at(ptr).decode(errors="replace")
    finally: self.lib.LLVMDisposeMessage(ptr)


_libs: dict[str, LibLLVM] = {}
_libs_lock = threading.Lock()


def libllvm(path: str) -> LibLLVM:
  with _libs_lock:
    if path not in _libs: _libs[path] = LibLLVM(path)
    return _libs[path]


class LibLLVMCompiler(LLVMCompiler):
  """The LLVM compiler's IR, pipeline and objects, compiled by the system's libLLVM (see the module doc)."""

  def __init__(self, device: DeviceInfo, path: str):  # not the base's __init__: it builds llvmlite's target machine
    from plugrt.runtime import Compiler
    Compiler.__init__(self, device)
    self.renderer = CPULLVMRenderer()
    self.rendered = RenderedSources()  # for the span variants (plugrt_cpu.span)
    self.api = api = libllvm(path)
    lib = api.lib
    self.triple = api.message(lib.LLVMGetDefaultTargetTriple())  # the host's: llvmlite (slow to import) is not needed
    self.cpu, self.features = api.message(lib.LLVMGetHostCPUName()), api.message(lib.LLVMGetHostCPUFeatures())
    target, err = ctypes.c_void_p(), ctypes.c_void_p()
    if lib.LLVMGetTargetFromTriple(self.triple.encode(), ctypes.byref(target), ctypes.byref(err)):
      raise CompileError(f"libLLVM {path} has no target for {self.triple}", api.message(err.value))
    self.tm = lib.LLVMCreateTargetMachine(target, self.triple.encode(), self.cpu.encode(), self.features.encode(), CODEGEN_DEFAULT,
                                          RELOC_STATIC, CODE_MODEL_LARGE)
    self.straight_line_tm = lib.LLVMCreateTargetMachine(target, self.triple.encode(), self.cpu.encode(), self.features.encode(),
                                                        CODEGEN_NONE, RELOC_STATIC, CODE_MODEL_LARGE)  # see llvm.straight_line
    td = lib.LLVMCreateTargetDataLayout(self.tm)
    self.data_layout = api.message(lib.LLVMCopyStringRepOfTargetData(td))
    lib.LLVMDisposeTargetData(td)
    # the tuning llvmlite's create_pipeline_tuning_options(speed_level=2) gives (the same kernels come out)
    self.options = opts = lib.LLVMCreatePassBuilderOptions()
    lib.LLVMPassBuilderOptionsSetLoopInterleaving(opts, 1)
    lib.LLVMPassBuilderOptionsSetLoopVectorization(opts, 1)
    lib.LLVMPassBuilderOptionsSetSLPVectorization(opts, 0)
    lib.LLVMPassBuilderOptionsSetLoopUnrolling(opts, 1)
    self._passes = f"default<O{OPT_LEVEL}>".encode()
    self._lock = threading.Lock()  # one compile at a time: the target machine is shared

  def toolchain(self) -> tuple[str, ...]:
    st = os.stat(self.api.path)
    return (f"libLLVM {self.api.path}:{st.st_size}:{int(st.st_mtime)}", self.triple, self.cpu, self.features,
            f"O{OPT_LEVEL} reloc=static codemodel=large", STRAIGHT_LINE_RULE)

  def compile_uncached(self, src: str) -> bytes:
    api = self.api
    lib = api.lib
    data = src.encode()
    with self._lock:
      ctx = lib.LLVMContextCreate()  # a context per module: nothing accumulates across compiles
      try:
        buf = lib.LLVMCreateMemoryBufferWithMemoryRangeCopy(data, len(data), b"kernel")
        mod, err = ctypes.c_void_p(), ctypes.c_void_p()
        if lib.LLVMParseIRInContext(ctx, buf, ctypes.byref(mod), ctypes.byref(err)):  # owns buf from here on
          raise CompileError("LLVM rejected a CPU kernel's IR", api.message(err.value),
                             "this is a renderer bug if the kernel came from plugrt's IR; please report it")
        try:
          if lib.LLVMVerifyModule(mod, RETURN_STATUS, ctypes.byref(err)):
            raise CompileError("LLVM rejected a CPU kernel's IR", api.message(err.value),
                               "this is a renderer bug if the kernel came from plugrt's IR; please report it")
          api.message(err.value)
          lib.LLVMSetTarget(mod, self.triple.encode())
          lib.LLVMSetDataLayout(mod, self.data_layout.encode())
          if e := lib.LLVMRunPasses(mod, self._passes, self.tm, self.options):
            msg = lib.LLVMGetErrorMessage(e)
            try: why = ctypes.string_at(msg).decode(errors="replace")
            finally: lib.LLVMDisposeErrorMessage(msg)
            raise CompileError(f"libLLVM's {self._passes.decode()} pipeline failed", why)
          out = ctypes.c_void_p()
          tm = self.straight_line_tm if straight_line(src) else self.tm
          if lib.LLVMTargetMachineEmitToMemoryBuffer(tm, mod, OBJECT_FILE, ctypes.byref(err), ctypes.byref(out)):
            raise CompileError("libLLVM failed to emit a CPU kernel's object", api.message(err.value))
          try: return ctypes.string_at(lib.LLVMGetBufferStart(out), lib.LLVMGetBufferSize(out))
          finally: lib.LLVMDisposeMemoryBuffer(out)
        finally: lib.LLVMDisposeModule(mod)
      finally: lib.LLVMContextDispose(ctx)


def make_compiler(device: DeviceInfo, setting: str) -> Any:
  path, why = find_libllvm(setting)
  if path is None: raise CompileError(f"the LLVM compiler cannot use libLLVM: {why}", hint=f"unset {VARIABLE} to use llvmlite")
  return LibLLVMCompiler(device, path)
