// DDTree's hot path: per row of draft logits, the top-k log-probabilities and their token ids in
// one pass over the row: per block of 512 values one loop takes the block's max and the sum of
// exp(x - ref) against a running reference (moved, and the sum rescaled, only when the max jumps
// by more than 60, so exp never overflows); then only the blocks that can hold one of the top k
// (their max reaches the k-th largest block max) are read again, from cache, chunk by chunk.
//
// Registers the CPU kernel of fleetspec_ddtree::topk_logprobs(Tensor logits, int k) -> (Tensor, Tensor)
// (declared in tree_mask.cpp). Result: logp float32[..., k] sorted descending, ties by the lower
// token id; ids int64[..., k]. logp = logit - log_z with log_z = ref + log(sum exp(logit - ref))
// rounded to float32 once, so it is the same formula as the torch fallback in ddtree_utils
// (topk, then values - logsumexp); the two log_z differ at most in float32 rounding.
//
// The block loop is written with GCC/Clang vector types (16 floats: one AVX-512 register, two AVX2
// ones, four SSE ones) and a branch-free polynomial exp, so every ISA gets SIMD code: the compiler's
// auto-vectoriser left the scalar form of this loop scalar (a branch per value). It is compiled
// for AVX-512, AVX2+FMA and baseline x86-64 and picked at load time (GCC target_clones); the
// bench prints which one this CPU takes. Rows run in parallel on std::threads (for_rows).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kBlock = 512;   // elements per block: stays in L1 for the top-k scan after the pass
constexpr int64_t kChunk = 32;    // the top-k scan skips whole chunks below the k-th value

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"   // vector values cross no call that is not inlined

// W floats as one value: the compiler emits SIMD code for it where the function's target has it.
template <int W> struct Vec {
  typedef float F __attribute__((vector_size(W * sizeof(float))));
  typedef int32_t I __attribute__((vector_size(W * sizeof(int32_t))));
};

template <typename F>
static inline __attribute__((always_inline)) F load(const float* p) {
  F v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename F>
static inline __attribute__((always_inline)) F vmax(F a, F b) { return a > b ? a : b; }

// exp(t) for t in [-87, 88] by range reduction (t = n ln2 + r, |r| <= ln2/2) and a degree-7
// polynomial (Cephes' expf, about 1 ulp: a cheaper one moved log_z by an ulp, enough to reorder
// tied prefixes in the tree against torch's logsumexp). t below -87 (-inf too) gives exp(-87) ~
// 1.6e-38, which a sum holding the max's own term (>= 1) loses in rounding. NaN stays NaN. The
// same formula on one float (tails) and on a vector of them (the block loop): min/max, no branch.
template <typename F, typename I>
static inline __attribute__((always_inline)) F exp_clamped(F t) {
  const F lo = F{} - 87.0f, hi = F{} + 88.0f;
  const F low = lo > t ? lo : t;                  // maxps: NaN passes through
  const F tc = hi < low ? hi : low;               // minps
  const F n = (tc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;   // round to nearest
  const F r = (tc - n * 0.693359375f) + n * 2.12194440e-4f;
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  I bits;
  if constexpr (std::is_same_v<F, float>) {
    bits = (static_cast<int32_t>(n) + 127) << 23;
  } else {
    bits = (__builtin_convertvector(n, I) + 127) << 23;
  }
  F scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// One pass over a block: the sum of exp(x - ref) into *sum; returns the block's largest value.
// The caller keeps ref within 60 of every value it has seen, so exp never overflows; a block
// that raises the max further is summed again against the new reference (rare: only a jump of
// more than 60). kChunk / W vector accumulators: independent add chains.
template <int W>
static inline __attribute__((always_inline)) float block_pass_w(const float* __restrict x, int64_t n,
                                                                float ref, float* __restrict sum) {
  using F = typename Vec<W>::F;
  using I = typename Vec<W>::I;
  constexpr int kVecs = kChunk / W;
  const float ninf = -std::numeric_limits<float>::infinity();
  const F vref = F{} + ref;
  F hi = F{} + ninf;
  F acc[kVecs];
  for (int v = 0; v < kVecs; ++v) acc[v] = F{};
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
#pragma GCC unroll 8
    for (int v = 0; v < kVecs; ++v) {
      const F a = load<F>(x + i + v * W);
      hi = vmax(hi, a);
      acc[v] += exp_clamped<F, I>(a - vref);
    }
  }
  float m = ninf;
  for (int l = 0; l < W; ++l) m = hi[l] > m ? hi[l] : m;
  float s = 0.0f;
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    s += exp_clamped<float, int32_t>(x[i] - ref);
  }
  for (int v = 1; v < kVecs; ++v) acc[0] += acc[v];
  for (int l = 0; l < W; ++l) s += acc[0][l];
  *sum = s;
  return m;
}

// Bit l set where x[l] >= t, for one full chunk; 0 at once when no value reaches t.
template <int W>
static inline __attribute__((always_inline)) uint32_t chunk_hits_w(const float* __restrict x, float t) {
  using F = typename Vec<W>::F;
  F hi = load<F>(x);
  for (int v = 1; v < kChunk / W; ++v) hi = vmax(hi, load<F>(x + v * W));
  bool any = false;
  for (int l = 0; l < W; ++l) any |= hi[l] >= t;
  if (!any) return 0;
  uint32_t hits = 0;
  for (int l = 0; l < kChunk; ++l) hits |= static_cast<uint32_t>(x[l] >= t) << l;
  return hits;
}

// One build per ISA, each with the vector width of its registers; picked once, at load time.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f")))
float block_pass_avx512(const float* x, int64_t n, float ref, float* sum) { return block_pass_w<16>(x, n, ref, sum); }
__attribute__((target("avx512f")))
uint32_t chunk_hits_avx512(const float* x, float t) { return chunk_hits_w<16>(x, t); }
__attribute__((target("avx2,fma")))
float block_pass_avx2(const float* x, int64_t n, float ref, float* sum) { return block_pass_w<8>(x, n, ref, sum); }
__attribute__((target("avx2,fma")))
uint32_t chunk_hits_avx2(const float* x, float t) { return chunk_hits_w<8>(x, t); }
#endif
float block_pass_base(const float* x, int64_t n, float ref, float* sum) { return block_pass_w<4>(x, n, ref, sum); }
uint32_t chunk_hits_base(const float* x, float t) { return chunk_hits_w<4>(x, t); }

struct Isa {
  const char* name;
  float (*block_pass)(const float*, int64_t, float, float*);
  uint32_t (*chunk_hits)(const float*, float);
};

Isa pick_isa() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {"avx512f", block_pass_avx512, chunk_hits_avx512};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return {"avx2+fma", block_pass_avx2, chunk_hits_avx2};
#endif
  return {"baseline", block_pass_base, chunk_hits_base};
}

const Isa kIsa = pick_isa();

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

// The row's block `start` as floats: the row itself for float logits, else converted into buf.
template <typename scalar_t>
const float* block_floats(const scalar_t* row, int64_t start, int64_t n, float* buf) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return row + start;
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(row[start + i]);
    return buf;
  }
}

// Pass 1 reads the row once: each block's max (kept) and the sum of exp. Pass 2 scans for the top
// k, in index order, only the blocks that can hold one: with B blocks and k <= B, the k-th largest
// block max is a lower bound of the k-th largest value (k blocks each hold a value at least that
// large), so a block whose max is below it is skipped unread; the rest are re-read from cache.
template <typename scalar_t>
void row_topk(const scalar_t* row, int64_t vocab, int64_t k, float* out_v, int64_t* out_id,
              float* buf, std::vector<float>& bmax, std::vector<float>& scratch) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  const int64_t blocks = (vocab + kBlock - 1) / kBlock;
  bmax.resize(blocks);
  float m = ninf;      // the row's max so far
  float ref = ninf;    // exp reference: the max when it was last moved (within 60 below m)
  double s = 0.0;      // sum of exp(x - ref) over the row so far
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t start = b * kBlock, n = std::min(kBlock, vocab - start);
    const float* x = block_floats(row, start, n, buf);
    float bsum;
    float hi = kIsa.block_pass(x, n, ref == ninf ? 0.0f : ref, &bsum);
    if (hi > ninf && (ref == ninf || hi - ref > 60.0f)) {
      // first finite values, or a jump that exp(x - ref) might overflow: move the reference
      const float next = hi;
      if (ref != ninf) s *= std::exp(static_cast<double>(ref) - static_cast<double>(next));
      else s = 0.0;
      ref = next;
      hi = kIsa.block_pass(x, n, ref, &bsum);
    }
    if (ref != ninf) s += bsum;
    m = hi > m ? hi : m;
    bmax[b] = hi;
  }
  float floor = ninf;  // no value below it can be among the top k
  if (k <= blocks) {
    scratch.assign(bmax.begin(), bmax.end());
    std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<float>());
    floor = scratch[k - 1];
  }
  TopK top(k);
  for (int64_t b = 0; b < blocks; ++b) {
    // kept full: only a value above the k-th displaces one (index order); else at least floor
    const float t = top.have_k ? top.thr : floor;
    if (top.have_k ? !(bmax[b] > t) : bmax[b] < t) continue;
    const int64_t start = b * kBlock, n = std::min(kBlock, vocab - start);
    const float* x = block_floats(row, start, n, buf);
    for (int64_t base = 0; base < n; base += kChunk) {
      const float tc = top.have_k ? top.thr : floor;
      if (n - base < kChunk) {
        for (int64_t i = base; i < n; ++i)
          if (x[i] >= tc && top.wants(x[i])) top.offer(x[i], start + i);
        continue;
      }
      // the chunk's values at or above the threshold as a bit mask (none: the chunk is skipped)
      uint32_t hits = kIsa.chunk_hits(x + base, tc);
      while (hits) {
        const int l = __builtin_ctz(hits);
        hits &= hits - 1;
        if (top.wants(x[base + l])) top.offer(x[base + l], start + base + l);
      }
    }
  }
  top.finish(out_v, out_id);
  // The fallback's formula: values - logsumexp, both float32. All -inf: log_z = -inf, logp = nan.
  const float log_z = m == ninf ? m : static_cast<float>(static_cast<double>(ref) + std::log(s));
  for (int64_t j = 0; j < k; ++j) out_v[j] = out_v[j] - log_z;
}

// at::parallel_for runs serially in an extension built without -fopenmp, which cpp_extension does not
// add (and a second OpenMP runtime beside torch's would oversubscribe the cores): measured, one
// thread of sixteen did all the rows. So rows are split over std::threads, as many as torch's
// intra-op setting (torch.set_num_threads) allows and the work pays for.
template <typename F>
void for_rows(int64_t rows, int64_t per_row, const F& f) {
  constexpr int64_t kMinWork = int64_t{1} << 17;   // values per thread below which a thread costs more
  int64_t n = std::min<int64_t>(std::max(1, at::get_num_threads()), rows);
  n = std::min<int64_t>(n, std::max<int64_t>(1, rows * per_row / kMinWork));
  if (n <= 1) {
    f(0, rows);
    return;
  }
  const int64_t chunk = (rows + n - 1) / n;
  std::exception_ptr error;
  std::mutex mu;
  auto run = [&](int64_t begin, int64_t end) {
    try {
      f(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int64_t begin = chunk; begin < rows; begin += chunk) pool.emplace_back(run, begin, std::min(rows, begin + chunk));
  run(0, std::min(rows, chunk));
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
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
    for_rows(rows, vocab, [&](int64_t begin, int64_t end) {
      std::vector<float> buf(kBlock), bmax, scratch;
      for (int64_t r = begin; r < end; ++r) {
        if constexpr (std::is_same_v<scalar_t, double>) {
          // double logits are narrowed per block, as the fallback's .float() narrows them
          std::vector<float> row(vocab);
          for (int64_t i = 0; i < vocab; ++i) row[i] = static_cast<float>(src[r * vocab + i]);
          row_topk<float>(row.data(), vocab, k, vp + r * k, ip + r * k, buf.data(), bmax, scratch);
        } else {
          row_topk<scalar_t>(src + r * vocab, vocab, k, vp + r * k, ip + r * k, buf.data(), bmax, scratch);
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
