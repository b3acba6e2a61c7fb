// Evaluation tasks of a run (TrainConfig.evals, docs/evals.md): their defaults, their validation,
// the metric names they produce and each metric's chance level; and the token ids and texts the
// tasks draw from, so that the worker's items and the chance levels stated here cannot disagree.
//
// No LibTorch here: the coordinator, the CLI and the worker share this code (the tasks themselves
// run in worker/train/eval_tasks.h). Thread-safe (pure functions).
#ifndef ABLATE_CONFIG_EVAL_CONFIG_H_
#define ABLATE_CONFIG_EVAL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/ablate.pb.h"

namespace ablate {

// The task names of EvalTask.task.
inline constexpr char kPositionLossTask[] = "position_loss";
inline constexpr char kPasskeyTask[] = "passkey";
inline constexpr char kCopyingTask[] = "copying";
inline constexpr char kMqarTask[] = "mqar";
inline constexpr char kMultikeyTask[] = "multikey";
// multiple_choice: kMultipleChoiceTask, config/choice_task.h.

// EvalTask.samples' range when set (0: kDefaultEvalSamples), and EvalTask.key_digits' (0: 5).
inline constexpr int kDefaultEvalSamples = 16;
inline constexpr int kMaxEvalSamples = 4096;
inline constexpr int kMaxPasskeyDigits = 20;

// The settings a task runs with, the proto's defaults filled in.
int EvalSamples(const EvalTask& task);                    // samples, default 16
std::vector<double> PasskeyDepths(const EvalTask& task);  // depths, default [0.5]
int PasskeyDigits(const EvalTask& task);                  // key_digits, default 5
int MultikeyKeys(const EvalTask& task);                   // multikey's pairs, default 4
int MqarPairs(const EvalTask& task);                      // pairs, default 8
// queries, default 8, or `pairs` when there are fewer pairs: a config that sets only
// pairs: 4 means every key queried, not an error.
int MqarQueries(const EvalTask& task);

// InvalidArgument listing every problem of config.train().evals as "train.evals[i].FIELD: what"
// joined with "; " (as ValidateRunConfig): an unknown task, a field the task does not read, a
// setting out of range, a sequence that does not fit model.max_seq_len, an mqar task the
// vocabulary is too small for, two tasks producing the same metric name, or more metrics than an
// evaluation may store (kMaxEvalMetrics). OK otherwise (and for no tasks).
absl::Status ValidateEvalTasks(const RunConfig& config);

// The metric names (EvalResult.metrics) the tasks of a valid config produce, in order: task by
// task as listed, and within a task
//   position_loss  position_loss@LO-HI per bin, then position_loss_yarn@LO-HI per bin when
//                  model.yarn.factor > 0;
//   copying        copying@L, copying_acc@L per length;
//   passkey        passkey@L, passkey_exact@L per length;
//   multikey       multikey@L, multikey_exact@L per length;
//   mqar           mqar@PAIRS;
//   multiple_choice  NAME, NAME@acc_norm, NAME@logprob (ChoiceMetricNames) once its file is
//                  read (EvalTask.name set: ApplyChoiceTasks); none before.
std::vector<std::string> EvalMetricNames(const RunConfig& config);

// The chance level of `metric`, one of EvalMetricNames(config); nullopt for any other name.
// For an accuracy, that of a guesser who knows which tokens can be the answer but not which one
// is: passkey@L 1/10 (a digit), passkey_exact@L 1 / (9 x 10^(digits-1)) (a key, whose first
// digit is never 0), copying_acc@L 1 / (ids copying draws from), mqar@P 1 / (ids a value is
// drawn from). For a loss (position_loss@, position_loss_yarn@, copying@): ln(model.vocab_size),
// the cross-entropy of a model that spreads its mass uniformly over the vocabulary. A
// multiple-choice accuracy (NAME, NAME@acc_norm): EvalTask.chance, the mean of 1 / choices; its
// log-probability has none stated (nullopt): it depends on each answer's length.
std::optional<double> EvalChanceLevel(const std::string& metric, const RunConfig& config);

// Whether `metric`, one of EvalMetricNames(config), is better higher (accuracies and
// log-probabilities) or lower (losses); nullopt for any other name.
std::optional<bool> EvalMetricHigherIsBetter(const std::string& metric, const RunConfig& config);

// A set of token ids: [lo, hi) without `excluded` (sorted, distinct, each inside [lo, hi)).
struct TokenIdSet {
  int64_t lo = 0, hi = 0;
  std::vector<int64_t> excluded;

  int64_t size() const { return hi - lo - static_cast<int64_t>(excluded.size()); }
  // The i-th id of the set in increasing order, for 0 <= i < size().
  int64_t at(int64_t i) const;
};

// The ids every task keeps away from: data.bos_token and data.eod_token, when set and inside the
// vocabulary (a BOS or an end of document inside a string would say where it starts or ends).
TokenIdSet UsableTokenIds(const RunConfig& config);
// The ids a copying string is drawn from: for byte-level data, printable ASCII (32..126) less the
// special ids, so that the strings are text-like bytes the model has seen; otherwise every
// usable id. Byte-level is decided from the config alone (model.vocab_size in [256, 258], as text
// and `ablate data prepare --tokenizer bytes` give, and a data format that can hold text: not
// nanoGPT .bin, llm.c or Megatron), so that the coordinator's chance level is the worker's.
TokenIdSet CopyingTokenIds(const RunConfig& config);
// mqar's keys (the lower half of the usable ids) and values (the upper half), as Zoology's
// generator and `ablate data synth mqar` split them.
TokenIdSet MqarKeyIds(const RunConfig& config);
TokenIdSet MqarValueIds(const RunConfig& config);

// The pass key texts, as `ablate data synth passkey` writes them (orchestrator/data/synth.cc), so
// that a model trained on that mix is evaluated on its own format. `key` is the key's digits.
// The sentence hidden in the filler: "\nThe pass key is K. Remember it. K is the pass key.\n".
std::string PasskeyKeySentence(const std::string& key);
// What ends every sequence, before the key itself: "\nWhat is the pass key? The pass key is ".
std::string PasskeyQuestion();
// Tokens of a passkey sequence that are not filler, for byte-level data: [BOS], the key sentence,
// the question and the key (3 x digits + the texts' bytes).
int64_t PasskeyFixedTokens(int digits, bool bos);

// multikey (RULER's multi-key needle in a haystack, arXiv 2404.06654): `keys` pass keys, each
// named by kMultikeyNameBytes random lower-case letters, in the sentence
// "\nThe pass key of NAME is K. Remember it. K is the pass key of NAME.\n"; the sequence ends
// "\nWhat is the pass key of NAME? The pass key of NAME is " and the key of one of them.
inline constexpr int kMultikeyNameBytes = 6;
inline constexpr int kMaxMultikeyKeys = 64;
std::string MultikeySentence(const std::string& name, const std::string& key);
std::string MultikeyQuestion(const std::string& name);
// Tokens of a multikey sequence that are not filler, for byte-level data.
int64_t MultikeyFixedTokens(int digits, int keys, bool bos);

}  // namespace ablate

#endif  // ABLATE_CONFIG_EVAL_CONFIG_H_
