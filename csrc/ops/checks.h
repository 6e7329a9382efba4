// Argument checks shared by every op. Each failure is a RuntimeError (c10::Error) that names the op, the argument,
// what was expected and what came, so a caller never has to guess which of six tensors was wrong.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../kernels/dtype.h"

namespace e3ops {

// Error messages are assembled here rather than by streaming numbers into an ostream inside this library: on a
// machine whose compiler differs from the one torch was built with, `ostream << long` instantiated in this .so
// crashed inside libstdc++'s locale code (seen on the H200 image, g++ 13). Numbers go through to_string/snprintf;
// strings and torch types (whose operator<< lives in torch) are streamed as before.
inline void msg_part(std::string& out, const char* v) { out += v; }
inline void msg_part(std::string& out, const std::string& v) { out += v; }
inline void msg_part(std::string& out, bool v) { out += v ? "true" : "false"; }
inline void msg_part(std::string& out, char v) { out += v; }
template <typename T>
inline void msg_part(std::string& out, const T& v) {
  if constexpr (std::is_integral_v<T>) {
    out += std::to_string(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
    out += buf;
  } else if constexpr (std::is_pointer_v<T>) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%p", static_cast<const void*>(v));
    out += buf;
  } else {
    std::ostringstream s;  // torch types: their operator<< is compiled in torch
    s << v;
    out += s.str();
  }
}
template <typename... Args>
inline std::string msg(const Args&... args) {
  std::string out;
  (msg_part(out, args), ...);
  return out;
}


// "[2, 3]"
std::string shape_str(const at::Tensor& t);
std::string strides_str(const at::Tensor& t);

// Maps a torch dtype onto the kernels' enum; other dtypes are an error naming what is supported.
e3::DType to_e3_dtype(const at::Tensor& t, const char* op, const char* arg);

void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* arg, const char* layout);
// The dtype of `ref`, then its device (every tensor of a call is checked against one reference tensor).
void check_same_dtype_and_device(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* arg,
                                 const char* ref_arg);
// Last dimension contiguous (stride 1) and rows that do not overlap: a row-strided view is fine.
void check_rows(const at::Tensor& t, const char* op, const char* arg);
// Whole tensor contiguous.
void check_contiguous(const at::Tensor& t, const char* op, const char* arg);
// data pointer aligned to the element size.
void check_element_aligned(const at::Tensor& t, const char* op, const char* arg);
// Two tensors that the op reads and writes (or writes twice) must not share memory.
void check_no_overlap(const at::Tensor& a, const at::Tensor& b, const char* op, const char* a_arg,
                      const char* b_arg);
// Every tensor argument of one call on the meta device, or none. As soon as one argument is meta the dispatcher
// runs the Meta kernel (the fake implementation, for tracing: it writes nothing and returns meta tensors), so a
// call mixing meta with real tensors would look like it ran and do nothing. `args`: (argument name, tensor) of
// every defined tensor argument, list elements named "x[i]". Runs in the ops' BackendSelect kernel
// (registration.cpp), ahead of every backend; FakeTensorMode (torch.compile) never reaches it.
void check_meta_all_or_none(const char* op, const std::vector<std::pair<std::string, at::Tensor>>& args);

}  // namespace e3ops

// TORCH_CHECK with the message built by e3ops::msg (only evaluated when the check fails).
#define E3_CHECK(cond, ...) TORCH_CHECK(cond, ::e3ops::msg(__VA_ARGS__))
