// CUDA kernel for fleetspec_ddtree::topk_logprobs: one thread block per row of draft logits.
//
// Pass 1 reads the row once: each thread keeps an online (max, sum of exp) and adds the top
// radix digit of every element's order-preserving key to a shared histogram. Three refinement
// passes narrow the k-th largest key one 8-bit digit at a time (radix select, as torch.topk does);
// a last pass collects, in index order, every element above it and the lowest-index ones equal to
// it; the k candidates are then ranked (value descending, lower index first) in shared memory.
// Same contract as the CPU kernel: logp = logit - float32(log_z), ids int64.
//
// Checked only by scripts/gpu-check.sh on a GPU. Its H200 run (sm_90, nvcc 13.0, torch 2.11) built
// and loaded it; the signed-zero fix below has not run on a GPU yet, and there it was slower than
// torch's logsumexp + topk (shared-memory histogram atomics), so the fallback is not beaten yet.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <limits>

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ uint32_t order_key(float f) {
  // Larger float -> larger key; -inf lowest of the non-NaN values. -0.0 takes +0.0's key: they
  // compare equal, so their order is the index order, as in torch's stable sort (the H200 run found
  // -0.0 ranked below +0.0 when a row's top k reached its zeros).
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  const float ninf = -INFINITY;
  if (m2 == ninf) return;
  if (m == ninf) { m = m2; s = s2; return; }
  if (m2 > m) { s = s * __expf(m - m2) + s2; m = m2; }
  else { s = s + s2 * __expf(m2 - m); }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
topk_logprobs_kernel(const scalar_t* __restrict__ logits, int64_t vocab, int k,
                     float* __restrict__ out_v, int64_t* __restrict__ out_id) {
  extern __shared__ unsigned char smem_raw[];
  float* cand_v = reinterpret_cast<float*>(smem_raw);                     // [k]
  int64_t* cand_id = reinterpret_cast<int64_t*>(cand_v + ((k + 1) & ~1)); // [k], 8-byte aligned
  __shared__ uint32_t hist[256];
  __shared__ float red_m[kWarps], red_s[kWarps];
  __shared__ uint32_t prefix_s, remaining_s;
  __shared__ float log_z_s;
  __shared__ int warp_gt[kWarps], warp_eq[kWarps];
  __shared__ int base_gt_s, base_eq_s;

  const int64_t row = blockIdx.x;
  const scalar_t* x = logits + row * vocab;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
  __syncthreads();

  // Pass 1: online max / sum of exp, and the histogram of the key's top digit.
  float m = -INFINITY, s = 0.0f;
  for (int64_t i = tid; i < vocab; i += kThreads) {
    const float v = static_cast<float>(x[i]);
    if (v > m) { s = (m == -INFINITY ? 0.0f : s * __expf(m - v)) + 1.0f; m = v; }
    else if (v != -INFINITY) { s += __expf(v - m); }
    atomicAdd(&hist[order_key(v) >> 24], 1u);
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_down_sync(0xffffffffu, m, off);
    const float s2 = __shfl_down_sync(0xffffffffu, s, off);
    combine(m, s, m2, s2);
  }
  if (lane == 0) { red_m[warp] = m; red_s[warp] = s; }
  __syncthreads();
  if (tid == 0) {
    float bm = red_m[0], bs = red_s[0];
    for (int w = 1; w < kWarps; ++w) combine(bm, bs, red_m[w], red_s[w]);
    log_z_s = bm == -INFINITY ? bm : static_cast<float>(static_cast<double>(bm) + log(static_cast<double>(bs)));
    prefix_s = 0;
    remaining_s = static_cast<uint32_t>(k);
  }
  __syncthreads();

  // Radix select of the k-th largest key, 8 bits at a time (the top digit's histogram is ready).
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (shift != 24) {
      for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
      __syncthreads();
      const uint32_t prefix = prefix_s;
      const uint32_t hi_mask = 0xffffffffu << (shift + 8);
      for (int64_t i = tid; i < vocab; i += kThreads) {
        const uint32_t key = order_key(static_cast<float>(x[i]));
        if ((key & hi_mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
      }
      __syncthreads();
    }
    if (tid == 0) {
      uint32_t need = remaining_s, above = 0;
      int digit = 255;
      for (; digit > 0; --digit) {
        if (above + hist[digit] >= need) break;
        above += hist[digit];
      }
      prefix_s |= static_cast<uint32_t>(digit) << shift;
      remaining_s = need - above;
    }
    __syncthreads();
  }
  const uint32_t kth = prefix_s;
  const int need_eq = static_cast<int>(remaining_s);   // how many equal to the k-th key to take
  if (tid == 0) { base_gt_s = 0; base_eq_s = 0; }
  __syncthreads();

  // Collect, in index order: every key above kth, and the first need_eq keys equal to it.
  const int n_gt = k - need_eq;
  for (int64_t start = 0; start < vocab; start += kThreads) {
    const int64_t i = start + tid;
    float v = 0.0f;
    uint32_t key = 0;
    if (i < vocab) { v = static_cast<float>(x[i]); key = order_key(v); }
    const bool gt = i < vocab && key > kth, eq = i < vocab && key == kth;
    const uint32_t bgt = __ballot_sync(0xffffffffu, gt), beq = __ballot_sync(0xffffffffu, eq);
    if (lane == 0) { warp_gt[warp] = __popc(bgt); warp_eq[warp] = __popc(beq); }
    __syncthreads();
    int off_gt = base_gt_s, off_eq = base_eq_s;
    for (int w = 0; w < warp; ++w) { off_gt += warp_gt[w]; off_eq += warp_eq[w]; }
    const uint32_t below = (1u << lane) - 1u;
    off_gt += __popc(bgt & below);
    off_eq += __popc(beq & below);
    if (gt) { cand_v[off_gt] = v; cand_id[off_gt] = i; }
    if (eq && off_eq < need_eq) { cand_v[n_gt + off_eq] = v; cand_id[n_gt + off_eq] = i; }
    __syncthreads();
    if (tid == 0) {
      for (int w = 0; w < kWarps; ++w) { base_gt_s += warp_gt[w]; base_eq_s += warp_eq[w]; }
    }
    __syncthreads();
    if (base_gt_s >= n_gt && base_eq_s >= need_eq) break;   // every candidate found
  }

  // Rank the k candidates: value descending, lower index first.
  const float log_z = log_z_s;
  for (int c = tid; c < k; c += kThreads) {
    const float v = cand_v[c];
    const int64_t id = cand_id[c];
    const uint32_t key = order_key(v);
    int rank = 0;
    for (int j = 0; j < k; ++j) {
      const uint32_t kj = order_key(cand_v[j]);
      rank += (kj > key) || (kj == key && cand_id[j] < id);
    }
    out_v[row * k + rank] = v - log_z;
    out_id[row * k + rank] = id;
  }
}

std::tuple<at::Tensor, at::Tensor> topk_logprobs_cuda(const at::Tensor& logits_in, int64_t k) {
  TORCH_CHECK(logits_in.dim() >= 1, "topk_logprobs: logits need a vocabulary dimension");
  const int64_t vocab = logits_in.size(-1);
  TORCH_CHECK(k >= 1 && k <= vocab, "topk_logprobs: k must be in [1, ", vocab, "], got ", k);
  TORCH_CHECK(k <= 2048, "topk_logprobs: k above 2048 is not supported on CUDA (shared memory), got ", k);
  const c10::cuda::CUDAGuard guard(logits_in.device());
  auto logits = logits_in.contiguous();
  if (logits.scalar_type() == at::kDouble) logits = logits.to(at::kFloat);
  const int64_t rows = vocab ? logits.numel() / vocab : 0;
  auto shape = logits.sizes().vec();
  shape.back() = k;
  auto values = at::empty(shape, logits.options().dtype(at::kFloat));
  auto ids = at::empty(shape, logits.options().dtype(at::kLong));
  if (rows == 0) return {values, ids};
  const size_t smem = sizeof(float) * ((k + 1) & ~1) + sizeof(int64_t) * k;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "topk_logprobs_cuda", [&] {
    topk_logprobs_kernel<scalar_t><<<static_cast<unsigned>(rows), kThreads, smem,
                                     c10::cuda::getCurrentCUDAStream()>>>(
        logits.data_ptr<scalar_t>(), vocab, static_cast<int>(k), values.data_ptr<float>(),
        ids.data_ptr<int64_t>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {values, ids};
}

}  // namespace

TORCH_LIBRARY_IMPL(fleetspec_ddtree, CUDA, m) {
  m.impl("topk_logprobs", &topk_logprobs_cuda);
}
