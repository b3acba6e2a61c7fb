// What a worker sends, checked at the door before anything reaches the store: every step inside
// the run's training length, values finite where a non-finite one means nothing (a non-finite
// loss, gradient norm or evaluation is a divergence signal and is kept), sizes bounded. A report
// that fails is refused whole with INVALID_ARGUMENT naming the field; free text (a failure's
// error, a summary's reason) is cut to kMaxTextBytes instead, so a long exception message never
// costs a run its result.
//
// Pure functions; thread-safe.
#ifndef ABLATE_ORCHESTRATOR_COORDINATOR_DOOR_H_
#define ABLATE_ORCHESTRATOR_COORDINATOR_DOOR_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "config/model_config.h"
#include "proto/ablate.pb.h"

namespace ablate {

inline constexpr size_t kMaxTextBytes = 4096;  // reasons, errors, checkpoint paths
inline constexpr int kMaxProbeLayers = 4096;
inline constexpr int kMaxHistogramBins = 4096;
inline constexpr int kMaxQueryClasses = 8;  // LayerProbes.classes, Probes.classes
inline constexpr size_t kMaxQueryClassName = 32;
inline constexpr int64_t kMaxReportedSeqLen = 1 << 24;  // an evaluation length
inline constexpr int64_t kMaxReportedParams = int64_t{1} << 50;  // a reported parameter count
inline constexpr size_t kMaxSignalBytes = 64;
inline constexpr int kMaxNotices = 16;  // a worker's notices in one batch
// A run's notices stored in all (per coordinator lifetime); further ones are dropped, once
// saying so: 16 lines of 4 KiB per batch would otherwise fill the event log without bound.
inline constexpr int kMaxNoticesPerRun = 64;
// Per method, beside gRPC's message limit (the largest message, a metric batch): a worker's
// registration (its name and resources) and a user's SQL statement.
inline constexpr size_t kMaxRegisterBytes = 64 << 10;
inline constexpr size_t kMaxSqlBytes = 64 << 10;

// What one run's reports may hold, from its config: steps in [0, total_steps]; evaluations
// only at the steps the trainer evaluates at (multiples of eval_every, the last step, the rung
// it pauses at: stop_at_step); probe layers within the model's layers, attention maps within its
// layers and heads and no more than the config asks for. eval_every 0: the config is unknown,
// and only the steps and the fixed bounds are checked.
struct ReportShape {
  int64_t total_steps = 0;
  int64_t stop_at_step = 0;
  int64_t eval_every = 0;
  int num_layers = 0;
  int num_heads = 0;
  int map_heads = 0;  // attention maps per layer (train.attention_map_heads)
};

// The shape of a run of `config` (total_steps its train.steps; stop_at_step left 0).
ReportShape ReportShapeOf(const RunConfig& config);

// The metric batch of a Report, or of a Finish's final_report (`what` names which: "report",
// "finish: final_report"), for a run of that shape.
absl::Status CheckReportAtDoor(const ReportRequest& report, const ReportShape& shape,
                               absl::string_view what);
// The same with only the run's length known.
absl::Status CheckReportAtDoor(const ReportRequest& report, int64_t total_steps,
                               absl::string_view what);

// A Finish's summary for a run of `total_steps` steps.
absl::Status CheckSummaryAtDoor(const RunSummary& summary, int64_t total_steps);

// `text` cut to at most `limit` bytes (at a UTF-8 boundary, marked " [... N bytes cut]").
std::string BoundedText(absl::string_view text, size_t limit = kMaxTextBytes);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_COORDINATOR_DOOR_H_
