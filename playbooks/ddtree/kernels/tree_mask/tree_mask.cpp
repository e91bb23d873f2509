// DDTree visibility mask: row i of request b may attend to column j iff j is i or an ancestor of i.
// Registers fleetspec_ddtree::tree_mask(Tensor parents) -> Tensor; the CPU kernel lives here, the
// CUDA one in tree_mask_cuda.cu (compiled only where a CUDA toolchain builds it).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

namespace {

at::Tensor tree_mask_cpu(const at::Tensor& parents_in) {
  TORCH_CHECK(parents_in.dim() == 2, "tree_mask: parents must be [batch, nodes], got ", parents_in.sizes());
  const auto parents = parents_in.to(at::kLong).contiguous();
  const int64_t batch = parents.size(0), n = parents.size(1);
  auto out = at::zeros({batch, n, n}, parents.options().dtype(at::kBool));
  const int64_t* par = parents.data_ptr<int64_t>();
  bool* mask = out.data_ptr<bool>();
  at::parallel_for(0, batch * n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / n;
      bool* dst = mask + row * n;
      int64_t j = row % n;
      // At most n steps: a malformed (cyclic) parent table cannot loop forever.
      for (int64_t step = 0; step < n && j >= 0 && j < n; ++step) {
        dst[j] = true;
        j = par[b * n + j];
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(fleetspec_ddtree, m) {
  m.def("tree_mask(Tensor parents) -> Tensor");
  // Implemented in topk_logprobs.cpp (CPU) and topk_logprobs_cuda.cu (CUDA).
  m.def("topk_logprobs(Tensor logits, int k) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(fleetspec_ddtree, CPU, m) {
  m.impl("tree_mask", &tree_mask_cpu);
}
