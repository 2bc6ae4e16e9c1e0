// The tensor-parallel CUDA engine. One rank through NCCL (all-reduces of the residual, the
// logits gather, sizes agreed over the communicator) must give the plain engine's logits and
// tokens bit for bit: prompt passes, batched decode steps replayed from the CUDA graph, random
// weights filled on the device. TP over all visible GPUs (when there are 2 or more) must match
// TP 1 within the bf16 tolerance, greedy tokens leaving TP 1's only at near ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "common/gpu.h"
#include "core/error.h"
#include "llm/cpu_model.h"
#include "llm/cuda_engine.h"
#include "llm/fixtures.h"
#include "llm/make_engine.h"
#include "llm/seven_b_shape.h"
#include "llm/tp_engine.h"
#include "llm/tp_processes.h"

namespace gpulab::llm {
namespace {

int visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

EngineOptions small_options() {
  EngineOptions opt;
  opt.max_kv_tokens = 1 << 14;
  opt.max_batch = 8;
  opt.max_seq_len = 256;
  // Bit-for-bit comparisons between engines need the same cuBLASLt algorithms in each: timed
  // picks differ between engines now and then (session 13: 6,301 logits one ulp apart).
  opt.autotune_decode_gemms = false;
  return opt;
}

WeightSource tiny() { return WeightSource::from_checkpoint(testing::fixture_dir("llama_tiny")); }

WeightSource gqa_random() { return WeightSource::random(testing::gqa_test_config(), 3); }

std::vector<std::vector<int32_t>> prompts(int64_t vocab) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& c : testing::load_fixture_cases("llama_tiny")) out.push_back(c.ids);
  std::mt19937 rng(9);
  for (auto& p : out)
    for (auto& id : p) id = std::min<int32_t>(id, static_cast<int32_t>(vocab - 1));
  out.push_back({static_cast<int32_t>(vocab - 1), 2, static_cast<int32_t>(vocab - 2)});  // ids of the last rank
  std::vector<int32_t> random(40);
  for (auto& id : random) id = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(vocab - 1))(rng);
  out.push_back(random);
  return out;
}

// Greedy continuations of all prompts together: one step carrying every prompt, then `steps`
// decode steps of all sequences (replayed from the decode graph after the first). Every step's
// logits are kept, each poisoned before the step.
struct GreedyRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logits;  // per step [sequences, vocab]
};

GreedyRun greedy(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int steps) {
  const int64_t V = engine.config().vocab_size, n = static_cast<int64_t>(prompts.size());
  std::vector<SeqId> seqs;
  for (const auto& p : prompts) {
    const auto id = engine.open(static_cast<int64_t>(p.size()) + steps + 1);
    EXPECT_TRUE(id);
    seqs.push_back(*id);
  }
  GreedyRun run;
  run.tokens.resize(n);
  std::vector<std::span<const int32_t>> chunks(prompts.begin(), prompts.end());
  for (int s = 0; s <= steps; ++s) {
    std::vector<float> logits(n * V, NAN);
    engine.step(seqs, chunks, logits);
    for (int64_t i = 0; i < n; ++i) {
      run.tokens[i].push_back(argmax(std::span(logits).subspan(i * V, V)));
      chunks[i] = std::span(run.tokens[i]).last(1);
    }
    run.logits.push_back(std::move(logits));
  }
  for (SeqId s : seqs) engine.close(s);
  return run;
}

void expect_bitwise_equal(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " logits differ, first at " << first << " (" << a[first]
                        << " vs " << b[first] << ")";
  for (float v : a) ASSERT_TRUE(std::isfinite(v)) << what;
}

void expect_tp1_equals_plain(const WeightSource& w) {
  CudaEngine plain(w, small_options());
  TpEngine tp(w, small_options(), {0});
  EXPECT_EQ(tp.world(), 1);
  EXPECT_EQ(tp.kv_capacity_tokens(), plain.kv_capacity_tokens());
  const auto ps = prompts(w.config().vocab_size);
  for (size_t i = 0; i < ps.size(); ++i)
    expect_bitwise_equal(tp.logits(ps[i]), plain.logits(ps[i]), "prompt " + std::to_string(i));
  const GreedyRun a = greedy(plain, ps, 24), b = greedy(tp, ps, 24);
  EXPECT_EQ(b.tokens, a.tokens);
  for (size_t s = 0; s < a.logits.size(); ++s) expect_bitwise_equal(b.logits[s], a.logits[s], "step " + std::to_string(s));
  EXPECT_EQ(tp.kv_free_tokens(), tp.kv_capacity_tokens());  // every page back
}

TEST(TpEngine, OneRankThroughNcclEqualsThePlainEngine) {
  GPULAB_REQUIRE_GPU();
  expect_tp1_equals_plain(tiny());
}

TEST(TpEngine, OneRankThroughNcclEqualsThePlainEngineOnRandomGqaWeights) {
  GPULAB_REQUIRE_GPU();
  expect_tp1_equals_plain(gqa_random());
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - want[i]) * double(got[i] - want[i]);
    den += want[i] * double(want[i]);
  }
  return std::sqrt(num / den);
}

// `got` against `want` on prompts `ps`, engines whose sums run in different orders: prompt logits
// within relative L2 1e-2 (bf16 rounding of activations that now come from sums in another order),
// and greedy decoding (`steps` tokens) equal until want's logits hold a near tie between the two
// tokens (within two bf16 steps, 2^-6 relative), each step's logits within 1e-2 while the tokens
// agree. `want` is a TpEngine or the plain CudaEngine.
template <class Want>
void expect_close(Want& want, TpEngine& got, const std::vector<std::vector<int32_t>>& ps, const std::string& label,
                  int steps = 24) {
  const int world = got.world();
  const int64_t V = got.config().vocab_size;
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<float> a = want.logits(ps[i]), b = got.logits(ps[i]);
    ASSERT_EQ(a.size(), b.size());
    const double e = rel_l2(b, a);
    std::printf("TP %d prompt %zu: logits rel L2 %.2e vs %s\n", world, i, e, label.c_str());
    std::fflush(stdout);  // a run that a sanitizer's time limit ends still shows how far it got
    EXPECT_LE(e, 1e-2) << "prompt " << i;
  }
  std::printf("TP %d: greedy runs of %zu sequences, %d tokens\n", world, ps.size(), steps);
  std::fflush(stdout);
  const GreedyRun a = greedy(want, ps, steps), b = greedy(got, ps, steps);
  for (size_t i = 0; i < ps.size(); ++i) {
    size_t t = 0;
    while (t < a.tokens[i].size() && a.tokens[i][t] == b.tokens[i][t]) {
      const std::vector<float> ra(a.logits[t].begin() + i * V, a.logits[t].begin() + (i + 1) * V);
      const std::vector<float> rb(b.logits[t].begin() + i * V, b.logits[t].begin() + (i + 1) * V);
      EXPECT_LE(rel_l2(rb, ra), 1e-2) << "sequence " << i << " step " << t;
      ++t;
    }
    std::printf("TP %d sequence %zu: %zu of %zu greedy tokens equal %s's\n", world, i, t, a.tokens[i].size(),
                label.c_str());
    if (t == a.tokens[i].size()) continue;
    const float* row = a.logits[t].data() + i * V;
    const float top = row[a.tokens[i][t]], other = row[b.tokens[i][t]];
    EXPECT_LE(top - other, std::ldexp(std::abs(top), -6))
        << "sequence " << i << " step " << t << ": TP " << world << " chose " << b.tokens[i][t] << " over "
        << a.tokens[i][t] << ", not a near tie in " << label << "'s logits (" << other << " vs " << top << ")";
  }
}

void expect_tp_matches_tp1(const WeightSource& w, int world) {
  SCOPED_TRACE("TP " + std::to_string(world));
  TpEngine one(w, small_options(), {0});
  TpEngine many(w, small_options(), tp_devices(world));
  EXPECT_EQ(many.world(), world);
  expect_close(one, many, prompts(w.config().vocab_size), "TP 1");
}

TEST(TpEngine, AllVisibleGpusMatchOneRank) {
  GPULAB_REQUIRE_GPU();
  const int n = visible_gpus();
  if (n < 2) GTEST_SKIP() << "needs 2 or more GPUs for tensor parallelism, " << n << " visible";
  bool ran = false;
  if (4 % n == 0) {  // llama_tiny: 4 heads, 2 KV heads
    expect_tp_matches_tp1(tiny(), n);
    ran = true;
  }
  if (8 % n == 0) {
    expect_tp_matches_tp1(gqa_random(), n);
    ran = true;
  }
  if (!ran) GTEST_SKIP() << n << " GPUs divide neither fixture's heads (4 and 8)";
}

// Issue #9's check at the 7B shape: random weights (HF's std 0.02, filled on each GPU), tensor
// parallel over every visible GPU against the plain engine on one, 64 greedy tokens. On one GPU
// this is TP 1 through NCCL, which must match bit for bit; on 8 it is the TP 8. Under
// racecheck 2 of the 32 layers (seven_b_shape), the last two prompts (ids of the last rank's
// vocabulary shard, 40 random ids) and 2 tokens, the second replayed from the decode graph: each
// token launches the same kernels at the same shapes. At 64 tokens the run outlasted a 560 s call
// (session 44); at 8 tokens and all 7 prompts the logits took under 204 s and the greedy runs
// were not done by 570 s (session 46, H100).
TEST(TpEngine, SevenBShapeOnEveryVisibleGpuMatchesOneGpu) {
  GPULAB_REQUIRE_GPU();
  const int n = visible_gpus();
  if (32 % n) GTEST_SKIP() << n << " GPUs do not divide the 7B shape's 32 heads";
  const WeightSource w = WeightSource::random(testing::seven_b_shape(2), 7);
  CudaEngine one(w, small_options());
  TpEngine many(w, small_options(), tp_devices(n));
  auto ps = prompts(w.config().vocab_size);
  if (under_racecheck()) ps.erase(ps.begin(), ps.end() - 2);
  expect_close(one, many, ps, "one GPU", under_racecheck() ? 2 : 64);
}

// The residual's all-reduce over NCCL symmetric memory (EngineOptions::nccl_symmetric; the log
// says whether NCCL gave the window) against a plain buffer (the default) on every visible
// GPU. Prompt passes (heuristic GEMM algorithms, the same in both engines) at 2 ranks bit for bit:
// a sum of two is the same in any order, whatever kernel adds it. Then expect_close, prompts and
// greedy decoding from the CUDA graph: NCCL's symmetric kernels may add more ranks in another
// order, and each engine times its own decode GEMM algorithms.
TEST(TpEngine, SymmetricMemoryAllReduceMatchesThePlainOne) {
  GPULAB_REQUIRE_GPU();
  const int n = visible_gpus();
  if (n < 2 || 8 % n) GTEST_SKIP() << "needs 2, 4 or 8 GPUs, " << n << " visible";
  EngineOptions off = small_options(), on = small_options();
  off.nccl_symmetric = false;
  on.nccl_symmetric = true;
  if (residual_wants_symmetric_memory(off) || !residual_wants_symmetric_memory(on))
    GTEST_SKIP() << "GPULAB_NCCL_SYMMETRIC is set: it overrides both engines";
  const WeightSource w = gqa_random();
  TpEngine plain(w, off, tp_devices(n));
  TpEngine symmetric(w, on, tp_devices(n));
  const auto ps = prompts(w.config().vocab_size);
  if (n == 2) {
    for (size_t i = 0; i < ps.size(); ++i)
      expect_bitwise_equal(symmetric.logits(ps[i]), plain.logits(ps[i]), "prompt " + std::to_string(i));
  }
  expect_close(plain, symmetric, ps, "the plain all-reduce");
}

// TP 2 on the transformers fixture when 2 GPUs are visible, whatever their count.
TEST(TpEngine, TwoGpusMatchTheFixture) {
  GPULAB_REQUIRE_GPU();
  if (visible_gpus() < 2) GTEST_SKIP() << "needs 2 GPUs, " << visible_gpus() << " visible";
  TpEngine tp(tiny(), small_options(), tp_devices(2));
  for (const auto& c : testing::load_fixture_cases("llama_tiny")) {
    const std::vector<float> got = tp.logits(c.ids);
    EXPECT_LE(rel_l2(got, c.logits), 2e-2);
  }
}

TEST(TpEngine, TpAboveTheVisibleGpusIsOneClearError) {
  GPULAB_REQUIRE_GPU();
  const int n = visible_gpus();
  EngineSpec spec;
  spec.device = "cuda";
  spec.tp = n + 1;
  try {
    make_engine(tiny(), spec);
    FAIL() << "--tp " << n + 1 << " with " << n << " GPUs was accepted";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("visible"), std::string::npos) << e.what();
  }
  spec.tp = 8;  // llama_tiny's 4 heads do not split 8 ways, whatever the GPUs
  if (n >= 8) {
    EXPECT_THROW(make_engine(tiny(), spec), core::InputError);
  }
}

// A tensor-parallel group as it runs over processes, here with a thread per rank: rank 0 a
// LeaderEngine on GPU 0, ranks 1.. following it on their GPUs.
class ProcessGroup {
 public:
  ProcessGroup(const WeightSource& w, int world) : comms_(world) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    std::vector<int> devices(world);
    for (int r = 0; r < world; ++r) devices[r] = r;
    GPULAB_CHECK(ncclCommInitAll(comms_.data(), world, devices.data()));
    for (int r = 1; r < world; ++r)
      followers_.emplace_back([this, &w, r, world] {
        try {
          GPULAB_CHECK(cudaSetDevice(r));
          EngineOptions o = small_options();
          o.shard = {r, world};
          o.comm = comms_[r];
          follow_leader(w, o);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "follower " << r << ": " << e.what();
        }
      });
    GPULAB_CHECK(cudaSetDevice(0));
    EngineOptions o = small_options();
    o.shard = {0, world};
    o.comm = comms_[0];
    leader_ = std::make_unique<LeaderEngine>(w, o);
  }
  ~ProcessGroup() {
    leader_.reset();  // stops the followers
    for (auto& t : followers_) t.join();
    for (ncclComm_t c : comms_) GPULAB_CHECK_NOTHROW(ncclCommDestroy(c));
  }
  LeaderEngine& leader() { return *leader_; }

 private:
  std::vector<ncclComm_t> comms_;
  std::vector<std::thread> followers_;
  std::unique_ptr<LeaderEngine> leader_;
};

TEST(TpProcesses, OneRankLeaderEqualsThePlainEngine) {
  GPULAB_REQUIRE_GPU();
  const WeightSource w = tiny();
  CudaEngine plain(w, small_options());
  ProcessGroup group(w, 1);
  const auto ps = prompts(1024);
  for (size_t i = 0; i < ps.size(); ++i)
    expect_bitwise_equal(group.leader().logits(ps[i]), plain.logits(ps[i]), "prompt " + std::to_string(i));
  const GreedyRun a = greedy(plain, ps, 24), b = greedy(group.leader(), ps, 24);
  EXPECT_EQ(b.tokens, a.tokens);
  for (size_t s = 0; s < a.logits.size(); ++s) expect_bitwise_equal(b.logits[s], a.logits[s], "step " + std::to_string(s));
}

// The followers replay the leader's calls: the group computes what the threaded engine does
// on the same GPUs (the same shards and collectives), a refused call included. The threaded
// engine runs first and is gone before the group starts: a follower waits for the leader's next
// call inside a broadcast kernel, and the other engine's synchronising calls on that GPU would
// wait for that kernel (on the H200 the interleaved test hung).
TEST(TpProcesses, LeaderAndFollowersMatchTheThreadedEngine) {
  GPULAB_REQUIRE_GPU();
  const int n = visible_gpus();
  if (n < 2 || 8 % n) GTEST_SKIP() << "needs 2, 4 or 8 GPUs, " << n << " visible";
  const WeightSource w = gqa_random();
  const auto ps = prompts(w.config().vocab_size);
  std::vector<std::vector<float>> want;
  GreedyRun a;
  {
    TpEngine threads(w, small_options(), tp_devices(n));
    for (const auto& p : ps) want.push_back(threads.logits(p));
    a = greedy(threads, ps, 24);
  }
  ProcessGroup group(w, n);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_LE(rel_l2(group.leader().logits(ps[i]), want[i]), 1e-6) << "prompt " << i;
  // A step the engines refuse (a token outside the vocabulary) leaves the group in step.
  const auto seq = group.leader().open(8);
  ASSERT_TRUE(seq);
  const SeqId s[1] = {*seq};
  const int32_t bad[2] = {1, 5000};
  const std::span<const int32_t> chunk[1] = {bad};
  std::vector<float> out(w.config().vocab_size);
  EXPECT_THROW(group.leader().step(s, chunk, out), core::InputError);
  group.leader().close(*seq);
  const GreedyRun b = greedy(group.leader(), ps, 24);
  EXPECT_EQ(b.tokens, a.tokens);
  for (size_t t = 0; t < a.logits.size(); ++t) EXPECT_LE(rel_l2(b.logits[t], a.logits[t]), 1e-6) << "step " << t;
}

}  // namespace
}  // namespace gpulab::llm
