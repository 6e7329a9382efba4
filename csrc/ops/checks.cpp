// The argument checks of checks.h: the messages name the op, the argument, what was expected and what came.
#include "checks.h"

#include <sstream>
#include <utility>

namespace e3ops {

namespace {
std::string join(c10::IntArrayRef v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
}  // namespace

std::string shape_str(const at::Tensor& t) { return join(t.sizes()); }
std::string strides_str(const at::Tensor& t) { return join(t.strides()); }

e3::DType to_e3_dtype(const at::Tensor& t, const char* op, const char* arg) {
  switch (t.scalar_type()) {
    case at::kFloat: return e3::DType::F32;
    case at::kHalf: return e3::DType::F16;
    case at::kBFloat16: return e3::DType::BF16;
    default:
      E3_CHECK(false, "eagle3_capture.", op, ": expected ", arg,
                  " to be float32, float16 or bfloat16, got ", t.scalar_type());
  }
}

void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* arg, const char* layout) {
  E3_CHECK(t.dim() == dim, "eagle3_capture.", op, ": expected ", arg, " to be ", dim, "-D ", layout,
              ", got shape ", shape_str(t));
}

void check_same_dtype_and_device(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* arg,
                                 const char* ref_arg) {
  E3_CHECK(t.scalar_type() == ref.scalar_type(), "eagle3_capture.", op, ": expected ", arg,
              " to have the dtype of ", ref_arg, " (", ref.scalar_type(), "), got ", t.scalar_type());
  E3_CHECK(t.device() == ref.device(), "eagle3_capture.", op, ": expected ", arg, " on ", ref_arg,
              "'s device (", ref.device(), "), got ", t.device());
}

void check_rows(const at::Tensor& t, const char* op, const char* arg) {
  E3_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, "eagle3_capture.", op, ": expected ", arg,
              " to have contiguous rows (last stride 1), got shape ", shape_str(t), " strides ", strides_str(t),
              "; call .contiguous() on it first");
  if (t.dim() == 2 && t.size(0) > 1) {
    E3_CHECK(t.stride(0) >= t.size(1), "eagle3_capture.", op, ": expected ", arg,
                " rows not to overlap (row stride >= row length ", t.size(1), "), got strides ",
                strides_str(t));
  }
}

void check_contiguous(const at::Tensor& t, const char* op, const char* arg) {
  E3_CHECK(t.is_contiguous(), "eagle3_capture.", op, ": expected ", arg,
              " to be contiguous, got shape ", shape_str(t), " strides ", strides_str(t));
}

void check_element_aligned(const at::Tensor& t, const char* op, const char* arg) {
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  E3_CHECK(addr % t.element_size() == 0, "eagle3_capture.", op, ": expected ", arg, " aligned to its ",
           t.element_size(), "-byte element size, got an address ", addr % t.element_size(),
           " bytes past a multiple of it");
}

void check_no_overlap(const at::Tensor& a, const at::Tensor& b, const char* op, const char* a_arg,
                      const char* b_arg) {
  if (a.numel() == 0 || b.numel() == 0) return;
  // Conservative: the byte spans [first element, last element] must be disjoint. Views that interleave without
  // sharing an element (two column slots of one buffer) are refused too; nothing here needs them.
  auto span = [](const at::Tensor& t) {
    int64_t last = 0;
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
    return std::make_pair(begin, begin + static_cast<uintptr_t>((last + 1) * t.element_size()));
  };
  const auto sa = span(a), sb = span(b);
  const bool disjoint = sa.second <= sb.first || sb.second <= sa.first;
  E3_CHECK(disjoint, "eagle3_capture.", op, ": ", a_arg, " and ", b_arg,
              " share memory; the op reads one while writing the other, so they must not overlap");
}

void check_meta_all_or_none(const char* op, const std::vector<std::pair<std::string, at::Tensor>>& args) {
  const std::pair<std::string, at::Tensor>* meta = nullptr;
  const std::pair<std::string, at::Tensor>* real = nullptr;
  for (const auto& a : args) {
    if (!a.second.defined()) continue;
    if (a.second.is_meta()) {
      if (!meta) meta = &a;
    } else if (!real) {
      real = &a;
    }
  }
  E3_CHECK(!(meta && real), "eagle3_capture.", op, ": ", meta ? meta->first : std::string(), " is on the meta device but ",
           real ? real->first : std::string(), " is on ", real ? real->second.device() : c10::Device(c10::kCPU),
           ": a call takes meta tensors only (tracing: nothing is computed or written) or none (a real run); a "
           "meta tensor holds no data, so this call would write nothing and return no values");
}

}  // namespace e3ops
