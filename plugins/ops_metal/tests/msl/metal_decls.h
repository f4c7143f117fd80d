// A small model of the Metal Shading Language for checking plugrt's generated MSL with a C++ compiler:
//   clang++ -fsyntax-only -std=c++17 -Wno-unknown-attributes -I <this folder> -include metal_decls.h kernel.metal
// It declares what plugrt's renderer may use, with Metal's types and rules where C++ can state them: half and bfloat
// convert only explicitly, as_type needs equal sizes, no double, constant memory is read-only, and the
// attribute syntax `[[buffer(0)]]` is parsed (clang ignores attributes it does not know). Written for plugrt's tests
// from Apple's Metal Shading Language Specification (see docs/research/metal.md); it is no Metal compiler.
#pragma once
#include <cstddef>
#include <type_traits>

// Metal has no double: any use is an error here too
#define double plugrt_msl_has_no_double

// address spaces and function qualifiers: device memory is ordinary memory here; constant is read-only (a write to a
// scalar argument is an error); threadgroup arrays are one per group, modelled as static storage. (clang's
// address_space attribute would tell them apart, but no C++ conversion operator accepts such an object.)
#define device
#define constant const
#define threadgroup static
#define kernel extern "C"

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
static_assert(sizeof(long) == 8, "MSL's long is 64-bit");

// half and bfloat: 16-bit floats that convert to and from the other scalar types only when asked to
struct half {
  ushort bits;
  half() = default;
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value>> explicit half(T) {}
  explicit half(struct bfloat) = delete;
  operator float() const { return 0.0f; }
};
struct bfloat {
  ushort bits;
  bfloat() = default;
  template <class T, class = std::enable_if_t<std::is_arithmetic<T>::value>> explicit bfloat(T) {}
  explicit bfloat(half) = delete;
  operator float() const { return 0.0f; }
};
static_assert(sizeof(half) == 2 && sizeof(bfloat) == 2, "16-bit floats");

struct uint3 { uint x, y, z; };
struct int3 { int x, y, z; };
// vector types: 2 and 4 elements of each scalar type MSL has vectors of, aligned to their size, built from one value of
// the element type per element (plugrt's renderer converts each first)
template <class T, int N> struct plugrt_msl_vec;
template <class T> struct alignas(2 * sizeof(T)) plugrt_msl_vec<T, 2> {
  T x, y;
  plugrt_msl_vec() = default;
  template <class A, class = std::enable_if_t<std::is_same<A, T>::value>> plugrt_msl_vec(A a, A b) : x(a), y(b) {}
};
template <class T> struct alignas(4 * sizeof(T)) plugrt_msl_vec<T, 4> {
  T x, y, z, w;
  plugrt_msl_vec() = default;
  template <class A, class = std::enable_if_t<std::is_same<A, T>::value>> plugrt_msl_vec(A a, A b, A c, A d) : x(a), y(b), z(c), w(d) {}
};
#define PLUGRT_MSL_VECTORS(t) typedef plugrt_msl_vec<t, 2> t##2; typedef plugrt_msl_vec<t, 4> t##4;
PLUGRT_MSL_VECTORS(char) PLUGRT_MSL_VECTORS(uchar) PLUGRT_MSL_VECTORS(short) PLUGRT_MSL_VECTORS(ushort) PLUGRT_MSL_VECTORS(int)
PLUGRT_MSL_VECTORS(uint) PLUGRT_MSL_VECTORS(half) PLUGRT_MSL_VECTORS(bfloat) PLUGRT_MSL_VECTORS(float)
#undef PLUGRT_MSL_VECTORS
static_assert(sizeof(float4) == 16 && alignof(float4) == 16 && sizeof(half2) == 4, "vectors are aligned to their size");

// as_type<T>(x): the same bits as another type of the same size
template <class T, class F> T as_type(F x) {
  static_assert(sizeof(T) == sizeof(F), "as_type needs types of the same size");
  static_assert(std::is_trivially_copyable<F>::value && std::is_trivially_copyable<T>::value, "as_type of scalars");
  T t; __builtin_memcpy(&t, &x, sizeof(T)); return t;
}

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4, mem_threadgroup_imageblock = 8 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags);

// float only, as in MSL's precise and fast namespaces (plugrt computes half and bfloat in float)
#define PLUGRT_MSL_MATH(ns) namespace ns { \
  float sin(float); float exp2(float); float log2(float); float sqrt(float); float divide(float, float); }
PLUGRT_MSL_MATH(precise)
PLUGRT_MSL_MATH(fast)
#undef PLUGRT_MSL_MATH
float trunc(float); half trunc(half);
template <class T> T max(T, T);
template <class T> T min(T, T);
}  // namespace metal
