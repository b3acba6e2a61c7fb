// The evaluation tasks of train.evals (docs/evals.md; settings, names and chance levels in
// config/eval_config.h), run on any model that maps tokens to logits, so that tests can score
// models whose answers are known:
//   position_loss  Press et al. 2021, ALiBi (arXiv 2108.12409): the loss per bin of token
//                  positions, over windows cut back to back from the start of the validation
//                  split; with and without YaRN.
//   copying        Olsson et al. 2022, induction heads (arXiv 2209.11895): a random string twice;
//                  the loss and the accuracy on the second copy.
//   passkey        Mohtashami & Jaggi 2023 (arXiv 2305.16300), scored as RULER (arXiv 2404.06654)
//                  does: a key in validation text at set depths, asked for at the end; the
//                  teacher-forced accuracy of its digits and the exact match of greedy decoding.
//   mqar           Arora et al. 2023, Zoology (arXiv 2312.04927): key-value pairs, then queried
//                  keys; the accuracy of each queried value.
//   multiple_choice  lm-evaluation-harness's loglikelihood scoring of the user's task file
//                  (config/choice_task.h): acc, acc_norm and the right answer's log-probability.
// Every item is a pure function of the config (EvalTask.seed and the validation text): the same
// config and model give the same metrics at every evaluation and in every run.
//
// Worker-internal (includes LibTorch). Called on the training thread.
#ifndef ABLATE_WORKER_TRAIN_EVAL_TASKS_H_
#define ABLATE_WORKER_TRAIN_EVAL_TASKS_H_

#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"
#include "worker/train/data.h"

namespace ablate {

// A model under evaluation: tokens (B, T) int64 on the evaluation's device to logits (B, T, V)
// float; `yarn` asks for the model's YaRN RoPE scaling (ModelConfig.yarn) for this call. Causal:
// the logits at position t depend on tokens 0..t only (passkey_exact relies on it). May throw
// c10::Error (the trainer's boundary converts it).
using LogitsFn = std::function<torch::Tensor(const torch::Tensor& tokens, bool yarn)>;

// What the tasks need of the data beyond a valid config, checked when the run starts so that a
// bad combination fails before training: passkey needs byte-level data (text, or a prepared
// directory whose manifest's tokenizer is "bytes"), since the worker cannot tokenize its texts
// for a SentencePiece vocabulary; position_loss needs samples x the last edge + 1 validation
// tokens; multiple_choice needs byte-level data and its task file readable, unchanged since the
// run was keyed (EvalTask.fingerprint). InvalidArgument (FailedPrecondition for a changed file)
// naming the task and the setting otherwise.
absl::Status CheckEvalTasksData(const TokenData& data, const RunConfig& config);

// Runs every task of config.train().evals on `model` under torch::NoGradGuard, train.batch_size
// sequences per call (fewer where a batch's logits would pass kMaxEvalLogitFloats), and returns
// their metrics by the names of EvalMetricNames (all of them, but for a value that is not
// finite: the coordinator stores finite values only, and a model that gives NaN shows it in its
// validation loss already). Errors (InvalidArgument, naming the task and the setting): the config
// fails ValidateEvalTasks, or CheckEvalTasksData.
struct EvalTaskResults {
  std::map<std::string, double> metrics;
  // Per-item scores of the accuracies and log-probabilities (EvalResult.items): passkey@L per
  // sequence (the fraction of its digits), passkey_exact@L per sequence, copying_acc@L per
  // string, mqar@P per query, a multiple-choice task's three per document.
  std::map<std::string, std::vector<float>> items;
};
absl::StatusOr<EvalTaskResults> RunEvalTasks(const LogitsFn& model, const TokenData& data,
                                             const RunConfig& config, torch::Device device);

// The most logits (floats) one call of the model may return: 2^28, 1 GiB. A large vocabulary at a
// long length gets fewer rows per call.
inline constexpr int64_t kMaxEvalLogitFloats = int64_t{1} << 28;

}  // namespace ablate

#endif  // ABLATE_WORKER_TRAIN_EVAL_TASKS_H_
