// Argument checks shared by every op. Each failure is a RuntimeError (c10::Error) that names the op, the argument,
// what was expected and what came, so a caller never has to guess which of six tensors was wrong.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

#include "../kernels/dtype.h"

namespace e3ops {

// "[2, 3]"
std::string shape_str(const at::Tensor& t);
std::string strides_str(const at::Tensor& t);

// Maps a torch dtype onto the kernels' enum; other dtypes are an error naming what is supported.
e3::DType to_e3_dtype(const at::Tensor& t, const char* op, const char* arg);

void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* arg, const char* layout);
void check_same_dtype(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* arg,
                      const char* ref_arg);
void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* arg,
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

}  // namespace e3ops
