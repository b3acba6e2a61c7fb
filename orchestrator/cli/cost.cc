#include "orchestrator/cli/cost.h"

#include <cmath>
#include <cstring>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text_format.h"
#include "config/memory_plan.h"
#include "config/model_config.h"
#include "config/param_count.h"
#include "fmt/format.h"

namespace ablate {

RunFlops EstimateRunFlops(const RunConfig& config) {
  const ModelConfig& m = config.model();
  const TrainConfig& t = config.train();
  RunFlops f;
  const double tokens_per_step = TokensPerStep(t);
  f.train = TrainingFlopsPerToken(m, t.seq_len()) * tokens_per_step * t.steps();
  // The trainer evaluates after every eval_every-th step and after the last one
  // (worker/train/trainer.cc): ceil(steps / eval_every) evaluations.
  if (t.eval_every() > 0 && t.steps() > 0) {
    f.evaluations = (static_cast<int64_t>(t.steps()) + t.eval_every() - 1) / t.eval_every();
  }
  // Each, forward only: eval_batches batches of batch_size windows at seq_len; then, at each
  // length of eval_seq_lens, the same text of eval_batches x batch_size x max(eval_seq_lens)
  // tokens cut into as many whole windows of that length as it holds.
  const int64_t windows = static_cast<int64_t>(t.eval_batches()) * t.batch_size();
  double per_evaluation =
      static_cast<double>(windows) * t.seq_len() * ForwardFlopsPerToken(m, t.seq_len());
  const int64_t span = EvalLengthSpan(t);
  for (const int32_t len : t.eval_seq_lens()) {
    per_evaluation += static_cast<double>(span / len) * len * ForwardFlopsPerToken(m, len);
  }
  f.eval = per_evaluation * f.evaluations;
  return f;
}

SweepCost EstimateSweepCost(const ExpandedSweep& sweep, const std::set<std::string>& skip) {
  SweepCost cost;
  for (const RunSpec& run : sweep.runs()) {
    if (skip.count(run.run_key()) > 0) continue;
    if (run.config().has_program()) {
      ++cost.programs;
      continue;
    }
    const RunFlops f = EstimateRunFlops(run.config());
    ++cost.runs;
    cost.train_flops += f.train;
    cost.eval_flops += f.eval;
  }
  return cost;
}

const std::vector<DeviceClass>& DeviceClasses() {
  // Vendor datasheets' peak figures without structured (2:4) sparsity. NVIDIA quotes Tensor Core
  // figures with sparsity and says the dense ones are half; those halves are below. ablate's
  // PRECISION_FP32 trains in plain fp32 (LibTorch leaves TF32 matmuls off), so fp32 runs on a
  // GPU match the -fp32 classes and PRECISION_BF16_AUTOCAST runs the -bf16 ones.
  static const std::vector<DeviceClass> kClasses = {
      // NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe 80GB): BF16 Tensor Core 312 | 624*
      // TFLOPS, TF32 Tensor Core 156 | 312*, FP32 19.5 (* with sparsity).
      {"a100-bf16", 312e12},
      {"a100-tf32", 156e12},
      {"a100-fp32", 19.5e12},
      // NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 Tensor Core 1,979* TFLOPS, TF32
      // Tensor Core 989*, FP32 67.
      {"h100-bf16", 989e12},
      {"h100-tf32", 494.5e12},
      {"h100-fp32", 67e12},
      // NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16 Tensor Core 1,979* TFLOPS (the
      // H100's compute with more memory).
      {"h200-bf16", 989e12},
      // NVIDIA L40S datasheet: BF16 Tensor Core 362.05 | 733* TFLOPS, FP32 91.6.
      {"l40s-bf16", 362.05e12},
      {"l40s-fp32", 91.6e12},
      // AMD Instinct MI300X data sheet: peak BF16 1,307.4 TFLOPS (2,614.9 with sparsity).
      {"mi300x-bf16", 1307.4e12},
  };
  return kClasses;
}

namespace {

std::string DeviceChoices() {
  std::vector<std::string> names;
  for (const DeviceClass& d : DeviceClasses()) names.push_back(d.name);
  return absl::StrJoin(names, ", ");
}

// "989 TFLOP/s", "100 kFLOP/s": four significant digits and an SI prefix.
std::string FormatRate(double flops_per_s) {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E"};
  int p = 0;
  while (flops_per_s >= 1000 && p < 6) {
    flops_per_s /= 1000;
    ++p;
  }
  return fmt::format("{:.4g} {}FLOP/s", flops_per_s, prefixes[p]);
}

std::string FormatPercent(double fraction) { return fmt::format("{:.3g}%", 100 * fraction); }

}  // namespace

absl::StatusOr<DevicePeak> ParseDevicePeak(absl::string_view text) {
  const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  for (const DeviceClass& d : DeviceClasses()) {
    if (name == d.name) return DevicePeak{d.name, d.peak};
  }
  double number = 0;
  // A number starts like one: "inf" and "nan" are (unknown) names, not peaks.
  const bool numeric = !name.empty() && std::strchr("0123456789.+-", name[0]) != nullptr;
  if (numeric && absl::SimpleAtod(name, &number)) {
    if (!std::isfinite(number) || number <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("peak FLOP/s must be a positive number, got ", text));
    }
    return DevicePeak{"", number};
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown device class \"", text,
                                                 "\"; give one of ", DeviceChoices(),
                                                 ", or the peak in FLOP/s as a number (3.5e12)"));
}

void AddCostFlags(CLI::App* cmd, CostFlags* flags) {
  cmd->add_option("--device-peak", flags->device_peak,
                  absl::StrCat("for the device-hours estimate: a device class (", DeviceChoices(),
                               "; vendor peak dense FLOP/s, docs/cli.md) or its peak in FLOP/s "
                               "(3.5e12)"))
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            absl::StatusOr<DevicePeak> peak = ParseDevicePeak(value);
            return peak.ok() ? "" : std::string(peak.status().message());
          },
          "NAME|FLOP/s", "device peak"));
  cmd->add_option("--mfu", flags->mfu,
                  "assumed model FLOP utilisation, a fraction of the peak in (0, 1] (default: "
                  "the last measured figure, docs/benchmarks.md)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            double mfu = 0;
            if (absl::SimpleAtod(value, &mfu) && mfu > 0 && mfu <= 1) return "";
            return absl::StrCat("must be a fraction in (0, 1] (0.4 = 40% of the peak), got ",
                                value);
          },
          "FRACTION", "mfu"))
      ->capture_default_str();
  cmd->add_option("--device-memory", flags->device_memory,
                  "the memory of one device (80GB, 141GiB): a run whose memory plan exceeds it "
                  "is refused, with the settings that would make it fit (docs/training.md, "
                  "\"Memory\")")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            absl::StatusOr<int64_t> bytes = ParseMemorySize(value);
            return bytes.ok() ? "" : std::string(bytes.status().message());
          },
          "SIZE", "device memory"));
}

int64_t CostFlags::DeviceMemoryBytes() const {
  if (device_memory.empty()) return 0;
  absl::StatusOr<int64_t> bytes = ParseMemorySize(device_memory);
  return bytes.ok() ? *bytes : 0;  // the flag's validator refused anything else
}

std::string FormatCostLine(const SweepCost& cost, const CostFlags& flags, absl::string_view runs) {
  if (cost.programs > 0 && cost.runs == 0) {
    return absl::StrCat("total: ", cost.programs,
                        " program runs to train: what they compute is the program's own (no "
                        "FLOPs or device-hours estimated)\n");
  }
  std::string line = absl::StrCat("total: ", runs, ", ", FormatFlops(cost.total()),
                                  " FLOPs: ", FormatFlops(cost.train_flops), " training (",
                                  kTrainingFlopsPerForwardFlop, " x forward) + ",
                                  FormatFlops(cost.eval_flops), " evaluation (forward)");
  if (flags.device_peak.empty()) {
    return line + "; device-hours: give --device-peak (a device class or its FLOP/s)\n";
  }
  absl::StatusOr<DevicePeak> peak = ParseDevicePeak(flags.device_peak);
  if (!peak.ok()) return line + "; --device-peak: " + std::string(peak.status().message()) + "\n";
  const std::string device = peak->name.empty()
                                 ? FormatRate(peak->peak)
                                 : absl::StrCat(peak->name, " (", FormatRate(peak->peak), ")");
  const double seconds = cost.total() / (peak->peak * flags.mfu);
  return absl::StrCat(line, "; at ", FormatPercent(flags.mfu), " MFU of ", device, ": ",
                      FormatDeviceTime(seconds), "\n");
}

}  // namespace ablate
