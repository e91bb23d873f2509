// CUDA kernel for fleetspec_ddtree::tree_mask: one thread per (request, node) walks its ancestors.
// UNPROVEN: written without a GPU; built only where torch has CUDA and a toolchain is present.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace {

__global__ void tree_mask_kernel(const int64_t* __restrict__ parents, bool* __restrict__ mask,
                                 int64_t batch, int64_t n) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= batch * n) return;
  const int64_t b = row / n;
  bool* dst = mask + row * n;
  int64_t j = row % n;
  for (int64_t step = 0; step < n && j >= 0 && j < n; ++step) {
    dst[j] = true;
    j = parents[b * n + j];
  }
}

at::Tensor tree_mask_cuda(const at::Tensor& parents_in) {
  TORCH_CHECK(parents_in.dim() == 2, "tree_mask: parents must be [batch, nodes], got ", parents_in.sizes());
  const auto parents = parents_in.to(at::kLong).contiguous();
  const int64_t batch = parents.size(0), n = parents.size(1);
  auto out = at::zeros({batch, n, n}, parents.options().dtype(at::kBool));
  const int64_t rows = batch * n;
  if (rows == 0) return out;
  const int threads = 128;
  const int64_t blocks = (rows + threads - 1) / threads;
  tree_mask_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      parents.data_ptr<int64_t>(), out.data_ptr<bool>(), batch, n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fleetspec_ddtree, CUDA, m) {
  m.impl("tree_mask", &tree_mask_cuda);
}
