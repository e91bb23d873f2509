// DDTree's hot path: per row of draft logits, the top-k log-probabilities and their token ids in
// one pass over the row: per block of 512 values one loop takes the chunk maxima and the sum of
// exp(x - ref) against a running reference (moved, and the sum rescaled, only when the max jumps
// by more than 60, so exp never overflows), and the top-k scan visits only chunks whose max beats
// the current k-th value.
//
// Registers the CPU kernel of fleetspec_ddtree::topk_logprobs(Tensor logits, int k) -> (Tensor, Tensor)
// (declared in tree_mask.cpp). Result: logp float32[..., k] sorted descending, ties by the lower
// token id; ids int64[..., k]. logp = logit - log_z with log_z = max + log(sum exp(logit - max))
// rounded to float32 once, so it is the same formula as the torch fallback in ddtree_utils
// (topk, then values - logsumexp); the two log_z differ at most in float32 rounding.
//
// The block loop is written so the compiler vectorises it (independent lane accumulators, no
// branches, a polynomial exp); it is compiled for AVX-512, AVX2 and baseline x86-64 and picked at
// load time (GCC target_clones). Rows run in parallel with at::parallel_for.
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

constexpr int64_t kBlock = 512;   // elements per block: stays in L1 for the top-k scan after the pass
constexpr int kLanes = 16;         // independent accumulators (one AVX-512 vector of floats)

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FLEETSPEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FLEETSPEC_CLONES
#endif

// exp(t) for t in [-87, 88] by range reduction (t = n ln2 + r, |r| <= ln2/2) and a degree-6
// polynomial (a few ulp); 0 below -87 (and for -inf). Branch-free, so loops over it vectorise.
static inline float exp_clamped(float t) {
  const float tc = t < -87.0f ? -87.0f : (t > 88.0f ? 88.0f : t);
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

constexpr int64_t kChunk = 32;     // the top-k scan skips whole chunks below the k-th value

// One pass over a block: the largest value of each kChunk chunk into cm (the last may be short)
// and the sum of exp(x - ref) into *sum. Returns the block's largest value. The caller keeps
// ref within 60 of every value it has seen, so exp never overflows; a block that raises the max
// further is summed again against the new reference (rare: only a jump of more than 60).
FLEETSPEC_CLONES
static float block_pass(const float* __restrict x, int64_t n, float ref, float* __restrict cm,
                        float* __restrict sum) {
  const float ninf = -std::numeric_limits<float>::infinity();
  float all = ninf;
  float acc[kLanes] = {0};
  int64_t c = 0;
  for (; (c + 1) * kChunk <= n; ++c) {
    const float* xc = x + c * kChunk;
    float lane[kLanes];
    for (int l = 0; l < kLanes; ++l) lane[l] = ninf;
    for (int64_t j = 0; j < kChunk; j += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float v = xc[j + l];
        lane[l] = v > lane[l] ? v : lane[l];
        acc[l] += exp_clamped(v - ref);
      }
    float m = ninf;
    for (int l = 0; l < kLanes; ++l) m = lane[l] > m ? lane[l] : m;
    cm[c] = m;
    all = m > all ? m : all;
  }
  float s = 0.0f;
  if (c * kChunk < n) {
    float m = ninf;
    for (int64_t i = c * kChunk; i < n; ++i) {
      m = x[i] > m ? x[i] : m;
      s += exp_clamped(x[i] - ref);
    }
    cm[c] = m;
    all = m > all ? m : all;
  }
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  *sum = s;
  return all;
}

// Bit l set where x[l] > t, for one full chunk.
FLEETSPEC_CLONES
static uint32_t chunk_hits(const float* __restrict x, float t) {
  uint32_t hits = 0;
  for (int l = 0; l < kChunk; ++l) hits |= static_cast<uint32_t>(x[l] > t) << l;
  return hits;
}

// The best k (value, index) pairs of a row, ties to the lower index: a heap of size k whose top is
// the worst kept pair, so `thr` is always exactly the k-th best so far. Rows are scanned in index
// order, so a later value equal to the k-th never displaces it: strictly greater is the rule.
struct TopK {
  using Item = std::pair<float, int64_t>;
  struct Better {   // a function object, so the heap and sort inline the comparison
    bool operator()(const Item& a, const Item& b) const {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    }
  };
  int64_t k;
  std::vector<Item> heap;   // std heap ordered by Better: heap.front() is the worst kept
  float thr = -std::numeric_limits<float>::infinity();
  bool have_k = false;      // k pairs kept: thr is the k-th best (else take anything)

  explicit TopK(int64_t k_) : k(k_) { heap.reserve(k_); }
  bool wants(float x) const { return !have_k || x > thr; }
  void offer(float x, int64_t index) {
    if (have_k) {
      std::pop_heap(heap.begin(), heap.end(), Better());
      heap.back() = Item(x, index);
    } else {
      heap.emplace_back(x, index);
    }
    std::push_heap(heap.begin(), heap.end(), Better());
    if (static_cast<int64_t>(heap.size()) == k) {
      have_k = true;
      thr = heap.front().first;
    }
  }
  void finish(float* v, int64_t* id) {
    std::sort(heap.begin(), heap.end(), Better());
    for (int64_t j = 0; j < k; ++j) { v[j] = heap[j].first; id[j] = heap[j].second; }
  }
};

template <typename scalar_t>
void row_topk(const scalar_t* row, int64_t vocab, int64_t k, float* out_v, int64_t* out_id,
              float* buf) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  TopK top(k);
  float cmax[kBlock / kChunk];
  float m = ninf;      // the row's max so far
  float ref = ninf;    // exp reference: the max when it was last moved (within 60 below m)
  double s = 0.0;      // sum of exp(x - ref) over the row so far
  for (int64_t start = 0; start < vocab; start += kBlock) {
    const int64_t n = std::min(kBlock, vocab - start);
    const float* x;
    if constexpr (std::is_same_v<scalar_t, float>) {
      x = row + start;
    } else {
      for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(row[start + i]);
      x = buf;
    }
    float bsum;
    float bmax = block_pass(x, n, ref == ninf ? 0.0f : ref, cmax, &bsum);
    if (bmax > ninf && (ref == ninf || bmax - ref > 60.0f)) {
      // first finite values, or a jump that exp(x - ref) might overflow: move the reference
      const float next = bmax;
      if (ref != ninf) s *= std::exp(static_cast<double>(ref) - static_cast<double>(next));
      else s = 0.0;
      ref = next;
      bmax = block_pass(x, n, ref, cmax, &bsum);
    }
    if (ref != ninf) s += bsum;
    m = bmax > m ? bmax : m;
    if (!top.have_k || bmax > top.thr) {
      for (int64_t c = 0; c * kChunk < n; ++c) {
        if (top.have_k && !(cmax[c] > top.thr)) continue;
        const int64_t base = c * kChunk, len = std::min(n - base, kChunk);
        if (!top.have_k || len < kChunk) {
          for (int64_t i = base; i < base + len; ++i)
            if (top.wants(x[i])) top.offer(x[i], start + i);
          continue;
        }
        // the chunk's values above the threshold as a bit mask (branch-free), then only those
        uint32_t hits = chunk_hits(x + base, top.thr);
        while (hits) {
          const int l = __builtin_ctz(hits);
          hits &= hits - 1;
          if (top.wants(x[base + l])) top.offer(x[base + l], start + base + l);
        }
      }
    }
  }
  top.finish(out_v, out_id);
  // The fallback's formula: values - logsumexp, both float32. All -inf: log_z = -inf, logp = nan.
  const float log_z = m == ninf ? m : static_cast<float>(static_cast<double>(ref) + std::log(s));
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
