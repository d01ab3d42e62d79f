// oneDNN's linear as an op of our own, for the compiled CPU decode graph (engine/compiled_decode.py).
//
// Eagerly, models/linear_kernels.py calls torch.ops.mkldnn._linear_pointwise directly. Inside a
// torch.compile'd graph inductor lowers that op itself, and its lowering only takes a weight that was
// pre-packed as a graph constant; with the model's ordinary dense weight it fails. This op forwards to
// the same oneDNN kernel through the dispatcher, and inductor calls it as an opaque kernel.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <optional>
#include <string>

namespace {

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack{x, weight, bias, std::string("none"), c10::List<std::optional<at::Scalar>>(),
                          std::optional<std::string>(std::string(""))};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minengine, m) {
  m.def("onednn_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(minengine, CPU, m) { m.impl("onednn_linear", &onednn_linear); }
