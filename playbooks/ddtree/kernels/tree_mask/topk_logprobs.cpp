// DDTree's hot path: per row of draft logits, the top-k log-probabilities and their token ids in
// one pass over the row (online max and sum of exp, candidates kept per row).
//
// Registers the CPU kernel of fleetspec_ddtree::topk_logprobs(Tensor logits, int k) -> (Tensor, Tensor)
// (declared in tree_mask.cpp). Result: logp float32[..., k] sorted descending, ties by the lower
// token id; ids int64[..., k]. logp = logit - log_z with log_z = max + log(sum exp(logit - max))
// rounded to float32 once, so it is the same formula as the torch fallback in ddtree_utils
// (topk, then values - logsumexp); the two log_z differ at most in float32 rounding.
//
// The loops over a block are written so the compiler vectorises them (independent lane
// accumulators, no branches, a polynomial exp); the hot function is compiled for AVX-512, AVX2
// and baseline x86-64 and picked at load time (GCC target_clones). Rows run in parallel with
// at::parallel_for.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kBlock = 512;   // elements per block: stays in L1 between the max and exp loops
constexpr int kLanes = 16;         // independent accumulators (one AVX-512 vector of floats)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FLEETSPEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FLEETSPEC_CLONES
#endif

// The largest of x[0..n) (-inf for an empty or all -inf block).
FLEETSPEC_CLONES
static float block_max(const float* __restrict x, int64_t n) {
  float lane[kLanes];
  for (int l = 0; l < kLanes; ++l) lane[l] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  float m = -std::numeric_limits<float>::infinity();
  for (int l = 0; l < kLanes; ++l) m = lane[l] > m ? lane[l] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

static inline float exp_nonpos(float t) {
  // exp(t) for t <= 0: t = n ln2 + r, |r| <= ln2/2; 2^n from the exponent bits.
  const float tc = t < -87.0f ? -87.0f : t;
  const float n = (tc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;   // round to nearest
  const float r = (tc - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return t < -87.0f ? 0.0f : p * scale;
}

// Sum over a block of exp(x - m), m >= every x; exp by range reduction and a degree-6
// polynomial (a few ulp), 0 below -87 (and for -inf).
FLEETSPEC_CLONES
static float block_sum_exp(const float* __restrict x, int64_t n, float m) {
  float lane[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += exp_nonpos(x[i + l] - m);
  float s = 0.0f;
  for (; i < n; ++i) s += exp_nonpos(x[i] - m);
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  return s;
}

// The k best (value, index) pairs seen so far, sorted descending; an equal value keeps the lower
// index ahead (rows are scanned in index order, so a later equal value never displaces one).
struct TopK {
  int64_t k, size = 0;
  float* v;
  int64_t* id;
  float threshold() const { return size < k ? -std::numeric_limits<float>::infinity() : v[k - 1]; }
  bool full() const { return size == k; }
  void offer(float x, int64_t index) {
    if (size == k && !(x > v[k - 1])) return;
    int64_t pos = size < k ? size++ : k - 1;
    while (pos > 0 && x > v[pos - 1]) {   // stop behind equal values: they have lower indices
      v[pos] = v[pos - 1];
      id[pos] = id[pos - 1];
      --pos;
    }
    v[pos] = x;
    id[pos] = index;
  }
};

template <typename scalar_t>
void row_topk(const scalar_t* row, int64_t vocab, int64_t k, float* out_v, int64_t* out_id,
              float* buf) {
  TopK top{k, 0, out_v, out_id};
  float m = -std::numeric_limits<float>::infinity();
  double s = 0.0;   // sum of exp(x - m) over the row so far
  for (int64_t start = 0; start < vocab; start += kBlock) {
    const int64_t n = std::min(kBlock, vocab - start);
    const float* x;
    if constexpr (std::is_same_v<scalar_t, float>) {
      x = row + start;
    } else {
      for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(row[start + i]);
      x = buf;
    }
    const float bmax = block_max(x, n);
    if (bmax > m) {                       // raise the running max; rescale what was summed
      if (s != 0.0) s *= std::exp(static_cast<double>(m) - static_cast<double>(bmax));
      m = bmax;
    }
    if (m > -std::numeric_limits<float>::infinity()) s += block_sum_exp(x, n, m);
    if (!top.full() || bmax > top.threshold()) {
      for (int64_t i = 0; i < n; ++i)
        if (!top.full() || x[i] > top.threshold()) top.offer(x[i], start + i);
    }
  }
  // The fallback's formula: values - logsumexp, both float32. All -inf: log_z = -inf, logp = nan.
  const float log_z = m == -std::numeric_limits<float>::infinity()
                          ? m
                          : static_cast<float>(static_cast<double>(m) + std::log(s));
  for (int64_t j = 0; j < k; ++j) out_v[j] = out_v[j] - log_z;
}

std::tuple<at::Tensor, at::Tensor> topk_logprobs_cpu(const at::Tensor& logits_in, int64_t k) {
  TORCH_CHECK(logits_in.dim() >= 1, "topk_logprobs: logits need a vocabulary dimension");
  const int64_t vocab = logits_in.size(-1);
  TORCH_CHECK(k >= 1 && k <= vocab, "topk_logprobs: k must be in [1, ", vocab, "], got ", k);
  const auto logits = logits_in.contiguous();
  const int64_t rows = vocab ? logits.numel() / vocab : 0;
  auto shape = logits.sizes().vec();
  shape.back() = k;
  auto values = at::empty(shape, logits.options().dtype(at::kFloat));
  auto ids = at::empty(shape, logits.options().dtype(at::kLong));
  float* vp = values.data_ptr<float>();
  int64_t* ip = ids.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "topk_logprobs_cpu", [&] {
    const scalar_t* src = logits.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> buf(kBlock);
      for (int64_t r = begin; r < end; ++r) {
        if constexpr (std::is_same_v<scalar_t, double>) {
          // double logits are narrowed per block, as the fallback's .float() narrows them
          std::vector<float> row(vocab);
          for (int64_t i = 0; i < vocab; ++i) row[i] = static_cast<float>(src[r * vocab + i]);
          row_topk<float>(row.data(), vocab, k, vp + r * k, ip + r * k, buf.data());
        } else {
          row_topk<scalar_t>(src + r * vocab, vocab, k, vp + r * k, ip + r * k, buf.data());
        }
      }
    });
  });
  return {values, ids};
}

}  // namespace

TORCH_LIBRARY_IMPL(fleetspec_ddtree, CPU, m) {
  m.impl("topk_logprobs", &topk_logprobs_cpu);
}
