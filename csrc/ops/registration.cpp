// The one place where the eagle3_capture op schemas live, plus the Python module entry point `_C`.
//
// `_C` is a plain CPython extension module (no pybind11: it keeps the torch-including translation units few and
// quick to compile). Importing it registers the ops with the dispatcher; `_C.build_info()` says what was built.
#include <Python.h>
#include <torch/library.h>

#include <string>

#ifndef EAGLE3_CUDA_ARCHS
#define EAGLE3_CUDA_ARCHS ""
#endif
#ifndef EAGLE3_TORCH_BUILD_VERSION
#define EAGLE3_TORCH_BUILD_VERSION "unknown"
#endif
#ifdef EAGLE3_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "draft_fc_ops.h"

TORCH_LIBRARY(eagle3_capture, m) {
  // Writes `hidden` (+ `residual`) into column slot `slot` of the packed [T, K*H] buffer.
  m.def("capture_(Tensor(a!) packed, int slot, Tensor hidden, Tensor? residual=None) -> ()");
  // residual += hidden; hidden = rmsnorm(residual) * weight; packed[:, slot] = residual. One pass.
  m.def(
      "fused_add_rmsnorm_capture_(Tensor(a!) hidden, Tensor(b!) residual, Tensor weight, float eps, "
      "Tensor(c!) packed, int slot) -> ()");
  // The draft's fc: linear(cat(rmsnorm_k(x_k) * norm_weight[k] for k), weight, bias). x: one packed [M, K*H]
  // tensor or K [M, H] tensors; norm_weight [K, H] or None (no per-tap norm).
  m.def("draft_fc(Tensor[] x, Tensor weight, Tensor? norm_weight=None, float eps=1e-6, Tensor? bias=None) -> Tensor");
  m.def(
      "draft_fc_out(Tensor[] x, Tensor weight, Tensor? norm_weight, float eps, Tensor? bias, Tensor(a!) out) -> ()");
  // One rank's part of a TP gather into every rank's registered packed buffer over peer-mapped memory
  // (eagle3_capture.tp.PackedGatherer drives it; CUDA only).
  m.def(
      "gather_p2p_(Tensor(a!) out, Tensor local, int[] out_ptrs, int[] flag_ptrs, Tensor(b!) flags, "
      "Tensor(c!) error, int rank, int dst_row_offset, int[] src_cols, int[] dst_cols, int seg_len, int blocks, "
      "float timeout_s) -> ()");
}

namespace {

std::string build_info_json() {
  std::string s = "{";
#ifdef EAGLE3_WITH_CUDA
  s += "\"backends\": [\"cpu\", \"cuda\"], ";
  s += "\"cuda_archs\": \"" EAGLE3_CUDA_ARCHS "\", ";
  s += "\"cuda_compiled_version\": \"" + std::to_string(CUDART_VERSION / 1000) + "." +
       std::to_string((CUDART_VERSION % 1000) / 10) + "\", ";
#else
  s += "\"backends\": [\"cpu\"], \"cuda_archs\": \"\", \"cuda_compiled_version\": null, ";
#endif
  s += "\"torch_build_version\": \"" EAGLE3_TORCH_BUILD_VERSION "\"}";
  return s;
}

PyObject* py_build_info(PyObject*, PyObject*) {
  const std::string s = build_info_json();
  return PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
}

PyObject* py_set_draft_fc_decode_max_rows(PyObject*, PyObject* arg) {
  const long long rows = PyLong_AsLongLong(arg);
  if (rows == -1 && PyErr_Occurred()) return nullptr;
  return PyLong_FromLongLong(static_cast<long long>(e3ops::set_draft_fc_decode_max_rows(rows)));
}

PyObject* py_set_draft_fc_decode_kernel(PyObject*, PyObject* arg) {
  const long long kernel = PyLong_AsLongLong(arg);
  if (kernel == -1 && PyErr_Occurred()) return nullptr;
  try {
    return PyLong_FromLongLong(static_cast<long long>(e3ops::set_draft_fc_decode_kernel(kernel)));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
}

PyMethodDef kMethods[] = {
    {"build_info", py_build_info, METH_NOARGS, "JSON string: backends, CUDA archs and versions built against."},
    {"set_draft_fc_decode_max_rows", py_set_draft_fc_decode_max_rows, METH_O,
     "Benchmark knob: rows at or below which CUDA draft_fc takes the decode kernel (clamped to 0..16); returns the "
     "previous value."},
    {"set_draft_fc_decode_kernel", py_set_draft_fc_decode_kernel, METH_O,
     "Test knob: the decode kernel CUDA draft_fc prefers, 0 auto (default), 1 cluster, 2 split, 3 bulk; returns "
     "the previous value."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_C", "eagle3_capture native ops (see eagle3_capture.ops)", -1,
                       kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&kModule); }
