// A sweep's cost before it runs (orchestrator/cli/cost.h): the FLOPs of a small spec against a
// count by hand, `ablate expand`'s cost line with a named device class, a numeric peak, the
// default MFU and no device, and the errors of bad --device-peak and --mfu values.
#include <fstream>
#include <string>

#include "config/memory_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "orchestrator/cli/cost.h"
#include "orchestrator/sweep/expand.h"
#include "tests/cli_util.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

using testing::CliResult;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCli;

constexpr char kTinySpec[] = R"(sweep: tiny
base:
  model: {vocab_size: 256, d_model: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2,
          head_dim: 16, ffn_dim: 64, qk_norm: false, tie_embeddings: true, max_seq_len: 32}
  train: {steps: 10, batch_size: 2, seq_len: 16, grad_accum: 3, eval_every: 4,
          eval_batches: 5, eval_seq_lens: [32]}
variants: [baseline]
seeds: [0, 1]
)";

// kTinySpec counted by hand, per run.
// Matmul parameters: the embedding 256 x 32 = 8,192 (tied: the output projection is the same
// matrix, counted once); q, k, v and o, 4 x 32 x (2 heads x 16) = 4,096; SwiGLU 3 x 32 x 64 =
// 6,144; 18,432 in all (norms are not matmuls).
// Forward FLOPs per token at a context of T: 2 x 18,432 + 4 x 1 layer x 2 heads x 16 x T =
// 36,864 + 128 T: 38,912 at T = 16, 40,960 at T = 32.
// Training: 3 x 38,912 = 116,736 per token, over 10 steps x 2 x 16 x 3 (grad_accum) = 960
// tokens: 112,066,560.
// Evaluations after steps 4, 8 and 10 (the last): 3, each 5 batches x 2 windows of 16 tokens
// (160 x 38,912 = 6,225,920) and the same 10 windows at 32 (320 x 40,960 = 13,107,200):
// 19,333,120, x 3 = 57,999,360.
constexpr double kRunTrain = 112066560;
constexpr double kRunEval = 57999360;
// Two seeds: 224,133,120 + 115,998,720 = 340,131,840 FLOPs.
constexpr double kSweepFlops = 2 * (kRunTrain + kRunEval);

class CostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("ablate_cost");
    spec_ = (dir_ / "tiny.yaml").string();
    std::ofstream(spec_) << kTinySpec;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // The last line `ablate expand SPEC ARGS...` prints on stdout.
  std::string ExpandCostLine(std::vector<std::string> args) {
    args.insert(args.begin(), {"expand", spec_});
    const CliResult r = RunCli(args);
    EXPECT_EQ(r.code, 0) << r.err;
    const size_t end = r.out.find_last_not_of('\n');
    if (end == std::string::npos) return "";
    return r.out.substr(r.out.rfind('\n', end) + 1, end - r.out.rfind('\n', end));
  }
  std::filesystem::path dir_;
  std::string spec_;
};

TEST_F(CostTest, FlopsOfASmallSpecMatchTheCountByHand) {
  absl::StatusOr<ExpandedSweep> sweep = ExpandSweepFile(spec_);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  ASSERT_EQ(sweep->runs_size(), 2);
  const RunFlops run = EstimateRunFlops(sweep->runs(0).config());
  EXPECT_EQ(run.train, kRunTrain);
  EXPECT_EQ(run.evaluations, 3);
  EXPECT_EQ(run.eval, kRunEval);
  // The per-token figure `expand` prints is the training one the total uses.
  EXPECT_EQ(sweep->runs(0).flops_per_token() * 960, kRunTrain);

  const SweepCost all = EstimateSweepCost(*sweep);
  EXPECT_EQ(all.runs, 2);
  EXPECT_EQ(all.train_flops, 2 * kRunTrain);
  EXPECT_EQ(all.eval_flops, 2 * kRunEval);
  EXPECT_EQ(all.total(), kSweepFlops);
  // Runs `submit` reused are left out by run key.
  const SweepCost one = EstimateSweepCost(*sweep, {sweep->runs(1).run_key()});
  EXPECT_EQ(one.runs, 1);
  EXPECT_EQ(one.total(), kRunTrain + kRunEval);
}

TEST_F(CostTest, EvaluationsAreEveryEvalEveryStepsAndTheLast) {
  RunConfig config = ExpandSweepFile(spec_)->runs(0).config();
  config.mutable_train()->set_eval_every(5);  // steps 5 and 10: the last is one of them
  EXPECT_EQ(EstimateRunFlops(config).evaluations, 2);
  config.mutable_train()->set_eval_every(100);  // only the last
  EXPECT_EQ(EstimateRunFlops(config).evaluations, 1);
  config.mutable_train()->clear_eval_seq_lens();  // only the training length: 6,225,920 each
  EXPECT_EQ(EstimateRunFlops(config).eval, 6225920);
  // Each length reads the same 5 x 2 x 32 = 320 tokens (the longest length's windows), in whole
  // windows: at 24, 13 of them (312 tokens) at 36,864 + 128 x 24 = 39,936 FLOPs a token,
  // 12,460,032; at 32, 10 (320 tokens) at 40,960, 13,107,200.
  config.mutable_train()->add_eval_seq_lens(24);
  config.mutable_train()->add_eval_seq_lens(32);
  EXPECT_EQ(EstimateRunFlops(config).eval, 6225920 + 12460032 + 13107200);
}

TEST_F(CostTest, ANumericPeakGivesDeviceHours) {
  // 340,131,840 / (0.5 x 1e5) = 6,802.6 s = 1.89 h.
  EXPECT_EQ(ExpandCostLine({"--device-peak", "1e5", "--mfu", "0.5"}),
            "total: 2 runs, 3.40e8 FLOPs: 2.24e8 training (3 x forward) + 1.16e8 evaluation "
            "(forward); at 50% MFU of 100 kFLOP/s: 1.89 device-hours");
}

TEST_F(CostTest, ANamedDeviceClassUsesItsDatasheetPeak) {
  // 340,131,840 / (0.4 x 989e12) = 8.6e-7 s.
  EXPECT_EQ(ExpandCostLine({"--device-peak", "h100-bf16", "--mfu", "0.4"}),
            "total: 2 runs, 3.40e8 FLOPs: 2.24e8 training (3 x forward) + 1.16e8 evaluation "
            "(forward); at 40% MFU of h100-bf16 (989 TFLOP/s): 8.6e-07 device-seconds");
  // Names are case-insensitive; without --mfu the measured default, 55%.
  EXPECT_THAT(ExpandCostLine({"--device-peak", "A100-BF16"}),
              EndsWith("at 55% MFU of a100-bf16 (312 TFLOP/s): 1.98e-06 device-seconds"));
  // A realistic sweep: the shipped paper-scale Table 2 study on MI300X at 40%, against the sum
  // of its runs' FLOPs.
  const std::string paper =
      std::string(ABLATE_SOURCE_DIR) + "/experiments/paper/dense_stability.yaml";
  absl::StatusOr<ExpandedSweep> sweep = ExpandSweepFile(paper);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  const SweepCost cost = EstimateSweepCost(*sweep);
  const CliResult r = RunCli({"expand", paper, "--device-peak", "mi300x-bf16", "--mfu", "0.4"});
  ASSERT_EQ(r.code, 0) << r.err;
  CostFlags flags;
  flags.device_peak = "mi300x-bf16";
  flags.mfu = 0.4;
  EXPECT_THAT(r.out,
              EndsWith(FormatCostLine(cost, flags, std::to_string(sweep->runs_size()) + " runs")));
  EXPECT_THAT(r.out, HasSubstr("mi300x-bf16 (1.307 PFLOP/s)"));
}

TEST_F(CostTest, WithoutADeviceTheLineGivesFlopsAndSaysWhatToAdd) {
  EXPECT_EQ(ExpandCostLine({}),
            "total: 2 runs, 3.40e8 FLOPs: 2.24e8 training (3 x forward) + 1.16e8 evaluation "
            "(forward); device-hours: give --device-peak (a device class or its FLOP/s)");
}

TEST_F(CostTest, LargeAndSmallTotalsPickTheirUnit) {
  CostFlags flags;
  flags.device_peak = "1e12";
  flags.mfu = 0.5;
  SweepCost cost;
  cost.runs = 1;
  cost.train_flops = 0.5e12 * 3600 * 1500;  // 1,500 hours at 0.5e12 FLOP/s
  EXPECT_THAT(FormatCostLine(cost, flags, "1 runs"),
              EndsWith("at 50% MFU of 1 TFLOP/s: 1,500 device-hours\n"));
  cost.train_flops = 0.5e12 * 90;
  EXPECT_THAT(FormatCostLine(cost, flags, "1 runs"), EndsWith(": 1.5 device-minutes\n"));
}

TEST_F(CostTest, MachineFormatsKeepStdoutParseableAndPutTheLineOnStderr) {
  for (const char* format : {"csv", "json"}) {
    const CliResult r = RunCli({"expand", spec_, "--format", format, "--device-peak", "1e5"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.out, Not(HasSubstr("total:"))) << format;
    EXPECT_THAT(r.err, HasSubstr("total: 2 runs, 3.40e8 FLOPs")) << format;
  }
}

TEST_F(CostTest, BadValuesNameTheFlagAndTheChoices) {
  CliResult r = RunCli({"expand", spec_, "--device-peak", "h100"});
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("--device-peak"));
  EXPECT_THAT(r.err, HasSubstr("unknown device class \"h100\""));
  for (const char* name : {"a100-bf16", "h100-bf16", "h200-bf16", "l40s-bf16", "mi300x-bf16"}) {
    EXPECT_THAT(r.err, HasSubstr(name));
  }
  EXPECT_THAT(r.err, HasSubstr("3.5e12"));
  EXPECT_EQ(r.out, "");

  for (const char* peak : {"0", "-3e12", "1e999"}) {
    r = RunCli({"expand", spec_, "--device-peak", peak});
    EXPECT_NE(r.code, 0) << peak;
    EXPECT_THAT(r.err, HasSubstr("--device-peak")) << peak;
    EXPECT_THAT(r.err, HasSubstr("must be a positive number")) << peak;
  }
  for (const char* mfu : {"55", "0", "-0.1", "half"}) {
    r = RunCli({"expand", spec_, "--device-peak", "h100-bf16", "--mfu", mfu});
    EXPECT_NE(r.code, 0) << mfu;
    EXPECT_THAT(r.err, HasSubstr("--mfu")) << mfu;
    EXPECT_THAT(r.err, HasSubstr("must be a fraction in (0, 1]")) << mfu;
  }
  // The device table's figures are the datasheets' dense ones (half the sparse figures).
  absl::StatusOr<DevicePeak> h100 = ParseDevicePeak("h100-bf16");
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->peak, 989e12);
  EXPECT_EQ(ParseDevicePeak("3.5e12")->peak, 3.5e12);
  EXPECT_EQ(ParseDevicePeak("3.5e12")->name, "");
  EXPECT_FALSE(ParseDevicePeak("inf").ok());
  EXPECT_FALSE(ParseDevicePeak("nan").ok());
}

// The memory plan in `expand`: a column of the table, the plan's parts in the CSV, and the
// refusal of a run that does not fit --device-memory or resources.memory_gb, naming it, its
// figure and what each setting would give. A size that is no size is a usage error.
TEST_F(CostTest, RunsThatDoNotFitTheDevicesMemoryAreRefusedWithWhatWouldFit) {
  const CliResult table = RunCli({"expand", spec_});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("mem/device"));
  const CliResult csv = RunCli({"expand", spec_, "--format", "csv"});
  ASSERT_EQ(csv.code, 0) << csv.err;
  EXPECT_THAT(csv.out, HasSubstr("memory_per_device_bytes,memory_parameters_bytes,"
                                 "memory_gradients_bytes,memory_optimizer_bytes,"
                                 "memory_activations_bytes,memory_activations_checkpointed_bytes,"
                                 "memory_largest_temporary_bytes"));
  absl::StatusOr<ExpandedSweep> sweep = ExpandSweepFile(spec_);
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  const int64_t needs = sweep->runs(0).memory().per_device();
  EXPECT_GT(needs, sweep->runs(0).memory().parameters() * 4);  // weights, gradients, AdamW, ...
  EXPECT_THAT(csv.out, HasSubstr("," + std::to_string(needs) + ","));

  // Refused under a limit just below it: every run named, the figures, the fixes.
  const CliResult refused =
      RunCli({"expand", spec_, "--device-memory", std::to_string(needs - 1000) + "B"});
  EXPECT_EQ(refused.code, 2) << refused.err;  // a usage error: "B" is no unit
  const CliResult small = RunCli({"expand", spec_, "--device-memory", "0.00001GB"});
  EXPECT_EQ(small.code, 1);
  EXPECT_THAT(small.err, HasSubstr("tiny.yaml:7: variant baseline: needs "));
  EXPECT_THAT(small.err, HasSubstr("per device by the memory plan, over the 10.0 kB it may use"));
  EXPECT_THAT(small.err, HasSubstr("train.grad_accum: 6 with train.batch_size: 1 (the same "
                                   "tokens per step) ("));
  // Even one layer checkpointed peaks lower: its activations and the logits no longer meet.
  // One rank has nothing to shard.
  EXPECT_THAT(small.err, HasSubstr("try train.activation_checkpointing: true ("));
  EXPECT_THAT(small.err, HasSubstr("train.loss_chunk_tokens: 1024 ("));
  EXPECT_THAT(small.err, Not(HasSubstr("shard")));
  EXPECT_THAT(small.err, HasSubstr("[the limit is --device-memory]"));
  // Several specs: each expanded as alone, the refused one named and the next still expanded,
  // with the first refusal's exit code; JSON and CSV take one. At 10 MB the quick sweep (36 MB
  // a device) is refused and this tiny one fits.
  const std::string quick = std::string(ABLATE_SOURCE_DIR) + "/experiments/quick.yaml";
  const CliResult both = RunCli({"expand", quick, spec_, "--device-memory", "10MB"});
  EXPECT_EQ(both.code, 1) << both.err;
  EXPECT_THAT(both.err, HasSubstr("quick.yaml:"));
  EXPECT_THAT(both.err, HasSubstr("over the 10.0 MB it may use"));
  EXPECT_THAT(both.err, Not(HasSubstr("tiny.yaml")));
  EXPECT_THAT(both.out, HasSubstr("sweep tiny"));
  EXPECT_THAT(both.out, Not(HasSubstr("sweep quick")));
  const CliResult fits = RunCli({"expand", quick, spec_});
  EXPECT_EQ(fits.code, 0) << fits.err;
  EXPECT_THAT(fits.out, HasSubstr("sweep quick: 4 runs"));
  EXPECT_THAT(fits.out, HasSubstr("sweep tiny"));
  const CliResult two_csv = RunCli({"expand", quick, spec_, "--format", "csv"});
  EXPECT_NE(two_csv.code, 0);
  EXPECT_THAT(two_csv.err, HasSubstr("--format csv takes one spec (got 2)"));
  // The spec's own resources.memory_gb refuses it too, at expand and at submit.
  std::ofstream(spec_, std::ios::app) << "resources: {memory_gb: 0.000001}\n";
  const CliResult spec_limit = RunCli({"expand", spec_});
  EXPECT_EQ(spec_limit.code, 1);
  EXPECT_THAT(spec_limit.err, HasSubstr("[the limit is resources.memory_gb]"));
  // Sizes.
  EXPECT_EQ(*ParseMemorySize("80GB"), 80'000'000'000);
  EXPECT_EQ(*ParseMemorySize("80 GiB"), int64_t{80} << 30);
  EXPECT_EQ(*ParseMemorySize("512MB"), 512'000'000);
  EXPECT_EQ(*ParseMemorySize("1.5"), 1'500'000'000);
  EXPECT_FALSE(ParseMemorySize("lots").ok());
  EXPECT_FALSE(ParseMemorySize("-3GB").ok());
  const CliResult bad = RunCli({"expand", spec_, "--device-memory", "lots"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("memory size \"lots\""));
}

}  // namespace
}  // namespace ablate
