// The trainer end to end on a tiny model and a small generated corpus: learning, the LR
// schedule, bitwise-exact resume, divergence, and each spike policy.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <malloc.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/memory_plan.h"
#include "config/model_config.h"
#include "config/param_count.h"
#include "config/presets.h"
#include "tests/test_configs.h"
#include "tests/worker/corpus_fixture.h"
#include "tests/worker/tiny_run_config.h"
#include "worker/model/torch_compat.h"
#include "worker/train/collective.h"
#include "worker/train/optimizer.h"
#include "worker/train/trainer.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;

// The peak of tensor memory on the CPU since the run started (TrainerObserver callbacks run on
// the training thread, between steps).
int64_t MeasuredPeak() { return compat::CpuTensorMemory().peak; }

// Collects everything a run reports; optionally raises an interrupt at a step.
class Recorder : public TrainerObserver {
 public:
  Directive OnStep(const StepMetrics& m) override {
    steps.push_back(m);
    if (interrupt_at > 0 && m.step() == interrupt_at) interrupt->store(true);
    return stop_at > 0 && m.step() == stop_at ? Directive::kStop : Directive::kContinue;
  }
  Directive BeforeCheckpoint(int64_t step) override {
    return stop_before_checkpoint_at > 0 && step == stop_before_checkpoint_at ? Directive::kStop
                                                                             : Directive::kContinue;
  }
  void OnEval(const EvalResult& e) override { evals.push_back(e); }
  void OnSpike(const SpikeEvent& e) override { spikes.push_back(e); }
  void OnCheckpoint(int64_t step, const std::string&) override { checkpoints.push_back(step); }
  void OnNotice(const std::string& line) override { notices.push_back(line); }

  std::vector<StepMetrics> steps;
  std::vector<std::string> notices;
  std::vector<EvalResult> evals;
  std::vector<SpikeEvent> spikes;
  std::vector<int64_t> checkpoints;
  int64_t interrupt_at = 0, stop_at = 0, stop_before_checkpoint_at = 0;
  std::atomic<bool>* interrupt = nullptr;
};

class TrainerTest : public testing::CorpusTest {
 protected:
  TrainerTest() : CorpusTest("ablate_trainer_test") {}

  RunConfig Config() { return testing::TinyRunConfig(corpus_path(), 40); }

  absl::StatusOr<RunSummary> Train(const RunConfig& config, const std::string& sub,
                                   Recorder* rec, bool resume = false,
                                   std::atomic<bool>* interrupt = nullptr,
                                   int64_t stop_at_step = 0) {
    TrainerOptions options;
    options.checkpoint_dir = (dir_ / sub).string();
    options.resume = resume;
    options.interrupt = interrupt;
    options.stop_at_step = stop_at_step;
    auto trainer = Trainer::Create(config, options);
    if (!trainer.ok()) return trainer.status();
    return (*trainer)->Run(rec);
  }

  // Trains `config` in `sub` into `rec`, a run that must end `state`; its summary in *summary. A
  // trainer error is fatal (callers check with ASSERT_NO_FATAL_FAILURE).
  void TrainTo(RunState state, const RunConfig& config, const std::string& sub, Recorder* rec,
               RunSummary* summary) {
    absl::StatusOr<RunSummary> trained = Train(config, sub, rec);
    ASSERT_TRUE(trained.ok()) << trained.status();
    EXPECT_EQ(trained->state(), state);
    *summary = *std::move(trained);
  }
};

// A block over 64 MiB allocated on a thread other than main stays in the heap: no mmap, so a
// trainer on the agent's job thread does not map and zero its large activations again every
// step. Checked in a process of its own (a death test's), where no other thread has taken an
// arena of its own before KeepFreedMemoryInHeap runs, as in main().
void* volatile sink = nullptr;

TEST(KeepFreedMemoryInHeapTest, LargeBlocksOfOtherThreadsStayInTheHeap) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        KeepFreedMemoryInHeap();
        const int64_t before = mallinfo2().hblks;  // what the libraries mapped as they loaded
        int64_t mapped = 0;
        std::thread other([&] {
          for (int i = 0; i < 3; ++i) {
            void* block = std::malloc(size_t{96} << 20);  // over glibc's 64 MiB arena heaps
            std::memset(block, 1, 4096);
            sink = block;
            mapped += static_cast<int64_t>(mallinfo2().hblks) - before;
            std::free(sink);
          }
        });
        other.join();
        if (mapped != 0) std::fprintf(stderr, "%lld blocks were mmapped\n", static_cast<long long>(mapped));
        std::_Exit(mapped == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// A threshold of INT_MAX, the largest mallopt takes, still trimmed a free top chunk over 2 GiB
// (activations at 32k tokens a step and d_model 512 come near it); -1 turns trimming off. Only
// address space: the 3 GiB block is never touched.
TEST(KeepFreedMemoryInHeapTest, AFreedTopOver2GiBStaysInTheHeap) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        KeepFreedMemoryInHeap();
        void* block = std::malloc(size_t{3} << 30);
        sink = block;
        const size_t heap = mallinfo2().arena;
        std::free(sink);
        const size_t after = mallinfo2().arena;
        if (block == nullptr) std::fprintf(stderr, "malloc of 3 GiB failed (overcommit off?)\n");
        if (block != nullptr && after < heap) {
          std::fprintf(stderr, "the heap went from %zu to %zu bytes\n", heap, after);
        }
        std::_Exit(block != nullptr && after >= heap ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(LearningRateTest, WarmupThenCosineToMin) {
  OptimizerConfig o = DefaultTrainConfig().optimizer();
  o.set_lr(1.0);
  o.set_min_lr(0.1);
  o.set_warmup_steps(10);
  EXPECT_DOUBLE_EQ(Trainer::LearningRate(o, 1, 110), 0.1);
  EXPECT_DOUBLE_EQ(Trainer::LearningRate(o, 10, 110), 1.0);
  EXPECT_NEAR(Trainer::LearningRate(o, 60, 110), 0.55, 1e-12);  // halfway: the midpoint
  EXPECT_NEAR(Trainer::LearningRate(o, 110, 110), 0.1, 1e-12);
}

TEST_F(TrainerTest, LearnsAndReportsEverything) {
  Recorder rec;
  RunConfig c = Config();
  auto summary = Train(c, "run", &rec);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->state(), SUCCEEDED);
  EXPECT_EQ(summary->steps_done(), 40);
  ASSERT_EQ(rec.steps.size(), 40u);
  EXPECT_LT(rec.steps.back().loss(), rec.steps.front().loss() - 1.0);
  EXPECT_NEAR(rec.steps.front().loss(), std::log(256.0), 0.3);  // starts near uniform
  ASSERT_EQ(rec.evals.size(), 2u);
  EXPECT_EQ(rec.evals[1].step(), 40);
  EXPECT_EQ(rec.evals[1].probes().layers_size(), 2);
  EXPECT_TRUE(rec.evals[1].probes().layers(0).has_gate());  // TinyDense has a G1 gate
  EXPECT_NEAR(summary->final_eval().val_ppl(), std::exp(summary->final_eval().val_loss()), 1e-9);
  EXPECT_EQ(rec.checkpoints, (std::vector<int64_t>{10, 20, 30, 40}));
  EXPECT_TRUE(fs::exists(dir_ / "run" / "checkpoint.pt"));
  EXPECT_TRUE(fs::exists(dir_ / "run" / "checkpoint.prev.pt"));  // the checkpoint of step 30
  for (const fs::directory_entry& e : fs::directory_iterator(dir_ / "run")) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
  EXPECT_TRUE(rec.notices.empty());
  EXPECT_GT(summary->tokens_per_s(), 0);
  EXPECT_EQ(summary->params().total(), CountParams(c.model()).total());
}

// Continued training (appendix A.7): a gated run starts from a baseline's final weights; the
// gate it adds starts fresh and is named; a config that would drop trained parameters, or
// change their shapes, is refused.
TEST_F(TrainerTest, InitFromStartsFromAnotherRunsWeightsAndNamesWhatIsFresh) {
  RunConfig base = Config();
  *base.mutable_model() = TinyDense();
  base.mutable_model()->set_vocab_size(256);
  base.mutable_model()->set_max_seq_len(32);
  base.mutable_train()->set_steps(30);
  Recorder trained;
  ASSERT_TRUE(Train(base, "base", &trained).ok());
  const std::string source = (dir_ / "base" / "checkpoint.pt").string();

  RunConfig gated = Config();
  gated.mutable_train()->mutable_init_from()->set_checkpoint(source);
  gated.mutable_train()->set_steps(5);
  Recorder continued;
  auto summary = Train(gated, "gated", &continued);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(continued.notices.size(), 1u);
  EXPECT_THAT(continued.notices[0], ::testing::HasSubstr("initialised from " + source));
  EXPECT_THAT(continued.notices[0], ::testing::HasSubstr("fresh (this config adds them): "));
  EXPECT_THAT(continued.notices[0], ::testing::HasSubstr("gate"));
  // It starts where the baseline ended, not from a uniform guess.
  EXPECT_LT(continued.steps.front().loss(), trained.steps.front().loss() - 1.0);
  EXPECT_LT(continued.steps.front().loss(), trained.steps.back().loss() + 0.5);

  // The other way round drops the gate's trained weights: refused, naming them.
  RunConfig back = base;
  back.mutable_train()->mutable_init_from()->set_checkpoint(
      (dir_ / "gated" / "checkpoint.pt").string());
  auto dropped = Train(back, "back", &continued);
  ASSERT_FALSE(dropped.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(dropped.status())) << dropped.status();
  EXPECT_THAT(std::string(dropped.status().message()),
              ::testing::HasSubstr("never drop trained ones"));
  RunConfig wider = gated;
  wider.mutable_model()->set_ffn_dim(wider.model().ffn_dim() + 8);
  auto reshaped = Train(wider, "wider", &continued);
  ASSERT_FALSE(reshaped.ok());
  EXPECT_THAT(std::string(reshaped.status().message()), ::testing::HasSubstr("in this config"));
  RunConfig missing = gated;
  missing.mutable_train()->mutable_init_from()->set_checkpoint((dir_ / "nope.pt").string());
  EXPECT_TRUE(absl::IsNotFound(Train(missing, "missing", &continued).status()));
}

// Long context (the paper's Table 5 at toy scale): a run trained at 16 tokens continues at 32
// with a new RoPE base from its final weights (RoPE has no parameters, so nothing is fresh), then
// every evaluation also measures PPL at 16..128 tokens, with YaRN beyond 32; and stores the
// attention maps of its first validation window.
TEST_F(TrainerTest, LongContextContinuesAtALongerLengthAndEvaluatesPplAgainstLength) {
  RunConfig short_run = Config();
  short_run.mutable_model()->set_max_seq_len(16);
  short_run.mutable_train()->set_seq_len(16);
  short_run.mutable_train()->set_steps(20);
  Recorder trained;
  ASSERT_TRUE(Train(short_run, "short", &trained).ok());

  RunConfig long_run = Config();
  long_run.mutable_model()->set_max_seq_len(128);
  long_run.mutable_model()->set_rope_base(40000);
  long_run.mutable_model()->mutable_yarn()->set_factor(4);
  long_run.mutable_model()->mutable_yarn()->set_original_seq_len(32);
  TrainConfig* t = long_run.mutable_train();
  t->set_steps(6);
  t->set_eval_every(3);
  t->set_checkpoint_every(3);
  t->mutable_init_from()->set_checkpoint((dir_ / "short" / "checkpoint.pt").string());
  for (int len : {16, 32, 64, 128}) t->add_eval_seq_lens(len);
  Recorder rec;
  auto summary = Train(long_run, "long", &rec);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(rec.notices.size(), 1u);
  EXPECT_THAT(rec.notices[0], ::testing::HasSubstr("parameter tensors loaded"));
  EXPECT_THAT(rec.notices[0], ::testing::Not(::testing::HasSubstr("fresh")));
  EXPECT_LT(rec.steps.front().loss(), trained.steps.front().loss() - 1.0);  // it continued

  ASSERT_EQ(rec.evals.size(), 2u);
  for (const EvalResult& e : rec.evals) {
    ASSERT_EQ(e.lengths_size(), 4);
    const bool want_yarn[] = {false, false, true, true};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(e.lengths(i).seq_len(), t->eval_seq_lens(i));
      EXPECT_EQ(e.lengths(i).yarn(), want_yarn[i]) << i;
      EXPECT_TRUE(std::isfinite(e.lengths(i).val_loss()));
      EXPECT_NEAR(e.lengths(i).val_ppl(), std::exp(e.lengths(i).val_loss()), 1e-9);
    }
    // 2 layers x (the mean over the 4 heads, the default 2 heads), over min(64, seq_len 32)
    // positions.
    ASSERT_EQ(e.attention_maps_size(), 6);
    EXPECT_EQ(e.attention_maps(0).head(), -1);
    EXPECT_EQ(e.attention_maps(5).layer(), 1);
    EXPECT_EQ(e.attention_maps(5).head(), 1);
    EXPECT_EQ(e.attention_maps(0).size(), 32);
    EXPECT_EQ(e.attention_maps(0).probs().size(), 32u * 32u);
  }
  EXPECT_EQ(summary->final_eval().lengths_size(), 4);

  // Without YaRN the lengths beyond 32 are measured with the plain tables: other numbers.
  RunConfig plain = long_run;
  plain.mutable_model()->clear_yarn();
  plain.mutable_train()->set_attention_map_heads(0);
  Recorder plain_rec;
  ASSERT_TRUE(Train(plain, "plain", &plain_rec).ok());
  const EvalResult& p = plain_rec.evals.back();
  EXPECT_FALSE(p.lengths(3).yarn());
  EXPECT_DOUBLE_EQ(p.lengths(1).val_loss(), rec.evals.back().lengths(1).val_loss());
  EXPECT_NE(p.lengths(3).val_loss(), rec.evals.back().lengths(3).val_loss());
  EXPECT_EQ(p.attention_maps_size(), 0);

  // yarn.apply: always (the paper's Table 5): every length with YaRN's tables, the trained ones
  // too, where they differ from the plain tables' numbers; beyond 32 the same as before.
  RunConfig always = long_run;
  always.mutable_model()->mutable_yarn()->set_apply(YARN_ALWAYS);
  Recorder always_rec;
  ASSERT_TRUE(Train(always, "always", &always_rec).ok());
  const EvalResult& a = always_rec.evals.back();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(a.lengths(i).yarn()) << i;
  EXPECT_NE(a.lengths(1).val_loss(), rec.evals.back().lengths(1).val_loss());
  EXPECT_DOUBLE_EQ(a.lengths(3).val_loss(), rec.evals.back().lengths(3).val_loss());

  // Lengths the config or the data cannot give are errors that name them.
  RunConfig too_long = long_run;
  too_long.mutable_train()->add_eval_seq_lens(256);
  auto refused = Train(too_long, "too_long", &rec);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("train.eval_seq_lens[4]: 256 exceeds model.max_seq_len 128"));
  RunConfig no_data = long_run;
  no_data.mutable_model()->set_max_seq_len(8192);
  no_data.mutable_train()->add_eval_seq_lens(8000);
  auto short_data = Train(no_data, "no_data", &rec);
  EXPECT_THAT(std::string(short_data.status().message()),
              ::testing::HasSubstr("train.eval_seq_lens: every length is measured on eval_batches "
                                   "x batch_size windows of the longest (2 x 4 x 8000 = 64000 "
                                   "tokens), which needs 64001 validation tokens"));
}

TEST_F(TrainerTest, ResumeContinuesWithBitwiseIdenticalLosses) {
  RunConfig c = Config();
  c.mutable_train()->set_checkpoint_every(7);  // the interrupt writes its own checkpoint
  Recorder straight;
  ASSERT_TRUE(Train(c, "straight", &straight).ok());

  std::atomic<bool> interrupt{false};
  Recorder first;
  first.interrupt_at = 23;
  first.interrupt = &interrupt;
  auto part1 = Train(c, "split", &first, /*resume=*/false, &interrupt);
  ASSERT_TRUE(part1.ok()) << part1.status();
  EXPECT_EQ(part1->state(), INTERRUPTED);
  EXPECT_EQ(part1->steps_done(), 23);
  Recorder second;
  auto part2 = Train(c, "split", &second, /*resume=*/true);
  ASSERT_TRUE(part2.ok()) << part2.status();
  EXPECT_EQ(part2->state(), SUCCEEDED);
  ASSERT_EQ(first.steps.size() + second.steps.size(), straight.steps.size());
  for (size_t i = 0; i < straight.steps.size(); ++i) {
    const StepMetrics& m = i < first.steps.size() ? first.steps[i] : second.steps[i - first.steps.size()];
    EXPECT_EQ(m.step(), straight.steps[i].step());
    EXPECT_EQ(m.loss(), straight.steps[i].loss()) << "step " << i + 1;  // bitwise
    EXPECT_EQ(m.grad_norm(), straight.steps[i].grad_norm()) << "step " << i + 1;
  }
  EXPECT_EQ(part2->final_eval().val_loss(), straight.evals.back().val_loss());
}

// A rung: the run pauses after step 13 (no multiple of eval_every or checkpoint_every) with an
// evaluation and a checkpoint of its own, and promoted from there it ends bit for bit as the run
// trained straight through. A stop at or past the last step changes nothing.
TEST_F(TrainerTest, PausedAtARungAndResumedEndsBitwiseAsTheStraightRun) {
  RunConfig c = Config();
  Recorder straight;
  ASSERT_TRUE(Train(c, "straight", &straight).ok());

  Recorder rung;
  auto part1 = Train(c, "rung", &rung, /*resume=*/false, nullptr, /*stop_at_step=*/13);
  ASSERT_TRUE(part1.ok()) << part1.status();
  EXPECT_EQ(part1->state(), INTERRUPTED);
  EXPECT_EQ(part1->steps_done(), 13);
  EXPECT_EQ(part1->reason(), "paused at step 13; checkpoint written");
  ASSERT_EQ(rung.evals.size(), 1u);
  EXPECT_EQ(rung.evals[0].step(), 13);
  EXPECT_EQ(part1->final_eval().step(), 13);
  ASSERT_FALSE(rung.checkpoints.empty());
  EXPECT_EQ(rung.checkpoints.back(), 13);

  Recorder promoted;
  auto part2 = Train(c, "rung", &promoted, /*resume=*/true);
  ASSERT_TRUE(part2.ok()) << part2.status();
  EXPECT_EQ(part2->state(), SUCCEEDED);
  ASSERT_EQ(rung.steps.size() + promoted.steps.size(), straight.steps.size());
  for (size_t i = 0; i < straight.steps.size(); ++i) {
    const StepMetrics& m =
        i < rung.steps.size() ? rung.steps[i] : promoted.steps[i - rung.steps.size()];
    EXPECT_EQ(m.step(), straight.steps[i].step());
    EXPECT_EQ(m.loss(), straight.steps[i].loss()) << "step " << i + 1;  // bitwise
    EXPECT_EQ(m.grad_norm(), straight.steps[i].grad_norm()) << "step " << i + 1;
  }
  ASSERT_EQ(promoted.evals.size(), straight.evals.size());
  for (size_t i = 0; i < straight.evals.size(); ++i) {
    EXPECT_EQ(promoted.evals[i].step(), straight.evals[i].step());
    EXPECT_EQ(promoted.evals[i].val_loss(), straight.evals[i].val_loss());
  }
  EXPECT_EQ(part2->final_eval().val_loss(), straight.evals.back().val_loss());

  Recorder at_end;
  auto whole = Train(c, "at_end", &at_end, /*resume=*/false, nullptr, /*stop_at_step=*/40);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->state(), SUCCEEDED);
  EXPECT_EQ(whole->final_eval().val_loss(), straight.evals.back().val_loss());
  EXPECT_FALSE(Train(c, "negative", &at_end, false, nullptr, -1).ok());
}

// A checkpoint torn on disk (a crash before it reached the disk, a second writer): resuming moves
// it aside and continues from the previous good checkpoint, or from step 0 when none is good, and
// the run still ends bit for bit equal to one never interrupted.
TEST_F(TrainerTest, ATruncatedCheckpointIsMovedAsideAndTheRunResumesFromAnEarlierOne) {
  RunConfig c = Config();
  Recorder straight;
  ASSERT_TRUE(Train(c, "straight", &straight).ok());
  for (const bool previous_good : {true, false}) {
    SCOPED_TRACE(previous_good ? "the previous checkpoint is good" : "no checkpoint is good");
    const std::string sub = previous_good ? "prev" : "none";
    const fs::path run = dir_ / sub;
    std::atomic<bool> interrupt{false};
    Recorder first;
    first.interrupt_at = 25;  // checkpoints of steps 10, 20, then 25 (the interrupt's)
    first.interrupt = &interrupt;
    auto part1 = Train(c, sub, &first, /*resume=*/false, &interrupt);
    ASSERT_TRUE(part1.ok()) << part1.status();
    ASSERT_EQ(part1->steps_done(), 25);
    auto truncate = [](const fs::path& path) {
      ASSERT_TRUE(fs::exists(path)) << path;
      fs::resize_file(path, fs::file_size(path) / 2);
    };
    truncate(run / "checkpoint.pt");
    if (!previous_good) {
      truncate(run / "checkpoint.prev.pt");
    }
    const int64_t resumed_from = previous_good ? 20 : 0;

    Recorder second;
    TrainerOptions options;
    options.checkpoint_dir = run.string();
    options.resume = true;
    auto trainer = Trainer::Create(c, options);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    EXPECT_EQ((*trainer)->step(), resumed_from);
    auto part2 = (*trainer)->Run(&second);
    ASSERT_TRUE(part2.ok()) << part2.status();
    EXPECT_EQ(part2->state(), SUCCEEDED);
    EXPECT_EQ(part2->steps_done(), 40);
    ASSERT_EQ(second.steps.size(), static_cast<size_t>(40 - resumed_from));
    for (const StepMetrics& m : second.steps) {
      EXPECT_EQ(m.loss(), straight.steps[m.step() - 1].loss()) << "step " << m.step();  // bitwise
    }
    // The torn files are kept aside for a post-mortem, never loaded again.
    int aside = 0;
    for (const fs::directory_entry& e : fs::directory_iterator(run)) {
      const std::string name = e.path().filename().string();
      EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
      aside += name.find(".corrupt-") != std::string::npos;
    }
    EXPECT_EQ(aside, previous_good ? 1 : 2);
    // Said once, at the start of the run: which file, where it went, where training resumed.
    ASSERT_EQ(second.notices.size(), previous_good ? 1u : 2u);
    EXPECT_NE(second.notices[0].find("checkpoint.pt: unreadable checkpoint"), std::string::npos)
        << second.notices[0];
    EXPECT_NE(second.notices[0].find("moved aside to " + (run / "checkpoint.pt.corrupt-").string()),
              std::string::npos) << second.notices[0];
    EXPECT_NE(second.notices.back().find(previous_good
                                             ? "resumed from checkpoint.prev.pt at step 20"
                                             : "no readable checkpoint left: starting from step 0"),
              std::string::npos) << second.notices.back();
  }
}

TEST_F(TrainerTest, AbsurdLearningRateEndsDivergedWithinAFewSteps) {
  RunConfig c = Config();
  c.mutable_train()->mutable_optimizer()->set_lr(1e4);
  c.mutable_train()->mutable_optimizer()->set_warmup_steps(0);
  c.mutable_train()->mutable_optimizer()->set_grad_clip(0);
  Recorder rec;
  auto summary = Train(c, "run", &rec);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->state(), DIVERGED) << summary->reason();
  EXPECT_LE(summary->steps_done(), 10);
  ASSERT_FALSE(rec.spikes.empty());
  EXPECT_EQ(rec.spikes.back().action(), SPIKE_ACTION_STOPPED);
}

// Spike policies: a statistical detector with a 2-value window and a tiny sigma fires often.
RunConfig Jumpy(RunConfig c, SpikePolicy policy) {
  SpikeConfig* s = c.mutable_train()->mutable_spike();
  s->set_policy(policy);
  s->set_stat_window(2);
  s->set_stat_sigmas(1e-6);
  return c;
}

TEST_F(TrainerTest, SkipPolicySkipsTheUpdateOfSpikingSteps) {
  Recorder rec;
  RunSummary summary;
  ASSERT_NO_FATAL_FAILURE(TrainTo(SUCCEEDED, Jumpy(Config(), SPIKE_SKIP), "run", &rec, &summary));
  ASSERT_FALSE(rec.spikes.empty());
  int skipped = 0;
  for (const StepMetrics& m : rec.steps) skipped += m.skipped();
  EXPECT_GT(skipped, 0);
  EXPECT_EQ(rec.spikes.front().action(), SPIKE_ACTION_SKIPPED);
  EXPECT_EQ(rec.spikes.front().kind(), SPIKE_STATISTICAL);
  EXPECT_GT(summary.spike_score(), 0.0);
  EXPECT_EQ(summary.spike_steps(), skipped);
}

TEST_F(TrainerTest, StopPolicyEndsDivergedAtTheFirstSpike) {
  Recorder rec;
  RunSummary summary;
  ASSERT_NO_FATAL_FAILURE(TrainTo(DIVERGED, Jumpy(Config(), SPIKE_STOP), "run", &rec, &summary));
  ASSERT_FALSE(rec.spikes.empty());
  EXPECT_EQ(rec.spikes.front().step(), summary.steps_done());
  EXPECT_EQ(rec.spikes.front().action(), SPIKE_ACTION_STOPPED);
}

TEST_F(TrainerTest, RollbackPolicyRestoresTheCheckpointAndSkipsAhead) {
  Recorder rec;
  RunSummary summary;
  ASSERT_NO_FATAL_FAILURE(
      TrainTo(SUCCEEDED, Jumpy(Config(), SPIKE_ROLLBACK), "run", &rec, &summary));
  EXPECT_EQ(summary.steps_done(), 40);
  int rolled = 0;
  for (const SpikeEvent& e : rec.spikes) {
    if (e.action() != SPIKE_ACTION_ROLLED_BACK) continue;
    ++rolled;
    EXPECT_LT(e.rollback_to_step(), e.step());
    EXPECT_EQ(e.rollback_to_step() % 10, 0);  // checkpoints every 10 steps (and step 0)
  }
  EXPECT_GT(rolled, 0);
  EXPECT_LE(rolled, 8 * 2);  // at most 8 rollbacks, each with up to 2 signals
  // After a rollback, the steps since the checkpoint are reported again.
  EXPECT_GT(rec.steps.size(), 40u);
}

TEST_F(TrainerTest, StopDirectiveCancels) {
  Recorder rec;
  rec.stop_at = 5;
  RunSummary summary;
  ASSERT_NO_FATAL_FAILURE(TrainTo(CANCELLED, Config(), "run", &rec, &summary));
  EXPECT_EQ(summary.steps_done(), 5);

  // Asked before a checkpoint (an agent whose lease may be gone): stopped, nothing written.
  Recorder before;
  before.stop_before_checkpoint_at = 20;
  RunSummary stopped;
  ASSERT_NO_FATAL_FAILURE(TrainTo(CANCELLED, Config(), "before", &before, &stopped));
  EXPECT_EQ(stopped.steps_done(), 20);
  EXPECT_EQ(before.checkpoints, std::vector<int64_t>{10});
  EXPECT_FALSE(fs::exists(dir_ / "before" / "checkpoint.prev.pt"));
}

TEST_F(TrainerTest, BadConfigAndMissingDataAreErrors) {
  RunConfig c = Config();
  c.mutable_train()->set_seq_len(64);  // > max_seq_len 32
  auto bad = Train(c, "run", nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("train.seq_len"), std::string::npos) << bad.status();

  RunConfig missing = Config();
  missing.mutable_train()->mutable_data()->set_path((dir_ / "nope.txt").string());
  auto nodata = Train(missing, "run", nullptr);
  ASSERT_FALSE(nodata.ok());
  EXPECT_NE(nodata.status().message().find("nope.txt"), std::string::npos) << nodata.status();

  RunConfig cuda = Config();
  cuda.mutable_train()->set_device("cuda:7");
  auto nodevice = Train(cuda, "run", nullptr);
  ASSERT_FALSE(nodevice.ok());
  EXPECT_NE(nodevice.status().message().find("cuda:7"), std::string::npos) << nodevice.status();
}

// PRECISION_BF16 (Megatron-LM's mixed precision) on the CPU: 200 steps train to a loss near
// fp32's (the mean of the last 50 steps within 5%), but not the same one, with finite gradient
// norms throughout.
// On a CPU whose bf16 products accumulate in bf16 (this project's VM with LibTorch 1.13) the
// self-test would refuse the run: skipped here, to test the bf16 code path itself.
TEST_F(TrainerTest, Bf16TrainsNearFp32ButNotBitwiseLikeIt) {
  ::setenv("ABLATE_BF16_SELFTEST", "skip", 1);
  struct Unset {
    ~Unset() { ::unsetenv("ABLATE_BF16_SELFTEST"); }
  } unset;
  RunConfig fp32 = Config();
  fp32.mutable_train()->set_steps(200);
  fp32.mutable_train()->set_eval_every(100);
  fp32.mutable_train()->set_checkpoint_every(0);
  RunConfig bf16 = fp32;
  bf16.mutable_train()->set_precision(PRECISION_BF16);
  Recorder a, b;
  RunSummary sa, sb;
  ASSERT_NO_FATAL_FAILURE(TrainTo(SUCCEEDED, fp32, "fp32", &a, &sa));
  ASSERT_NO_FATAL_FAILURE(TrainTo(SUCCEEDED, bf16, "bf16", &b, &sb));
  ASSERT_EQ(b.steps.size(), 200u);
  for (const StepMetrics& m : b.steps) EXPECT_TRUE(std::isfinite(m.grad_norm())) << m.step();
  EXPECT_NEAR(sb.final_train_loss(), sa.final_train_loss(), 0.05 * sa.final_train_loss())
      << "bf16 " << sb.final_train_loss() << ", fp32 " << sa.final_train_loss();
  EXPECT_NE(sb.final_train_loss(), sa.final_train_loss());
  EXPECT_LT(sb.final_train_loss(), b.steps.front().loss() * 0.8) << "bf16 learns";
  EXPECT_TRUE(std::isfinite(sb.final_eval().val_loss()));
}

// A bf16 run starts only where the self-test passes: on this machine's kernels it is refused at
// once (InvalidArgument: permanent) when ones(1, 1024) x ones(1024, 1) in bf16 is not 1024.
TEST_F(TrainerTest, Bf16RunsAreRefusedWhereProductsAccumulateInBf16) {
  ::unsetenv("ABLATE_BF16_SELFTEST");
  RunConfig bf16 = Config();
  bf16.mutable_train()->set_steps(2);
  bf16.mutable_train()->set_precision(PRECISION_BF16);
  const auto options = torch::TensorOptions().dtype(torch::kBFloat16);
  const double product =
      torch::matmul(torch::ones({1, 1024}, options), torch::ones({1024, 1}, options))
          .item<double>();
  auto run = Train(bf16, "bf16", nullptr);
  if (product == 1024) {
    EXPECT_TRUE(run.ok()) << run.status();
  } else {
    ASSERT_FALSE(run.ok());
    EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(run.status().message().find("train.precision: bf16 is refused on cpu"),
              std::string::npos)
        << run.status();
  }
}

// train.loss_chunk_tokens: the loss 7 tokens at a time (chunks that do not divide a micro-batch)
// takes the whole-logits run's steps, tied embeddings and all: the first step's loss and
// gradient norm within 1e-6 relative (the fp32 sums' order differs), and every step's within
// 1e-3 over 40 steps, as training amplifies those differences.
TEST_F(TrainerTest, AChunkedLossTakesTheWholeLogitsSteps) {
  const RunConfig whole = Config();
  RunConfig chunked = whole;
  chunked.mutable_train()->set_loss_chunk_tokens(7);
  Recorder a, b;
  RunSummary sa, sb;
  ASSERT_NO_FATAL_FAILURE(TrainTo(SUCCEEDED, whole, "whole", &a, &sa));
  ASSERT_NO_FATAL_FAILURE(TrainTo(SUCCEEDED, chunked, "chunked", &b, &sb));
  ASSERT_EQ(a.steps.size(), b.steps.size());
  double worst = 0;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    const double tolerance = i == 0 ? 1e-6 : 1e-3;
    EXPECT_NEAR(b.steps[i].loss(), a.steps[i].loss(), tolerance * a.steps[i].loss()) << i;
    EXPECT_NEAR(b.steps[i].grad_norm(), a.steps[i].grad_norm(),
                tolerance * a.steps[i].grad_norm()) << i;
    worst = std::max(worst, std::fabs(b.steps[i].loss() / a.steps[i].loss() - 1));
  }
  std::printf("chunked loss against the whole logits: worst relative loss difference %.2g\n",
              worst);
}

// The memory plan (config/memory_plan.h, what `ablate expand` shows) against the allocator's
// peak of tensor memory over the first steps of real CPU runs, dense and MoE, with and without
// activation checkpointing: within 20% at every shape, and checkpointing saves what the plan
// says it saves (within the same 20%).
TEST_F(TrainerTest, TheMemoryPlanIsWithinTwentyPercentOfTheAllocatorsPeak) {
  struct Shape {
    std::string name;
    int d_model, layers, heads, ffn, experts, batch, seq;
    int vocab = 0, loss_chunk = 0;  // 0: Config()'s vocabulary; the whole logits
  };
  const Shape shapes[] = {
      {"dense d128 T64 B16", 128, 4, 4, 512, 0, 16, 64},
      {"dense d256 T128 B8", 256, 4, 8, 768, 0, 8, 128},
      {"dense d64 T128 B32 6 layers", 64, 6, 4, 256, 0, 32, 128},
      {"MoE d128 8 experts top-2 T64 B16", 128, 4, 4, 0, 8, 16, 64},
      {"MoE d96 16 experts top-4 T128 B8", 96, 2, 4, 0, 16, 8, 128},
      // A vocabulary that dominates (logits 16 x 128 x 16384 x 4 bytes = 134 MB), whole and
      // in chunks of 256 tokens.
      {"dense d64 T128 B16 vocab 16384", 64, 2, 4, 256, 0, 16, 128, 16384},
      {"... loss in chunks of 256 tokens", 64, 2, 4, 256, 0, 16, 128, 16384, 256},
  };
  for (const Shape& shape : shapes) {
    for (const bool checkpointing : {false, true}) {
      RunConfig c = Config();
      ModelConfig* m = c.mutable_model();
      m->set_d_model(shape.d_model);
      m->set_num_layers(shape.layers);
      m->set_num_heads(shape.heads);
      m->set_num_kv_heads(shape.heads);
      m->set_head_dim(32);
      m->set_max_seq_len(shape.seq);
      m->set_ffn_dim(shape.ffn);
      if (shape.vocab > 0) m->set_vocab_size(shape.vocab);
      if (shape.experts > 0) {
        m->mutable_moe()->set_num_experts(shape.experts);
        m->mutable_moe()->set_top_k(shape.experts / 4);
        m->mutable_moe()->set_expert_dim(shape.d_model);
      }
      TrainConfig* t = c.mutable_train();
      t->set_batch_size(shape.batch);
      t->set_seq_len(shape.seq);
      t->set_steps(3);
      t->set_checkpoint_every(0);
      t->set_activation_checkpointing(checkpointing);
      t->set_loss_chunk_tokens(shape.loss_chunk);
      ASSERT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
      // The peak over steps 1 and 2 (the optimizer's state exists from step 1), read before the
      // last step's evaluation and checkpoint.
      struct PeakAtStep2 : Recorder {
        int64_t peak = 0;
        Directive OnStep(const StepMetrics& m) override {
          if (m.step() == 2) peak = MeasuredPeak();
          return Recorder::OnStep(m);
        }
      } rec;
      RunSummary summary;
      const std::string what = absl::StrCat(shape.name, checkpointing ? ", checkpointed" : "");
      ASSERT_NO_FATAL_FAILURE(TrainTo(SUCCEEDED, c, "mem", &rec, &summary)) << what;
      fs::remove_all(dir_ / "mem");
      const MemoryPlan plan = PlanMemory(c, 1);
      const double ratio = static_cast<double>(rec.peak) / static_cast<double>(plan.per_device());
      std::printf("memory plan %-44s planned %10lld measured %10lld ratio %.3f\n", what.c_str(),
                  static_cast<long long>(plan.per_device()), static_cast<long long>(rec.peak),
                  ratio);
      EXPECT_GT(ratio, 0.8) << what;
      EXPECT_LT(ratio, 1.2) << what;
      EXPECT_GE(summary.peak_memory_bytes(), rec.peak) << what;
    }
  }
}

// What a run cost, in its summary and its steps: the peak of tensor memory, the FLOPs of every
// step taken (TrainingFlopsPerToken x tokens), and the training seconds so far, which a resumed
// run continues from its checkpoint rather than starting again.
TEST_F(TrainerTest, PeakMemoryFlopsAndElapsedTimeAreReported) {
  const RunConfig c = Config();
  Recorder first;
  std::atomic<bool> interrupt{false};
  first.interrupt = &interrupt;
  first.interrupt_at = 15;
  absl::StatusOr<RunSummary> paused = Train(c, "cost", &first, false, &interrupt);
  ASSERT_TRUE(paused.ok()) << paused.status();
  ASSERT_EQ(paused->state(), INTERRUPTED);
  Recorder second;
  absl::StatusOr<RunSummary> done = Train(c, "cost", &second, /*resume=*/true);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), SUCCEEDED);
  EXPECT_GT(done->peak_memory_bytes(), 0);
  const double tokens = 40.0 * c.train().batch_size() * c.train().seq_len();
  EXPECT_DOUBLE_EQ(done->flops(),
                   tokens * TrainingFlopsPerToken(c.model(), c.train().seq_len()));
  double last = 0;
  for (const std::vector<StepMetrics>* steps : {&first.steps, &second.steps}) {
    for (const StepMetrics& m : *steps) {
      EXPECT_GT(m.elapsed_s(), last) << m.step();
      last = m.elapsed_s();
    }
  }
  EXPECT_GT(second.steps.front().elapsed_s(), first.steps.back().elapsed_s());
}

// The sharded-optimizer tests' model: a 7 x 3 matrix, a 5-vector and a 2 x 2 matrix, made
// without random numbers (the ranks' threads would share LibTorch's generator).
std::vector<torch::Tensor> SmallParams() {
  const auto values = [](std::vector<int64_t> shape, double phase) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return torch::cos(torch::arange(n, torch::kFloat32) * 0.7 + phase).view(shape).requires_grad_();
  };
  return std::vector<torch::Tensor>{values({7, 3}, 0.1), values({5}, 0.2), values({2, 2}, 0.3)};
}
const std::vector<bool> kSmallDecays = {true, false, true};  // weight decay on the matrices

// Rank r's gradient of SmallParams()[i] at a step: a different one per rank, so the average
// matters.
torch::Tensor RankGradient(const torch::Tensor& p, size_t i, int rank, int step) {
  return torch::sin(torch::arange(p.numel(), torch::kFloat32) * (rank + 1) *
                    static_cast<double>(step + i + 1)).view_as(p) * 3.0;
}

// AdamW at lr 0.05 with weight decay 0.1.
TrainConfig SmallAdamW() {
  TrainConfig t = DefaultTrainConfig();
  t.mutable_optimizer()->set_lr(0.05);
  t.mutable_optimizer()->set_weight_decay(0.1);
  return t;
}

// body(rank, dist) on 2 threads that form one process group (Gloo on loopback); returns when
// both have.
void OnTwoRanks(const std::function<void(int rank, Collective* dist)>& body) {
  auto server = RendezvousServer::Start("127.0.0.1", 2);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      CollectiveOptions o;
      o.rank = rank;
      o.world_size = 2;
      o.rendezvous = (*server)->address();
      auto dist = Collective::Connect(o);
      ASSERT_TRUE(dist.ok()) << dist.status();
      body(rank, dist->get());
    });
  }
  for (std::thread& r : ranks) r.join();
}

// Each rank's parameters after the sharded steps against the replicated ones (within 1e-6), and
// the gradient norms of every step (norms[0]: sharded, norms[1]: replicated; by rank).
void ExpectTheReplicatedSteps(const std::vector<std::vector<torch::Tensor>>& sharded,
                              const std::vector<std::vector<torch::Tensor>>& replicated,
                              const std::vector<double> (&norms)[2][2]) {
  for (int rank = 0; rank < 2; ++rank) {
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(torch::allclose(sharded[rank][i], replicated[rank][i], 1e-6, 1e-7))
          << "rank " << rank << " param " << i << ": "
          << (sharded[rank][i] - replicated[rank][i]).abs().max().item<double>();
    }
    for (int step = 0; step < 5; ++step) {
      EXPECT_NEAR(norms[0][rank][step], norms[1][rank][step], 1e-6 * norms[1][rank][step]);
    }
  }
}

// The sharded optimizer in buckets of 4 elements, so that buckets cut parameters and ranks'
// chunks end inside them: over 2 ranks (threads, Gloo on loopback) it takes the replicated
// AdamW's steps (weight decay on the matrix only, clipping) within 1e-6, and its state written
// at step 3 and read back by one process goes on as the 2 ranks do.
TEST_F(TrainerTest, ShardedAdamWInSmallBucketsTakesTheReplicatedSteps) {
  const TrainConfig t = SmallAdamW();
  const auto set_grads = [](std::vector<torch::Tensor>& params, int rank, int step) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = RankGradient(params[i], i, rank, step);
    }
  };
  std::vector<std::vector<torch::Tensor>> sharded(2), replicated(2);
  std::vector<double> norms[2][2];
  const fs::path dir = dir_ / "zero";
  fs::create_directories(dir);
  ASSERT_NO_FATAL_FAILURE(OnTwoRanks([&](int rank, Collective* dist) {
    for (int kind = 0; kind < 2; ++kind) {
      TrainConfig tk = t;
      tk.set_shard_optimizer(kind == 0);
      std::vector<torch::Tensor> params = SmallParams();
      auto opt = MakeTrainingOptimizer(params, kSmallDecays, tk, dist, /*bucket_elements=*/4);
      for (int step = 0; step < 5; ++step) {
        opt->ZeroGrad();
        set_grads(params, rank, step);
        norms[kind][rank].push_back(opt->ReduceAndClip(/*max_norm=*/5.0));
        opt->Step();
        if (kind == 0 && step == 2) {
          torch::serialize::OutputArchive archive;
          ASSERT_TRUE(opt->Save(rank == 0 ? &archive : nullptr, dir.string(), 3).ok());
          if (rank == 0) {
            for (size_t i = 0; i < params.size(); ++i) {
              archive.write(absl::StrCat("p", i), params[i].detach().clone());
            }
            archive.save_to((dir / "state.pt").string());
          }
        }
      }
      (kind == 0 ? sharded : replicated)[rank] = params;
    }
  }));
  ExpectTheReplicatedSteps(sharded, replicated, norms);
  // One process (world size 1) reads the state of step 3 and takes steps 4 and 5 with the
  // ranks' average gradient: the 2 ranks' parameters.
  torch::serialize::InputArchive archive;
  archive.load_from((dir / "state.pt").string());
  std::vector<torch::Tensor> params = SmallParams();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor saved;
      archive.read(absl::StrCat("p", i), saved);
      params[i].copy_(saved);
    }
  }
  TrainConfig ts = t;
  ts.set_shard_optimizer(true);
  auto one = MakeTrainingOptimizer(params, kSmallDecays, ts, nullptr, 4);
  one->Load(archive, dir.string(), 3);
  for (int step = 3; step < 5; ++step) {
    one->ZeroGrad();
    std::vector<torch::Tensor> a = SmallParams(), b = SmallParams();
    set_grads(a, 0, step);
    set_grads(b, 1, step);
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = (a[i].grad() + b[i].grad()) / 2;
    }
    one->ReduceAndClip(5.0);
    one->Step();
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::allclose(params[i], sharded[0][i], 1e-6, 1e-7))
        << "param " << i << ": " << (params[i] - sharded[0][i]).abs().max().item<double>();
  }
  // A replicated run's checkpoint is no sharded one's.
  EXPECT_THROW(one->Load(archive, (dir_ / "nowhere").string(), 3), c10::Error);
}

// ZeRO-2 (shard_gradients) in buckets of 4 over 2 ranks: parameters of blocks 0 and 1 and one
// outside the blocks (21, 5 and 4 elements: buckets [20, 24) and [24, 28) straddle them). A
// bucket is reduced once every block it covers is done, and a gradient freed once its every
// bucket is; the rest when the backward ends. Two micro-batches a step (a quarter and three
// quarters of the gradient) take the replicated AdamW's steps on the whole gradient within 1e-6.
TEST_F(TrainerTest, ShardedGradientsAreReducedAsBlocksEndAndTakeTheReplicatedSteps) {
  const TrainConfig t = SmallAdamW();
  const std::vector<int> layers = {0, 1, -1};
  std::vector<std::vector<torch::Tensor>> zero2(2), replicated(2);
  std::vector<double> norms[2][2];
  std::vector<std::string> freed[2];  // rank r: which gradients were left, after each call
  const auto left = [](const std::vector<torch::Tensor>& params) {
    std::string s;
    for (const torch::Tensor& p : params) s += p.grad().defined() ? "g" : "-";
    return s;
  };
  ASSERT_NO_FATAL_FAILURE(OnTwoRanks([&](int rank, Collective* dist) {
    for (int kind = 0; kind < 2; ++kind) {
      TrainConfig tk = t;
      tk.set_shard_optimizer(kind == 0);
      tk.set_shard_gradients(kind == 0);
      tk.set_activation_checkpointing(true);
      std::vector<torch::Tensor> params = SmallParams();
      auto opt = MakeTrainingOptimizer(params, kSmallDecays, tk, dist, /*bucket_elements=*/4,
                                       layers);
      for (int step = 0; step < 5; ++step) {
        opt->ZeroGrad();
        for (double part : {0.25, 0.75}) {  // two micro-batches, as autograd accumulates
          for (size_t i = 0; i < params.size(); ++i) {
            const torch::Tensor g = RankGradient(params[i], i, rank, step) * part;
            if (params[i].grad().defined()) {
              params[i].mutable_grad() = params[i].grad() + g;
            } else {
              params[i].mutable_grad() = g;
            }
          }
          opt->GradientsDone(1);  // the blocks end last to first
          if (kind == 0 && step == 0) freed[rank].push_back(left(params));
          opt->GradientsDone(0);
          if (kind == 0 && step == 0) freed[rank].push_back(left(params));
          opt->BackwardDone();
          if (kind == 0 && step == 0) freed[rank].push_back(left(params));
        }
        norms[kind][rank].push_back(opt->ReduceAndClip(/*max_norm=*/5.0));
        opt->Step();
      }
      (kind == 0 ? zero2 : replicated)[rank] = params;
    }
  }));
  for (int rank = 0; rank < 2; ++rank) {
    // Block 1 alone completes no bucket ([20, 24) waits for block 0, [24, 28) for the end);
    // block 0 then completes [0, 24) and frees its gradient; the end frees the rest.
    EXPECT_EQ(freed[rank], std::vector<std::string>({"ggg", "-gg", "---", "ggg", "-gg", "---"}))
        << "rank " << rank;
  }
  ExpectTheReplicatedSteps(zero2, replicated, norms);
}

}  // namespace
}  // namespace ablate
