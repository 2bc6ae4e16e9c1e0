#include "llm/cpu_model.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/error.h"

namespace gpulab::llm {

namespace {

// Calls fn(begin, end) over [0, n) split into contiguous chunks, one per thread.
template <class F>
void parallel_for(int64_t n, int threads, F&& fn) {
  const int64_t chunks = std::min<int64_t>(threads, n);
  if (chunks <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(chunks);
  for (int64_t c = 0; c < chunks; ++c)
    pool.emplace_back([&, c] { fn(n * c / chunks, n * (c + 1) / chunks); });
  for (auto& t : pool) t.join();
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

int32_t argmax(std::span<const float> values) {
  return static_cast<int32_t>(std::max_element(values.begin(), values.end()) - values.begin());
}

CpuModel::CpuModel(const WeightSource& w, int threads)
    : config_(w.config()),
      threads_(threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency())) {
  const LlamaConfig& c = config_;
  embed_ = w.load_f32("model.embed_tokens.weight");
  final_norm_ = w.load_f32("model.norm.weight");
  if (!c.tie_word_embeddings) lm_head_ = w.load_f32("lm_head.weight");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto load = [&](const std::string& suffix) { return w.load_f32(layer_weight(l, suffix)); };
    Layer L;
    L.attn_norm = load("input_layernorm.weight");
    L.wq = load("self_attn.q_proj.weight");
    L.wk = load("self_attn.k_proj.weight");
    L.wv = load("self_attn.v_proj.weight");
    L.wo = load("self_attn.o_proj.weight");
    if (c.qkv_bias) {
      L.bq = load("self_attn.q_proj.bias");
      L.bk = load("self_attn.k_proj.bias");
      L.bv = load("self_attn.v_proj.bias");
    }
    if (c.o_bias) L.bo = load("self_attn.o_proj.bias");
    L.mlp_norm = load("post_attention_layernorm.weight");
    L.w_gate = load("mlp.gate_proj.weight");
    L.w_up = load("mlp.up_proj.weight");
    L.w_down = load("mlp.down_proj.weight");
    layers_.push_back(std::move(L));
  }
  inv_freq_ = rope_inv_freq(c.rope, c.head_dim, c.dtype);
}

CpuModel::KvCache CpuModel::new_cache() const {
  KvCache cache;
  cache.k.resize(config_.num_layers);
  cache.v.resize(config_.num_layers);
  return cache;
}

void CpuModel::linear(const float* x, int64_t tokens, const std::vector<float>& w, const std::vector<float>& bias,
                      int64_t n, int64_t k, float* out) const {
  parallel_for(n, threads_, [&](int64_t begin, int64_t end) {
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t o = begin; o < end; ++o)
        out[t * n + o] = dot(x + t * k, w.data() + o * k, k) + (bias.empty() ? 0.f : bias[o]);
  });
}

void CpuModel::rmsnorm(const float* x, int64_t tokens, const std::vector<float>& w, float* out) const {
  const int64_t h = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = x + t * h;
    const float mean_sq = dot(row, row, h) / static_cast<float>(h);
    const float inv_rms = 1.0f / std::sqrt(mean_sq + eps);
    for (int64_t i = 0; i < h; ++i) out[t * h + i] = w[i] * (row[i] * inv_rms);
  }
}

// HF rotate_half convention: pairs (i, i + d/2) rotate by angle pos · inv_freq[i].
void CpuModel::rope(float* x, int64_t tokens, int64_t heads, int64_t first_pos) const {
  const int64_t d = config_.head_dim, half = d / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float pos = static_cast<float>(first_pos + t);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq_[i];
      const float c = std::cos(angle), s = std::sin(angle);
      for (int64_t hd = 0; hd < heads; ++hd) {
        float* v = x + (t * heads + hd) * d;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

std::vector<float> CpuModel::forward(std::span<const int32_t> ids, KvCache& cache) const {
  const LlamaConfig& c = config_;
  const int64_t T = static_cast<int64_t>(ids.size()), h = c.hidden_size, d = c.head_dim;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), inter = c.intermediate_size;
  const int64_t past = cache.length, total = past + T, group = c.num_heads / c.num_kv_heads;
  for (int32_t id : ids)
    if (id < 0 || id >= c.vocab_size)
      throw core::InputError("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(c.vocab_size) + ")");

  std::vector<float> x(T * h), xn(T * h), q(T * qd), attn(T * qd), tmp(T * h);
  std::vector<float> gate(T * inter), up(T * inter);
  for (int64_t t = 0; t < T; ++t) std::copy_n(embed_.data() + ids[t] * h, h, x.data() + t * h);

  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    std::vector<float>& kc = cache.k[l];
    std::vector<float>& vc = cache.v[l];
    kc.resize(total * kvd);
    vc.resize(total * kvd);
    rmsnorm(x.data(), T, L.attn_norm, xn.data());
    linear(xn.data(), T, L.wq, L.bq, qd, h, q.data());
    linear(xn.data(), T, L.wk, L.bk, kvd, h, kc.data() + past * kvd);
    linear(xn.data(), T, L.wv, L.bv, kvd, h, vc.data() + past * kvd);
    rope(q.data(), T, c.num_heads, past);
    rope(kc.data() + past * kvd, T, c.num_kv_heads, past);

    // Causal attention; query head hd reads kv head hd / group (GQA).
    parallel_for(T * c.num_heads, threads_, [&](int64_t begin, int64_t end) {
      std::vector<float> p(total);
      for (int64_t job = begin; job < end; ++job) {
        const int64_t t = job / c.num_heads, hd = job % c.num_heads, kvh = hd / group;
        const int64_t visible = past + t + 1;
        const float* qv = q.data() + (t * c.num_heads + hd) * d;
        float mx = -INFINITY;
        for (int64_t j = 0; j < visible; ++j) {
          p[j] = dot(qv, kc.data() + j * kvd + kvh * d, d) * scale;
          mx = std::max(mx, p[j]);
        }
        float sum = 0.f;
        for (int64_t j = 0; j < visible; ++j) sum += p[j] = std::exp(p[j] - mx);
        float* o = attn.data() + (t * c.num_heads + hd) * d;
        std::fill_n(o, d, 0.f);
        for (int64_t j = 0; j < visible; ++j) {
          const float pj = p[j] / sum;
          const float* vv = vc.data() + j * kvd + kvh * d;
          for (int64_t i = 0; i < d; ++i) o[i] += pj * vv[i];
        }
      }
    });
    linear(attn.data(), T, L.wo, L.bo, h, qd, tmp.data());
    for (int64_t i = 0; i < T * h; ++i) x[i] += tmp[i];

    rmsnorm(x.data(), T, L.mlp_norm, xn.data());
    linear(xn.data(), T, L.w_gate, {}, inter, h, gate.data());
    linear(xn.data(), T, L.w_up, {}, inter, h, up.data());
    for (int64_t i = 0; i < T * inter; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    linear(gate.data(), T, L.w_down, {}, h, inter, tmp.data());
    for (int64_t i = 0; i < T * h; ++i) x[i] += tmp[i];
  }
  cache.length = total;

  rmsnorm(x.data(), T, final_norm_, xn.data());
  std::vector<float> logits(T * c.vocab_size);
  linear(xn.data(), T, lm_head_.empty() ? embed_ : lm_head_, {}, c.vocab_size, h, logits.data());
  return logits;
}

std::vector<float> CpuModel::logits(std::span<const int32_t> ids) const {
  KvCache cache = new_cache();
  return forward(ids, cache);
}

std::vector<int32_t> CpuModel::generate_greedy(std::span<const int32_t> prompt, int64_t max_new,
                                               bool stop_at_eos) const {
  if (prompt.empty()) throw core::InputError("generation needs at least one prompt token");
  KvCache cache = new_cache();
  std::vector<int32_t> out;
  std::vector<float> logits = forward(prompt, cache);
  const int64_t V = config_.vocab_size;
  std::span<const float> last(logits.data() + (static_cast<int64_t>(prompt.size()) - 1) * V, V);
  while (static_cast<int64_t>(out.size()) < max_new) {
    const int32_t next = argmax(last);
    out.push_back(next);
    if (stop_at_eos && std::ranges::count(config_.eos_token_ids, next)) break;
    if (static_cast<int64_t>(out.size()) == max_new) break;
    const int32_t one[1] = {next};
    logits = forward(one, cache);
    last = std::span<const float>(logits.data(), V);
  }
  return out;
}

}  // namespace gpulab::llm
