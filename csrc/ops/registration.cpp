// The one place where the eagle3_capture op schemas live, plus the Python module entry point `_C`.
//
// `_C` is a plain CPython extension module (no pybind11: it keeps the torch-including translation units few and
// quick to compile). Importing it registers the ops with the dispatcher; `_C.build_info()` says what was built.
#include <Python.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>
#include <utility>
#include <vector>

#ifndef EAGLE3_CUDA_ARCHS
#define EAGLE3_CUDA_ARCHS ""
#endif
#ifndef EAGLE3_TORCH_BUILD_VERSION
#define EAGLE3_TORCH_BUILD_VERSION "unknown"
#endif
#ifdef EAGLE3_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "checks.h"
#include "device_info.h"
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
  // (eagle3_capture.tp.PackedGatherer drives it; CUDA only). signal: 0 atomic (needs native peer atomics on every
  // link), 1 flags (plain stores only); the same on every rank. trap_on_timeout: a wait past timeout_s writes the
  // error word and traps (the CUDA context is lost: never rows that look gathered); False: it writes the error word
  // and every later call on this flag area does nothing (the probe; the caller reads the error word).
  m.def(
      "gather_p2p_(Tensor(a!) out, Tensor local, int[] out_ptrs, int[] flag_ptrs, Tensor(b!) flags, "
      "Tensor(c!) error, int rank, int dst_row_offset, int[] src_cols, int[] dst_cols, int seg_len, int blocks, "
      "float timeout_s, int signal=0, bool trap_on_timeout=True) -> ()");
}

namespace {

// Ahead of every backend: the checks that must see all of a call's arguments before the dispatcher picks a kernel
// from them (checks.h: check_meta_all_or_none), then on to that kernel.
void backend_select_checks(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t base = stack->size() - n;
  // The fast path (every call of a real run) allocates nothing: count meta and real tensors, name them only when
  // they mix.
  bool any_meta = false, any_real = false;
  auto see = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    (t.is_meta() ? any_meta : any_real) = true;
  };
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[base + i];
    if (v.isTensor()) {
      see(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) see(t);
    }
  }
  if (any_meta && any_real) {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& v = (*stack)[base + i];
      const std::string& name = schema.arguments()[i].name();
      if (v.isTensor()) {
        tensors.emplace_back(name, v.toTensor());
      } else if (v.isTensorList()) {
        const auto list = v.toTensorList();
        for (size_t j = 0; j < list.size(); ++j) tensors.emplace_back(name + "[" + std::to_string(j) + "]", list.get(j));
      }
    }
    const std::string& qualified = schema.name();
    const size_t colon = qualified.find("::");
    const std::string short_name = qualified.substr(colon == std::string::npos ? 0 : colon + 2);
    e3ops::check_meta_all_or_none(short_name.c_str(), tensors);
  }
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect),
                     stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(eagle3_capture, BackendSelect, m) {
  for (const char* op : {"capture_", "fused_add_rmsnorm_capture_", "draft_fc", "draft_fc_out", "gather_p2p_"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&backend_select_checks>());
  }
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

PyObject* py_str(const std::string& s) {
  return PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
}

PyObject* cuda_only(const std::string& s, const char* what) {
  if (s.empty()) {
    PyErr_Format(PyExc_RuntimeError, "eagle3_capture._C.%s needs a CUDA build of the extension", what);
    return nullptr;
  }
  return py_str(s);
}

// (cc_major, cc_minor, sms, max_threads_per_sm, max_blocks_per_sm, smem_per_sm, smem_per_block_optin,
//  smem_reserved_per_block, l2_bytes) -> JSON {"facts", "tuning"}: the table for a real or pretended device.
PyObject* py_tuning_for(PyObject*, PyObject* args) {
  e3::DeviceFacts f;
  long long l2 = 0;
  if (!PyArg_ParseTuple(args, "iiiiiiiiL", &f.cc_major, &f.cc_minor, &f.sms, &f.max_threads_per_sm,
                        &f.max_blocks_per_sm, &f.smem_per_sm, &f.smem_per_block_optin, &f.smem_reserved_per_block,
                        &l2))
    return nullptr;
  f.l2_bytes = l2;
  return py_str(e3ops::tuning_json(f));
}

// (facts tuple as above, chunks, rows, smem_bytes, override_threads) -> the fused kernel's block size.
PyObject* py_fused_norm_threads(PyObject*, PyObject* args) {
  e3::DeviceFacts f;
  long long l2 = 0, chunks = 0, rows = 0, smem = 0;
  int override_threads = 0;
  if (!PyArg_ParseTuple(args, "(iiiiiiiiL)LLLi", &f.cc_major, &f.cc_minor, &f.sms, &f.max_threads_per_sm,
                        &f.max_blocks_per_sm, &f.smem_per_sm, &f.smem_per_block_optin, &f.smem_reserved_per_block,
                        &l2, &chunks, &rows, &smem, &override_threads))
    return nullptr;
  f.l2_bytes = l2;
  return PyLong_FromLong(e3::fused_norm_threads(f, chunks, rows, smem, override_threads));
}

PyObject* py_device_tuning(PyObject*, PyObject* arg) {
  const long dev = PyLong_AsLong(arg);
  if (dev == -1 && PyErr_Occurred()) return nullptr;
  return cuda_only(e3ops::device_tuning_json(static_cast<int>(dev)), "device_tuning");
}

PyObject* py_device_report(PyObject*, PyObject* arg) {
  const long dev = PyLong_AsLong(arg);
  if (dev == -1 && PyErr_Occurred()) return nullptr;
  return cuda_only(e3ops::device_report_json(static_cast<int>(dev)), "device_report");
}

PyObject* py_launch_smem(PyObject*, PyObject* args) {
  long long hidden = 0, optin = 0;
  if (!PyArg_ParseTuple(args, "LL", &hidden, &optin)) return nullptr;
  return cuda_only(e3ops::launch_smem_json(hidden, optin), "launch_smem");
}

// Words of the p2p gather's flag area (e3::kGatherFlagWords): what each rank's registered buffer must hold beyond
// its data. CUDA builds.
PyObject* py_gather_flag_words(PyObject*, PyObject*) {
#ifdef EAGLE3_WITH_CUDA
  return PyLong_FromLong(e3ops::gather_flag_words());
#else
  PyErr_SetString(PyExc_RuntimeError, "eagle3_capture._C.gather_flag_words needs a CUDA build of the extension");
  return nullptr;
#endif
}

// (sms, taps, hidden, out_features, rows, norm) -> the draft fc split grid's pieces per tap. CUDA builds.
PyObject* py_draft_fc_split_pieces(PyObject*, PyObject* args) {
  int sms = 0, taps = 0, norm = 0;
  long long hidden = 0, n = 0, rows = 0;
  if (!PyArg_ParseTuple(args, "iiLLLp", &sms, &taps, &hidden, &n, &rows, &norm)) return nullptr;
#ifdef EAGLE3_WITH_CUDA
  return PyLong_FromLongLong(static_cast<long long>(e3::draft_fc_split_pieces_per_tap(sms, taps, hidden, n, rows,
                                                                                      norm != 0)));
#else
  PyErr_SetString(PyExc_RuntimeError, "eagle3_capture._C.draft_fc_split_pieces needs a CUDA build of the extension");
  return nullptr;
#endif
}

PyObject* py_set_draft_fc_cluster_fault(PyObject*, PyObject* arg) {
  const long long err = PyLong_AsLongLong(arg);
  if (err == -1 && PyErr_Occurred()) return nullptr;
  try {
    const long long prev = e3ops::set_draft_fc_cluster_fault(err);
#ifdef EAGLE3_WITH_CUDA
    e3::draft_fc_rearm_fallback_note();  // a test that sets a fault sees the fallback's line again
#endif
    return PyLong_FromLongLong(prev);
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
     "Test knob: the decode kernel CUDA draft_fc prefers, 0 auto (default), 1 cluster, 2 split; returns the "
     "previous value."},
    {"tuning_for", py_tuning_for, METH_VARARGS,
     "JSON: the tuning table's values (with the EAGLE3_CAPTURE_* overrides now in the environment) for the device "
     "facts (cc_major, cc_minor, sms, max_threads_per_sm, max_blocks_per_sm, smem_per_sm, smem_per_block_optin, "
     "smem_reserved_per_block, l2_bytes)."},
    {"fused_norm_threads", py_fused_norm_threads, METH_VARARGS,
     "The fused add + RMSNorm kernel's block size for (facts tuple, chunks, rows, smem_bytes, override_threads)."},
    {"device_tuning", py_device_tuning, METH_O,
     "JSON: a CUDA device's facts and the tuning its launchers use (cached at first use). CUDA builds."},
    {"device_report", py_device_report, METH_O,
     "JSON: a CUDA device's PCI bus id and its P2P link attributes to every other visible device. CUDA builds."},
    {"launch_smem", py_launch_smem, METH_VARARGS,
     "JSON for (H, opt-in shared memory per block): the fused kernel's largest H there and the dynamic shared "
     "memory each launcher requests (the CI resource gate). CUDA builds."},
    {"draft_fc_split_pieces", py_draft_fc_split_pieces, METH_VARARGS,
     "The draft fc split grid's pieces per tap for (sms, taps, hidden, out_features, rows, norm). CUDA builds."},
    {"gather_flag_words", py_gather_flag_words, METH_NOARGS,
     "Words (int64) of the p2p gather's flag area each rank registers beyond its data. CUDA builds."},
    {"set_draft_fc_cluster_fault", py_set_draft_fc_cluster_fault, METH_O,
     "Test knob: a cudaError_t value the cluster decode launch pretends to return (0: none), re-arming the "
     "fallback's stderr line; returns the previous value."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_C", "eagle3_capture native ops (see eagle3_capture.ops)", -1,
                       kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&kModule); }
