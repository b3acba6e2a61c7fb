// The checkpoint archive on a tiny model, without a trainer: a save loads back bit for bit
// (weights, optimizer, progress, the generator), a torn checkpoint falls back to the previous one
// or to step 0 and is moved aside, init_from copies weights by name, and a sharded optimizer's
// old state files are pruned.
#include "worker/train/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "tests/test_dir.h"
#include "tests/worker/tiny_run_config.h"
#include "worker/model/transformer.h"
#include "worker/train/optimizer.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A model and its optimizer as the trainer builds them at step 0, from `seed`.
struct TinyState {
  explicit TinyState(const RunConfig& config, uint64_t seed = 1) {
    torch::manual_seed(seed);
    model = Transformer(config.model());
    std::vector<torch::Tensor> params;
    std::vector<bool> decays;
    for (const auto& p : model->named_parameters()) {
      params.push_back(p.value());
      decays.push_back(p.value().dim() >= 2);
    }
    optimizer = MakeTrainingOptimizer(params, decays, config.train(), nullptr);
  }
  // One AdamW step on a batch of zeros, so the optimizer has state to save.
  void TrainOneStep() {
    optimizer->ZeroGrad();
    torch::Tensor x = torch::zeros({2, 8}, torch::kLong);
    model->forward(x).logits.sum().backward();
    optimizer->SetLearningRate(1e-2);
    optimizer->Step();
  }
  Transformer model{nullptr};
  std::unique_ptr<TrainingOptimizer> optimizer;
};

TrainingProgress SomeProgress(int64_t step) {
  TrainingProgress p;
  p.step = step;
  p.data_offset = 7;
  p.rollbacks = 2;
  p.spike_steps = 3;
  for (int64_t i = 0; i < step; ++i) {
    p.loss_history.push_back(5.0 - 0.1 * i);
    p.grad_history.push_back(1.0 + 0.01 * i);
  }
  return p;
}

void ExpectSameWeights(TransformerImpl& a, TransformerImpl& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& p : pa) {
    EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  }
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::FreshTestDir("ablate_checkpoint_test"); }
  void TearDown() override { fs::remove_all(dir_); }

  RunConfig config_ = testing::TinyRunConfig("unused", 10);
  fs::path dir_;
};

TEST_F(CheckpointTest, ASaveLoadsBackBitForBit) {
  TinyState saved(config_);
  saved.TrainOneStep();
  CheckpointArchive archive(dir_.string());
  EXPECT_EQ(archive.step(), -1);
  ASSERT_TRUE(archive.Save(true, *saved.model, *saved.optimizer, SomeProgress(4), 12.5).ok());
  EXPECT_EQ(archive.step(), 4);
  EXPECT_TRUE(fs::exists(archive.Path()));
  EXPECT_FALSE(fs::exists(archive.PreviousPath()));
  const torch::Tensor next_draw = torch::rand({4});  // the generator after the save

  TinyState loaded(config_, /*seed=*/2);
  CheckpointArchive reader(dir_.string());
  TrainingProgress progress;
  ASSERT_TRUE(
      reader.Load(archive.Path(), torch::kCPU, *loaded.model, *loaded.optimizer, &progress).ok());
  EXPECT_EQ(reader.step(), 4);
  ExpectSameWeights(*saved.model, *loaded.model);
  EXPECT_TRUE(torch::equal(torch::rand({4}), next_draw));  // the generator restored
  const TrainingProgress want = SomeProgress(4);
  EXPECT_EQ(progress.step, 4);
  EXPECT_EQ(progress.data_offset, want.data_offset);
  EXPECT_EQ(progress.rollbacks, want.rollbacks);
  EXPECT_EQ(progress.spike_steps, want.spike_steps);
  EXPECT_EQ(progress.elapsed_before, 12.5);
  EXPECT_EQ(progress.loss_history, want.loss_history);
  EXPECT_EQ(progress.grad_history, want.grad_history);

  // The optimizer state came along: one more step from each ends on the same weights.
  saved.TrainOneStep();
  loaded.TrainOneStep();
  ExpectSameWeights(*saved.model, *loaded.model);
}

TEST_F(CheckpointTest, ASecondSaveKeepsTheFirstAsThePrevious) {
  TinyState s(config_);
  CheckpointArchive archive(dir_.string());
  ASSERT_TRUE(archive.Save(true, *s.model, *s.optimizer, SomeProgress(2), 0).ok());
  ASSERT_TRUE(archive.Save(true, *s.model, *s.optimizer, SomeProgress(5), 0).ok());
  TrainingProgress progress;
  ASSERT_TRUE(
      archive.Load(archive.PreviousPath(), torch::kCPU, *s.model, *s.optimizer, &progress).ok());
  EXPECT_EQ(progress.step, 2);
}

TEST_F(CheckpointTest, AnInconsistentOrTornCheckpointIsDataLoss) {
  TinyState s(config_);
  CheckpointArchive archive(dir_.string());
  TrainingProgress bad = SomeProgress(3);
  bad.loss_history.pop_back();  // fewer steps of history than the step says
  bad.grad_history.pop_back();
  ASSERT_TRUE(archive.Save(true, *s.model, *s.optimizer, bad, 0).ok());
  TrainingProgress progress;
  absl::Status st = archive.Load(archive.Path(), torch::kCPU, *s.model, *s.optimizer, &progress);
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("history has 2 steps, checkpoint says 3"));

  std::ofstream(dir_ / "garbage.pt") << "not a checkpoint";
  st = archive.Load((dir_ / "garbage.pt").string(), torch::kCPU, *s.model, *s.optimizer, &progress);
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("garbage.pt: unreadable checkpoint"));
}

// LoadNewestGood over a torn checkpoint.pt: with a good previous one, and with none.
TEST_F(CheckpointTest, ATornCheckpointIsMovedAsideAndThePreviousOneLoaded) {
  for (const bool previous_good : {true, false}) {
    SCOPED_TRACE(previous_good ? "the previous checkpoint is good" : "no checkpoint is good");
    const fs::path dir = dir_ / (previous_good ? "prev" : "none");
    TinyState s(config_);
    CheckpointArchive archive(dir.string());
    ASSERT_TRUE(archive.Save(true, *s.model, *s.optimizer, SomeProgress(2), 0).ok());
    ASSERT_TRUE(archive.Save(true, *s.model, *s.optimizer, SomeProgress(4), 0).ok());
    fs::resize_file(archive.Path(), fs::file_size(archive.Path()) / 2);
    if (!previous_good) {
      fs::resize_file(archive.PreviousPath(), fs::file_size(archive.PreviousPath()) / 2);
    }

    TrainingProgress progress;
    int rebuilds = 0;
    std::vector<std::string> notices;
    absl::Status st = archive.LoadNewestGood(
        /*writer=*/true,
        [&](const std::string& path) {
          return archive.Load(path, torch::kCPU, *s.model, *s.optimizer, &progress);
        },
        [&] {
          ++rebuilds;
          progress = TrainingProgress();
          return absl::OkStatus();
        },
        &notices);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(progress.step, previous_good ? 2 : 0);
    EXPECT_EQ(rebuilds, previous_good ? 1 : 2);  // after each partial load
    ASSERT_EQ(notices.size(), previous_good ? 1u : 2u);
    EXPECT_THAT(notices[0], HasSubstr("checkpoint.pt: unreadable checkpoint"));
    EXPECT_THAT(notices[0], HasSubstr("moved aside to " + archive.Path() + ".corrupt-"));
    EXPECT_THAT(notices.back(),
                HasSubstr(previous_good ? "resumed from checkpoint.prev.pt at step 2"
                                        : "no readable checkpoint left: starting from step 0"));
    int aside = 0;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      aside += e.path().filename().string().find(".corrupt-") != std::string::npos;
    }
    EXPECT_EQ(aside, previous_good ? 1 : 2);
  }
}

// A rank other than the writer falls back alike but moves nothing and notes nothing.
TEST_F(CheckpointTest, OnlyTheWriterMovesATornCheckpointAside) {
  TinyState s(config_);
  CheckpointArchive archive(dir_.string());
  ASSERT_TRUE(archive.Save(true, *s.model, *s.optimizer, SomeProgress(2), 0).ok());
  fs::resize_file(archive.Path(), fs::file_size(archive.Path()) / 2);
  TrainingProgress progress;
  std::vector<std::string> notices;
  ASSERT_TRUE(archive
                  .LoadNewestGood(
                      /*writer=*/false,
                      [&](const std::string& path) {
                        return archive.Load(path, torch::kCPU, *s.model, *s.optimizer, &progress);
                      },
                      [] { return absl::OkStatus(); }, &notices)
                  .ok());
  EXPECT_TRUE(notices.empty());
  EXPECT_TRUE(fs::exists(archive.Path()));
}

TEST_F(CheckpointTest, InitFromCopiesWeightsByNameAndNamesTheFreshOnes) {
  TinyState source(config_);
  source.TrainOneStep();
  CheckpointArchive archive(dir_.string());
  ASSERT_TRUE(archive.Save(true, *source.model, *source.optimizer, SomeProgress(1), 0).ok());

  // The same model: every tensor loaded, none fresh.
  TinyState same(config_, /*seed=*/2);
  absl::StatusOr<std::string> summary =
      InitFromCheckpoint(archive.Path(), torch::kCPU, *same.model);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_THAT(*summary, HasSubstr("initialised from " + archive.Path()));
  EXPECT_THAT(*summary, ::testing::Not(HasSubstr("fresh")));
  ExpectSameWeights(*source.model, *same.model);

  // A model without the gate: the source's gate weights would be dropped.
  RunConfig ungated = config_;
  ungated.mutable_model()->clear_gate();
  TinyState fewer(ungated);
  summary = InitFromCheckpoint(archive.Path(), torch::kCPU, *fewer.model);
  EXPECT_TRUE(absl::IsInvalidArgument(summary.status())) << summary.status();
  EXPECT_THAT(std::string(summary.status().message()), HasSubstr("never drop trained ones"));

  // The other way round: the gate is fresh.
  CheckpointArchive ungated_archive((dir_ / "ungated").string());
  ASSERT_TRUE(ungated_archive.Save(true, *fewer.model, *fewer.optimizer, SomeProgress(1), 0).ok());
  TinyState more(config_);
  summary = InitFromCheckpoint(ungated_archive.Path(), torch::kCPU, *more.model);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_THAT(*summary, HasSubstr("fresh (this config adds them): "));

  // A wider model: a shape that differs.
  RunConfig wider = config_;
  wider.mutable_model()->set_d_model(2 * config_.model().d_model());
  TinyState wide(wider);
  summary = InitFromCheckpoint(archive.Path(), torch::kCPU, *wide.model);
  EXPECT_TRUE(absl::IsInvalidArgument(summary.status())) << summary.status();
  EXPECT_THAT(std::string(summary.status().message()), HasSubstr("in this config"));

  EXPECT_TRUE(absl::IsNotFound(
      InitFromCheckpoint((dir_ / "missing.pt").string(), torch::kCPU, *same.model).status()));
  std::ofstream(dir_ / "garbage.pt") << "not a checkpoint";
  EXPECT_TRUE(absl::IsDataLoss(
      InitFromCheckpoint((dir_ / "garbage.pt").string(), torch::kCPU, *same.model).status()));
}

// train.init_from.preserve_function (the paper's appendix A.7, identity arm): a zero-initialised
// sigmoid gate (every score 0.5) added to a trained ungated model, with W_O doubled as it loads,
// computes exactly what the source did; the gate stays in (0, 1). Configs whose gate does not
// start at a constant where W_O can take it over are refused by name; so is a source that
// already has the gate.
TEST_F(CheckpointTest, PreserveFunctionDoublesWOAndKeepsTheLoadedModelsOutputs) {
  RunConfig ungated = config_;
  ungated.mutable_model()->clear_gate();
  TinyState source(ungated);
  source.TrainOneStep();
  CheckpointArchive archive(dir_.string());
  ASSERT_TRUE(archive.Save(true, *source.model, *source.optimizer, SomeProgress(1), 0).ok());

  RunConfig added = config_;  // G1 elementwise sigmoid
  added.mutable_model()->mutable_gate()->set_init(GATE_INIT_ZERO);
  added.mutable_train()->mutable_init_from()->set_checkpoint(archive.Path());
  added.mutable_train()->mutable_init_from()->set_preserve_function(true);
  ASSERT_TRUE(ValidateRunConfig(added).ok()) << ValidateRunConfig(added);
  ASSERT_EQ(*GateStartScore(added.model()), 0.5);
  TinyState gated(added, /*seed=*/3);
  absl::StatusOr<std::string> summary =
      InitFromCheckpoint(archive.Path(), torch::kCPU, *gated.model, 2.0);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_THAT(*summary, HasSubstr("W_O of 2 layers multiplied by 2"));
  auto params = gated.model->named_parameters();
  auto sources = source.model->named_parameters();
  EXPECT_TRUE(torch::equal(params["blocks.0.attn.o_proj.weight"],
                           2 * sources["blocks.0.attn.o_proj.weight"]));
  torch::NoGradGuard no_grad;
  source.model->eval();
  gated.model->eval();
  const torch::Tensor x = torch::randint(0, 256, {2, 16}, torch::kLong);
  const torch::Tensor want = source.model->forward(x).logits;
  const torch::Tensor got = gated.model->forward(x).logits;
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max().item<double>();

  // Without preserve_function the zero-init gate halves the attention output: not the same.
  TinyState plain(added, /*seed=*/3);
  ASSERT_TRUE(InitFromCheckpoint(archive.Path(), torch::kCPU, *plain.model).ok());
  plain.model->eval();
  EXPECT_FALSE(torch::allclose(plain.model->forward(x).logits, want, 1e-5, 1e-5));

  // A source that already has the gate: nothing is added.
  CheckpointArchive gated_archive((dir_ / "gated").string());
  ASSERT_TRUE(gated_archive.Save(true, *gated.model, *gated.optimizer, SomeProgress(1), 0).ok());
  TinyState again(added);
  summary = InitFromCheckpoint(gated_archive.Path(), torch::kCPU, *again.model, 2.0);
  EXPECT_TRUE(absl::IsInvalidArgument(summary.status())) << summary.status();
  EXPECT_THAT(std::string(summary.status().message()), HasSubstr("already has the gate"));

  // Refused at validation: a gate whose scores do not start at a constant, a gate on keys, SiLU.
  RunConfig normal = added;
  normal.mutable_model()->mutable_gate()->set_init(GATE_INIT_NORMAL);
  EXPECT_THAT(std::string(ValidateRunConfig(normal).message()),
              HasSubstr("train.init_from.preserve_function: needs a gate whose scores start at a "
                        "constant"));
  RunConfig keys = added;
  keys.mutable_model()->mutable_gate()->set_position(GATE_G3);
  EXPECT_THAT(std::string(ValidateRunConfig(keys).message()),
              HasSubstr("train.init_from.preserve_function: needs a gate at G1, G2 or G5"));
  RunConfig silu = added;
  silu.mutable_model()->mutable_gate()->set_activation(GATE_SILU);
  EXPECT_THAT(std::string(ValidateRunConfig(silu).message()), HasSubstr("not 0 at 0"));
  RunConfig ns = added;
  ns.mutable_model()->mutable_gate()->set_activation(GATE_NS_SIGMOID);
  EXPECT_EQ(*GateStartScore(ns.model()), 0.75);
}

TEST_F(CheckpointTest, OnlyTheShardedStatesOfTheTwoNewestCheckpointsAreKept) {
  for (const int step : {10, 20, 30, 40}) {
    std::ofstream(dir_ / ("optimizer-" + std::to_string(step) + ".bin")) << "state";
  }
  std::ofstream(dir_ / "optimizer-notanumber.bin") << "kept: not a state file of a step";
  CheckpointArchive archive(dir_.string());
  archive.RemoveStaleShardedStates(/*previous=*/-1, /*current=*/30);  // newest below 30: 20
  EXPECT_FALSE(fs::exists(dir_ / "optimizer-10.bin"));
  EXPECT_TRUE(fs::exists(dir_ / "optimizer-20.bin"));
  EXPECT_TRUE(fs::exists(dir_ / "optimizer-30.bin"));
  EXPECT_FALSE(fs::exists(dir_ / "optimizer-40.bin"));
  EXPECT_TRUE(fs::exists(dir_ / "optimizer-notanumber.bin"));
  archive.RemoveStaleShardedStates(/*previous=*/30, /*current=*/20);
  EXPECT_TRUE(fs::exists(dir_ / "optimizer-20.bin"));
  EXPECT_TRUE(fs::exists(dir_ / "optimizer-30.bin"));
}

}  // namespace
}  // namespace ablate
