// What a program run reports, read from its output (docs/program.md, "Reporting"): pure code,
// no process, no gRPC, no LibTorch. One OutputParser per attempt reads its lines in order.
//
// `report: ablate` reads `@ablate {json}` anywhere in a line (launcher prefixes survive):
//   {"t":"step","step":12,"loss":3.1,"grad_norm":0.8,"lr":0.001,"tokens":4096}
//   {"t":"eval","step":500,"val_loss":2.1,"metrics":{"m_act":12.5,"f_attn":0.04,"gate_score":0.3}}
//   {"t":"ckpt","step":500}   {"t":"params","total":N,"activated":N}
//   {"t":"end"}               {"t":"error","msg":"...","permanent":true}
// Numbers may be given as the strings "nan", "inf" and "-inf".
// `report: nanogpt` reads karpathy/nanoGPT's own lines: `iter N: loss X, ...` is step N + 1 (its
// iterations count from 0, and the loss of iteration N is measured after N updates, as ablate's
// step N + 1 is), `step N: train loss X, val loss Y` an evaluation after N updates, and `saving
// checkpoint to DIR` a checkpoint of the last evaluation's step, durable once the next line comes.
// `report: regex` reads the spec's patterns: named groups step and loss (grad_norm, lr, tokens
// optional) for steps, step and val_loss for evaluations.
#ifndef ABLATE_WORKER_PROGRAM_OUTPUT_PARSER_H_
#define ABLATE_WORKER_PROGRAM_OUTPUT_PARSER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/ablate.pb.h"

namespace re2 {
class RE2;
}

namespace ablate {

// The longest line the parser reads (a longer one is cut there: its report, if any, is invalid).
inline constexpr size_t kMaxProgramLineBytes = 64 << 10;

// One thing a line reported.
struct ProgramEvent {
  enum class Kind { kStep, kEval, kCheckpoint, kParams, kEnd, kError, kInvalid };
  Kind kind = Kind::kInvalid;
  StepMetrics step;             // kStep: step, loss, grad_norm, lr
  bool grad_norm_reported = false;  // kStep: the line had a grad norm (else step's 0 is none)
  int64_t tokens = 0;           // kStep: tokens trained in the step (0: not reported)
  EvalResult eval;              // kEval: step, val_loss, val_ppl, probes' known means
  int64_t checkpoint_step = 0;  // kCheckpoint
  ParamCount params;            // kParams: total, activated
  std::string message;  // kError: its msg; kInvalid: what is wrong; kEval: metrics dropped
  bool permanent = false;       // kError
};

class OutputParser {
 public:
  explicit OutputParser(const ProgramConfig& config);
  ~OutputParser();

  // The events of one line (without its newline), in order: none for a line that reports
  // nothing, kInvalid for a report that cannot be read (bad JSON, a missing field, an unknown
  // `t`). A line of the nanoGPT reader may also confirm an earlier checkpoint.
  std::vector<ProgramEvent> Parse(absl::string_view line);

 private:
  void ParseAblate(absl::string_view line, std::vector<ProgramEvent>* out);
  void ParseNanoGpt(absl::string_view line, std::vector<ProgramEvent>* out);
  void ParseRegex(absl::string_view line, std::vector<ProgramEvent>* out);

  ProgramReport report_;
  std::unique_ptr<re2::RE2> step_re_, eval_re_;  // report: regex
  // nanoGPT: the step of its last evaluation, and a checkpoint announced but not yet durable.
  int64_t last_eval_step_ = 0;
  std::optional<int64_t> pending_checkpoint_;
};

}  // namespace ablate

#endif  // ABLATE_WORKER_PROGRAM_OUTPUT_PARSER_H_
