// Element types shared by the CPU and CUDA kernels, without any torch header.
//
// The ops layer (csrc/ops) maps torch dtypes onto `e3::DType`; kernels only ever see raw pointers, strides and this
// enum, so the same kernel code serves the torch ops, the CMake bench binaries and C++ tests.
#pragma once

#include <cstdint>
#include <cstring>

// Functions used by both host code and CUDA kernels.
#if defined(__CUDACC__)
#define E3_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define E3_HOST_DEVICE inline
#endif

namespace e3 {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
  }
  return "unknown";
}

inline int dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

// Host-side 16-bit storage types. Arithmetic always happens in float; these only carry bits.
struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// float -> bfloat16 with round-to-nearest-even, NaN kept quiet: the rounding torch and the CUDA intrinsics use,
// so CPU results are bit-identical to `torch.add` on bf16 tensors.
inline bf16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}
inline float bf16_to_float(bf16_t h) { return bits_to_float(static_cast<uint32_t>(h.bits) << 16); }

// IEEE binary16 <-> float, round-to-nearest-even, with subnormals, infinities and NaN.
inline float f16_to_float(f16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1fu) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);
  // Subnormal half: value = mant * 2^-24, exactly representable in float.
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-08f;
  return sign ? -mag : mag;
}

inline f16_t float_to_f16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16_t{static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};  // nan
  if (a >= 0x477ff000u) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Result is subnormal (or zero) in half: scale so the integer part is the half mantissa, round to even.
    // 0.5 ulp of the smallest subnormal is 2^-25; adding 2^-1 * 2^-24 via float arithmetic rounds correctly
    // because float has more than enough precision for this range.
    const float mag = bits_to_float(a);
    const float scaled = mag * 16777216.0f;  // * 2^24: half subnormal mantissa units
    float r = scaled;
    // round half to even on an exact float value
    const float fl = static_cast<float>(static_cast<uint32_t>(r));
    const float diff = r - fl;
    uint32_t m = static_cast<uint32_t>(fl);
    if (diff > 0.5f || (diff == 0.5f && (m & 1u))) m += 1;
    return f16_t{static_cast<uint16_t>(sign | m)};  // m == 0x400 becomes the smallest normal, as it should
  }
  // Normal range: rebias exponent, round mantissa from 23 to 10 bits to nearest even.
  uint32_t v = a - 0x38000000u;  // exponent rebias 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);
  return f16_t{static_cast<uint16_t>(sign | (v >> 13))};
}

// Uniform float load/store over the host storage types, so CPU kernels are written once as templates.
inline float to_float(float v) { return v; }
inline float to_float(bf16_t v) { return bf16_to_float(v); }
inline float to_float(f16_t v) { return f16_to_float(v); }

template <typename T> inline T from_float(float v);
template <> inline float from_float<float>(float v) { return v; }
template <> inline bf16_t from_float<bf16_t>(float v) { return float_to_bf16(v); }
template <> inline f16_t from_float<f16_t>(float v) { return float_to_f16(v); }

// Calls f.template operator()<HostType>() for the host storage type of `t`.
template <typename F>
inline void dispatch_host_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); break;
    case DType::F16: f(f16_t{}); break;
    case DType::BF16: f(bf16_t{}); break;
  }
}

}  // namespace e3
