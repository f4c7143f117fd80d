"""AMD_HIP: kernel IR -> HIP C (the core's C-like renderer) -> code object, through ROCm's hiprtc (ctypes).

The source needs no header, so the same text compiles under hiprtc and under a plain clang in HIP mode with no
ROCm (`clang -x hip -nogpuinc -nogpulib`, how the tests check it): attributes are spelled as clang's
(`__attribute__((global))`, `((shared))`, `((device))`), thread and group ids are amdgcn builtins, the group
size and group count come from code object v5's hidden arguments (`__builtin_amdgcn_implicitarg_ptr`), math is
the ROCm device library's (`__ocml_exp2_f32`, ...; hiprtc links it), and FP contraction is off (`#pragma clang
fp contract(off)`: each op rounds, as the IR says). float16 is `_Float16`; bfloat16 values are held as float and
stored as 16 raw bits, rounded after every op by exact integer helpers. Vector access (VLOAD/VSTORE) goes through
clang's ext_vector_type of the storage type, aligned to its size as the IR guarantees (global_load_dwordx4).
"""
from __future__ import annotations

import ctypes
from typing import Any

from plugrt.compiler.ir import Kernel, Ops
from plugrt.compiler.renderer.cstyle import MATH_NAMES, CStyleRenderer
from plugrt.dtype import DType, dtypes
from plugrt.errors import CompileError
from plugrt.hookspecs import DeviceInfo
from plugrt.runtime import Compiler
from plugrt_amd import hw
from plugrt_amd.toolchain import HIP_HINT, hiprtc_path

D = "__attribute__((device, always_inline)) static inline"
PRELUDE = f"""#pragma clang fp contract(off)
{D} float __plugrt_bf2f(unsigned short b) {{ return __builtin_bit_cast(float, (unsigned int)b << 16); }}
{D} unsigned short __plugrt_f2bf(float f) {{
  unsigned int u = __builtin_bit_cast(unsigned int, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 64u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}}
{D} float __plugrt_rbf(float f) {{ return __plugrt_bf2f(__plugrt_f2bf(f)); }}
{D} int __plugrt_group_size(int axis) {{
  return (int)((const unsigned short*)__builtin_amdgcn_implicitarg_ptr())[{hw.HIDDEN_GROUP_SIZE // 2} + axis];
}}
{D} int __plugrt_num_groups(int axis) {{
  return (int)((const unsigned int*)__builtin_amdgcn_implicitarg_ptr())[{hw.HIDDEN_BLOCK_COUNT // 4} + axis];
}}
"""
#: the ROCm device library (ocml) functions the source calls, declared here so no header is needed
_OCML = {"f16": "_Float16", "f32": "float", "f64": "double"}


def ocml_decls() -> str:
  out = []
  for sfx, ty in _OCML.items():
    out += [f'extern "C" __attribute__((device, const)) {ty} __ocml_{n}_{sfx}({ty});' for n in (*MATH_NAMES.values(),)]
    out += [f'extern "C" __attribute__((device, const)) {ty} __ocml_{n}_{sfx}({ty}, {ty});' for n in ("fmax", "fmin")]
  return "\n".join(out)


class HIPRenderer(CStyleRenderer):
  language = "HIP C"
  device_name = "AMD"
  bool_type = "bool"
  emulated = {dtypes.bfloat16: ("__plugrt_bf2f", "__plugrt_f2bf", "__plugrt_rbf")}

  def type_name(self, dt: DType) -> str:
    if dt is dtypes.float16: return "_Float16"
    return super().type_name(dt)

  def vector_type(self, dt: DType, width: int) -> str: return self.clang_vector_type(dt, width)
  def vector_typedefs(self, kernel: Kernel) -> list[str]: return self.clang_vector_typedefs(kernel)

  def _sfx(self, dt: DType) -> str: return {dtypes.float16: "f16", dtypes.float64: "f64"}.get(dt, "f32")  # bfloat16 values are floats

  float_from_bits = ("__builtin_bit_cast(float, {})", "__builtin_bit_cast(double, {}LL)")

  def literal(self, x: Any, dt: DType) -> str:
    if dt is dtypes.bool: return "true" if x else "false"
    return super().literal(x, dt)

  def special(self, kind: str, axis: int) -> str:
    a = "xyz"[axis]
    if kind == "local_id": return f"((int)__builtin_amdgcn_workitem_id_{a}())"
    if kind == "group_id": return f"((int)__builtin_amdgcn_workgroup_id_{a}())"
    return f"__plugrt_{'group_size' if kind == 'local_size' else 'num_groups'}({axis})"

  def barrier(self) -> str:
    return ('__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); '
            '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");')

  def shared_decl(self, name: str, dt: DType, count: int) -> str: return f"__attribute__((shared)) {self.storage_type(dt)} {name}[{count}];"

  def math_fn(self, op: Ops, dt: DType, x: str) -> str:
    if op is Ops.RECIP: return f"((({self.type_name(dt)})1)/{x})" if dt not in self.emulated else f"(1.0f/{x})"
    return f"__ocml_{MATH_NAMES[op]}_{self._sfx(dt)}({x})"

  def max_min(self, op: Ops, dt: DType, a: str, b: str) -> str:
    if dt.kind == "f": return f"__ocml_f{'max' if op is Ops.MAX else 'min'}_{self._sfx(dt)}({a}, {b})"
    return super().max_min(op, dt, a, b)

  def reinterpret(self, name: str, x: str, src_type: str, dst_type: str) -> list[str]:
    return [f"{dst_type} {name} = __builtin_bit_cast({dst_type}, {x});"]

  def scalar_param(self, name: str, dt: DType) -> str:
    return f"unsigned short {name}_raw" if dt in self.emulated else f"{self.type_name(dt)} {name}"

  def kernel(self, name: str, params: list[str], body: list[str], kernel: Kernel) -> str:
    names = self.param_names(kernel)
    unpack = [f"  float {names[s]} = {self.from_storage(s.dtype, names[s] + '_raw')};" for s in kernel.scalars if s.dtype in self.emulated]
    return "\n".join(["/* generated by plugrt: AMD HIP kernel */", PRELUDE, ocml_decls(),
                      f'extern "C" __attribute__((global)) void {name}({", ".join(params)}) {{', *unpack, *body, "}", ""])


# ---------------------------------------------------------------- hiprtc

#: options for every compile: no FP contraction (each op rounds), code object v5 (the hidden-argument layout the source reads)
OPTIONS = ("-O3", "-ffp-contract=off", "-mcode-object-version=5")


class HIPRTC:
  """libhiprtc.so through ctypes (the five calls a compile needs)."""

  def __init__(self, path: str):
    self.path = path
    try: self.lib = lib = ctypes.CDLL(path)
    except OSError as e: raise CompileError(f"hiprtc ({path}) failed to load: {e}", hint=HIP_HINT) from None
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.hiprtcCreateProgram.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, vp, vp]
    lib.hiprtcCompileProgram.argtypes = [vp, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.hiprtcGetProgramLogSize.argtypes = [vp, ctypes.POINTER(sz)]
    lib.hiprtcGetProgramLog.argtypes = [vp, ctypes.c_char_p]
    lib.hiprtcGetCodeSize.argtypes = [vp, ctypes.POINTER(sz)]
    lib.hiprtcGetCode.argtypes = [vp, ctypes.c_char_p]
    lib.hiprtcDestroyProgram.argtypes = [ctypes.POINTER(vp)]
    lib.hiprtcGetErrorString.restype = ctypes.c_char_p

  def version(self) -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    if getattr(self.lib, "hiprtcVersion", None) is None or self.lib.hiprtcVersion(ctypes.byref(major), ctypes.byref(minor)): return "?"
    return f"{major.value}.{minor.value}"

  def _check(self, status: int, what: str, log: str = "") -> None:
    if status: raise CompileError(f"hiprtc {what} failed: {self.lib.hiprtcGetErrorString(status).decode(errors='replace')} ({status})", log)

  def compile(self, src: str, name: str, options: tuple[str, ...]) -> bytes:
    prog = ctypes.c_void_p()
    self._check(self.lib.hiprtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.hip".encode(), 0, None, None), "create")
    try:
      opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
      status = self.lib.hiprtcCompileProgram(prog, len(options), opts)
      if status:
        n = ctypes.c_size_t()
        self.lib.hiprtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value + 1)
        self.lib.hiprtcGetProgramLog(prog, buf)
        self._check(status, f"compile of {name}", buf.value.decode(errors="replace"))
      n = ctypes.c_size_t()
      self._check(self.lib.hiprtcGetCodeSize(prog, ctypes.byref(n)), "code size")
      buf = ctypes.create_string_buffer(n.value)
      self._check(self.lib.hiprtcGetCode(prog, buf), "code")
      return buf.raw
    finally: self.lib.hiprtcDestroyProgram(ctypes.byref(prog))


class HIPCompiler(Compiler):
  name = "HIP"
  cache_namespace = "amd-hiprtc"

  def __init__(self, device: DeviceInfo):
    super().__init__(device)
    from plugrt_amd.llvm import resolve_arch
    self.arch = resolve_arch(device)
    self.renderer = HIPRenderer()
    path = hiprtc_path(device.context)
    if path is None: raise CompileError("ROCm's hiprtc (libhiprtc.so) is not installed: AMD_HIP compiles through it", hint=HIP_HINT)
    self.hiprtc = HIPRTC(path)

  def render(self, kernel: Kernel) -> str: return self.renderer.render(kernel)
  def options(self) -> tuple[str, ...]: return (f"--offload-arch={self.arch}", *OPTIONS)
  def toolchain(self) -> tuple[str, ...]: return (f"hiprtc {self.hiprtc.version()}", self.hiprtc.path, self.arch, " ".join(self.options()))

  def compile_uncached(self, src: str) -> bytes:
    name = src.split("__attribute__((global)) void ", 1)[-1].split("(", 1)[0].strip() or "kernel"
    return self.hiprtc.compile(src, name, self.options())
