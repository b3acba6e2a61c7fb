// Multiple-choice tasks from the user's files (train.evals' `multiple_choice`, docs/evals.md), in
// lm-evaluation-harness v0.4's task format: a YAML file naming a JSON dataset and how each
// document becomes a context, its choices and the index of the right one.
//
// Supported, the rest refused by name (FILE:LINE: FIELD: what):
//   task (the metric name, required), include (a base task file, relative to this one, merged
//   under this one's keys, as the harness does), output_type (multiple_choice only),
//   dataset_path (json only), dataset_name (null only), dataset_kwargs.data_files (a file, a
//   list of files, or a map of split -> file or files; relative to the task file),
//   test_split / validation_split / training_split (the split evaluated: test_split when set,
//   else validation_split), doc_to_text, doc_to_choice, doc_to_target, description (a template
//   before every context), target_delimiter (default " "), num_fewshot (0 only),
//   metric_list (metrics acc and acc_norm, with aggregation mean and higher_is_better true),
//   and the keys that do not change what is scored: tag, group, metadata, should_decontaminate,
//   doc_to_decontamination_query, fewshot_delimiter, fewshot_split, fewshot_config.
//   Refused: `!function` anywhere, process_docs, process_results, filter_list, generation_kwargs,
//   any other key.
// The documents: JSON Lines (one object per line, blank lines skipped) or one JSON array of
// objects.
//
// doc_to_text, doc_to_choice and doc_to_target are, as in the harness: the name of a document
// field (its value); a template; for doc_to_choice a YAML list of templates; for doc_to_target an
// integer. A template is text with {{ expression }} parts; the expressions are the Jinja subset
// the harness's task files use in practice:
//   names (document fields), a.b and a["b"] (object members), a[i] and a[i:j] (list or string
//   items and slices, negative from the end), string, integer and list literals ([a, b]),
//   x + y (strings or lists), the methods strip / lstrip / rstrip ([chars]), lower, upper,
//   split([sep]), replace(old, new), index(x) (of a list or string), join(list) (of a string),
//   and the filters | trim, | lower, | upper, | join(sep), | first, | last.
// Refused: {% statements %}, {# comments #}, and any other method, filter or operator, by name.
// A template that is one {{ expression }} only gives the expression's value (a list of choices,
// an index); otherwise its text (a list rendered as Python writes it, as Jinja would). Strings
// are indexed by bytes (the same as Python's characters for ASCII text).
//
// doc_to_target gives an integer (or the digits of one), or a string, which is then the choice
// that equals it. Every document must give a context, at least two choices, and an index among
// them; one that does not is an error naming its data file, its line (JSON Lines) or index
// (an array), and the field.
//
// No LibTorch and no gRPC: the sweep expander (the name, fingerprint and chance level that go into
// the run's config), `ablate-worker train` and the worker's evaluation share it. Pure functions
// of the files; thread-safe.
#ifndef ABLATE_CONFIG_CHOICE_TASK_H_
#define ABLATE_CONFIG_CHOICE_TASK_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"

namespace ablate {

inline constexpr char kMultipleChoiceTask[] = "multiple_choice";

// One document, as scored: each choice's log-probability as a continuation of the context is
// summed over its tokens, continuation = target_delimiter + choice.
struct ChoiceItem {
  std::string context;               // description + doc_to_text
  std::vector<std::string> choices;  // doc_to_choice, at least two
  int gold = 0;                      // doc_to_target, an index into choices
};

struct ChoiceTask {
  std::string name;                     // `task:`
  std::string file;                     // the task file as given
  std::string target_delimiter = " ";   // between the context and each choice
  std::vector<std::string> data_files;  // the evaluated split's files, resolved
  std::vector<ChoiceItem> items;        // in the files' order, at most `limit`
  // The first 16 hex digits of the SHA-256 over the task file, every file it includes, and the
  // evaluated split's data files (each content with its length), in that order.
  std::string fingerprint;
  double chance = 0;  // the mean over items of 1 / choices
};

// Reads the task file `path` and its split's documents, the first `limit` of them (0: all).
// InvalidArgument naming FILE:LINE and the field for a malformed or unsupported task file, and
// the data file with its line or index for a document that does not give an item; NotFound for a
// file that is not there.
absl::StatusOr<ChoiceTask> LoadChoiceTask(const std::string& path, int limit);

// The metric names of a loaded task: NAME (accuracy), NAME@acc_norm (accuracy with each choice's
// log-probability divided by its length in bytes, the harness's acc_norm), NAME@logprob (the mean
// over items of the log-probability of the right choice's tokens, in nats).
std::vector<std::string> ChoiceMetricNames(const std::string& name);

// For every multiple_choice task of config.train().evals: loads its file (the first `samples`
// items) and sets EvalTask.name, fingerprint and chance. Errors name the task:
// "train.evals[i].file: ..." (a task without a file included).
absl::Status ApplyChoiceTasks(RunConfig* config);

}  // namespace ablate

#endif  // ABLATE_CONFIG_CHOICE_TASK_H_
