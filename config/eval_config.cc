#include "config/eval_config.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/choice_task.h"
#include "config/program_config.h"

namespace ablate {

namespace {

// What a task reads of EvalTask, besides `task` itself; the others must be left unset.
struct TaskFields {
  const char* task;
  std::vector<std::string> reads;
};

const std::vector<TaskFields>& KnownTasks() {
  static const auto* const tasks = new std::vector<TaskFields>{
      {kPositionLossTask, {"bins", "samples"}},
      {kPasskeyTask, {"lengths", "depths", "samples", "key_digits", "seed"}},
      {kCopyingTask, {"lengths", "samples", "seed"}},
      {kMqarTask, {"pairs", "queries", "samples", "seed"}},
      {kMultikeyTask, {"lengths", "depths", "samples", "key_digits", "pairs", "seed"}},
      {kMultipleChoiceTask, {"file", "samples"}},
  };
  return *tasks;
}

const TaskFields* FindTask(const std::string& name) {
  for (const TaskFields& t : KnownTasks()) {
    if (name == t.task) return &t;
  }
  return nullptr;
}

// The fields of `task` that are set, by name, in the proto's order.
std::vector<std::string> SetFields(const EvalTask& task) {
  std::vector<std::string> set;
  if (task.bins_size() > 0) set.emplace_back("bins");
  if (task.lengths_size() > 0) set.emplace_back("lengths");
  if (task.depths_size() > 0) set.emplace_back("depths");
  if (task.samples() != 0) set.emplace_back("samples");
  if (task.pairs() != 0) set.emplace_back("pairs");
  if (task.queries() != 0) set.emplace_back("queries");
  if (task.key_digits() != 0) set.emplace_back("key_digits");
  if (task.seed() != 0) set.emplace_back("seed");
  if (!task.file().empty()) set.emplace_back("file");
  return set;
}

// Which number a metric is, for its chance level.
enum class MetricKind {
  kLoss,
  kCopyingAccuracy,
  kPasskeyDigit,
  kPasskeyExact,
  kMqarAccuracy,
  kChoiceAccuracy,
  kChoiceLogprob
};

struct Metric {
  std::string name;
  int task;  // index into train.evals
  MetricKind kind;
};

// The metrics of every task with a known name, in EvalMetricNames' order.
std::vector<Metric> Metrics(const RunConfig& config) {
  std::vector<Metric> metrics;
  const bool yarn = config.model().yarn().factor() > 0;
  for (int i = 0; i < config.train().evals_size(); ++i) {
    const EvalTask& t = config.train().evals(i);
    if (t.task() == kPositionLossTask) {
      for (const bool with_yarn : {false, true}) {
        if (with_yarn && !yarn) continue;
        const char* prefix = with_yarn ? "position_loss_yarn@" : "position_loss@";
        for (int b = 0; b + 1 < t.bins_size(); ++b) {
          metrics.push_back(
              {absl::StrCat(prefix, t.bins(b), "-", t.bins(b + 1)), i, MetricKind::kLoss});
        }
      }
    } else if (t.task() == kCopyingTask) {
      for (const int32_t len : t.lengths()) {
        metrics.push_back({absl::StrCat("copying@", len), i, MetricKind::kLoss});
        metrics.push_back({absl::StrCat("copying_acc@", len), i, MetricKind::kCopyingAccuracy});
      }
    } else if (t.task() == kPasskeyTask || t.task() == kMultikeyTask) {
      for (const int32_t len : t.lengths()) {
        metrics.push_back({absl::StrCat(t.task(), "@", len), i, MetricKind::kPasskeyDigit});
        metrics.push_back({absl::StrCat(t.task(), "_exact@", len), i, MetricKind::kPasskeyExact});
      }
    } else if (t.task() == kMqarTask) {
      metrics.push_back({absl::StrCat("mqar@", MqarPairs(t)), i, MetricKind::kMqarAccuracy});
    } else if (t.task() == kMultipleChoiceTask && !t.name().empty()) {
      // Named once its file is read (ApplyChoiceTasks): before that it has no metrics.
      for (std::string& name : ChoiceMetricNames(t.name())) {
        const bool logprob = absl::EndsWith(name, "@logprob");
        metrics.push_back({std::move(name), i,
                           logprob ? MetricKind::kChoiceLogprob : MetricKind::kChoiceAccuracy});
      }
    }
  }
  return metrics;
}

// Data formats that cannot be byte-level text (DataFormat).
bool NeverBytes(DataFormat format) {
  return format == DATA_NANOGPT_BIN || format == DATA_LLMC || format == DATA_MEGATRON;
}

// Collects a task's problems as "train.evals[i].FIELD: what".
class TaskProblems {
 public:
  TaskProblems(int index, std::vector<std::string>* list)
      : prefix_(absl::StrCat("train.evals[", index, "]")), list_(list) {}
  void Add(const std::string& field, const std::string& what) {
    list_->push_back(absl::StrCat(prefix_, field.empty() ? "" : ".", field, ": ", what));
  }

 private:
  std::string prefix_;
  std::vector<std::string>* list_;
};

// lengths of copying and passkey: positive, each once.
void CheckLengths(const EvalTask& t, TaskProblems* p) {
  if (t.lengths_size() == 0) {
    p->Add("lengths", absl::StrCat(t.task(), " needs at least one length"));
  }
  for (int j = 0; j < t.lengths_size(); ++j) {
    const std::string field = absl::StrCat("lengths[", j, "]");
    if (t.lengths(j) <= 0) p->Add(field, absl::StrCat("must be > 0, got ", t.lengths(j)));
    for (int k = 0; k < j; ++k) {
      if (t.lengths(k) == t.lengths(j)) {
        p->Add(field, absl::StrCat(t.lengths(j), " is listed twice"));
        break;
      }
    }
  }
}

void CheckPositionLoss(const RunConfig& config, const EvalTask& t, TaskProblems* p) {
  if (t.bins_size() < 2) {
    p->Add("bins",
           absl::StrCat("position_loss needs at least two edges (one bin), got ", t.bins_size()));
    return;
  }
  for (int j = 0; j < t.bins_size(); ++j) {
    const std::string field = absl::StrCat("bins[", j, "]");
    if (t.bins(j) < 0) p->Add(field, absl::StrCat("must be >= 0, got ", t.bins(j)));
    if (j > 0 && t.bins(j) <= t.bins(j - 1)) {
      p->Add(field, absl::StrCat("must be greater than bins[", j - 1, "] (", t.bins(j - 1),
                                 "): edges increase, got ", t.bins(j)));
    }
  }
  const int32_t last = t.bins(t.bins_size() - 1);
  if (last > config.model().max_seq_len()) {
    p->Add(
        absl::StrCat("bins[", t.bins_size() - 1, "]"),
        absl::StrCat("the windows are as long as the last edge, ", last,
                     " tokens, which must fit model.max_seq_len ", config.model().max_seq_len()));
  }
}

void CheckCopying(const RunConfig& config, const EvalTask& t, TaskProblems* p) {
  CheckLengths(t, p);
  const bool bos = config.train().data().has_bos_token();
  for (int j = 0; j < t.lengths_size(); ++j) {
    const int64_t len = t.lengths(j);
    if (len <= 0) continue;
    const std::string field = absl::StrCat("lengths[", j, "]");
    // The first token of the second copy is not scored (nothing says the copy starts there).
    if (len < 2) {
      p->Add(field,
             "must be >= 2: the first token of the second copy is not scored, so a "
             "string of 1 token scores nothing");
    }
    const int64_t total = (bos ? 1 : 0) + 2 * len;
    if (total > config.model().max_seq_len()) {
      p->Add(field,
             absl::StrCat("a copying sequence is ", bos ? "BOS + " : "", "the string twice, ",
                          total, " tokens for strings of ", len,
                          ", which must fit model.max_seq_len ", config.model().max_seq_len()));
    }
  }
  if (CopyingTokenIds(config).size() < 1) {
    p->Add("task", "copying has no token ids to draw from: the vocabulary holds only BOS and EOD");
  }
}

void CheckPasskey(const RunConfig& config, const EvalTask& t, TaskProblems* p) {
  const DataConfig& d = config.train().data();
  const bool multikey = t.task() == kMultikeyTask;
  if (config.model().vocab_size() < 256 || NeverBytes(d.format())) {
    p->Add("task",
           absl::StrCat(t.task(),
                        " needs byte-level data (text, or a prepared directory of bytes): the "
                        "worker writes the key and the question as bytes and cannot tokenize for "
                        "another vocabulary; this run has model.vocab_size ",
                        config.model().vocab_size(), " and train.data.format ",
                        DataFormat_Name(d.format())));
  }
  CheckLengths(t, p);
  if (t.key_digits() < 0 || t.key_digits() > kMaxPasskeyDigits) {
    p->Add("key_digits", absl::StrCat("must be 1 to ", kMaxPasskeyDigits,
                                      " (0: the default 5), got ", t.key_digits()));
  }
  for (int j = 0; j < t.depths_size(); ++j) {
    const double depth = t.depths(j);
    if (!(depth >= 0 && depth <= 1)) {
      p->Add(absl::StrCat("depths[", j, "]"),
             absl::StrCat("must be in [0, 1] (a fraction of the filler), got ", depth));
    }
  }
  if (multikey && (t.pairs() < 0 || t.pairs() == 1 || t.pairs() > kMaxMultikeyKeys)) {
    p->Add("pairs", absl::StrCat("multikey hides 2 to ", kMaxMultikeyKeys,
                                 " keys (0: the default 4), got ", t.pairs()));
  }
  const int digits = PasskeyDigits(t);
  const int keys = MultikeyKeys(t);
  const int64_t fixed = multikey ? MultikeyFixedTokens(digits, keys, d.has_bos_token())
                                 : PasskeyFixedTokens(digits, d.has_bos_token());
  for (int j = 0; j < t.lengths_size(); ++j) {
    const int64_t len = t.lengths(j);
    if (len <= 0) continue;
    const std::string field = absl::StrCat("lengths[", j, "]");
    if (len > config.model().max_seq_len()) {
      p->Add(field, absl::StrCat("a ", t.task(), " sequence is exactly its length, ", len,
                                 " tokens, which must fit model.max_seq_len ",
                                 config.model().max_seq_len()));
    }
    if (len < fixed) {
      p->Add(field,
             absl::StrCat(len, " tokens cannot hold ", d.has_bos_token() ? "BOS, " : "",
                          multikey ? absl::StrCat(keys, " key sentences") : "the key sentence",
                          ", the question and a ", digits, "-digit key: they take ", fixed,
                          " tokens"));
    }
  }
}

void CheckMqar(const RunConfig& config, const EvalTask& t, TaskProblems* p) {
  if (t.pairs() < 0)
    p->Add("pairs", absl::StrCat("must be >= 0 (0: the default 8), got ", t.pairs()));
  if (t.queries() < 0) {
    p->Add("queries", absl::StrCat("must be >= 0 (0: the default 8), got ", t.queries()));
  }
  if (t.pairs() < 0 || t.queries() < 0) return;
  const int64_t pairs = MqarPairs(t);
  const int64_t queries = MqarQueries(t);
  if (queries > pairs) {
    p->Add("queries",
           absl::StrCat(queries, " queries of ", pairs,
                        " pairs: each key is queried at most once, so queries <= pairs"));
  }
  const bool bos = config.train().data().has_bos_token();
  const int64_t total = (bos ? 1 : 0) + 2 * pairs + 2 * queries;
  if (total > config.model().max_seq_len()) {
    p->Add("pairs",
           absl::StrCat("an mqar sequence is ", bos ? "BOS + " : "", "2 x ", pairs, " pairs + 2 x ",
                        queries, " queries = ", total, " tokens, which must fit model.max_seq_len ",
                        config.model().max_seq_len()));
  }
  const int64_t usable = UsableTokenIds(config).size();
  if (MqarKeyIds(config).size() < pairs || MqarValueIds(config).size() < pairs) {
    p->Add("pairs", absl::StrCat(pairs, " distinct keys (the lower half of the usable ids) and ",
                                 pairs, " distinct values (the upper half) need ", 2 * pairs,
                                 " usable ids; model.vocab_size ", config.model().vocab_size(),
                                 " less BOS and EOD leaves ", usable));
  }
}

void CheckMultipleChoice(const RunConfig& config, const EvalTask& t, TaskProblems* p) {
  const DataConfig& d = config.train().data();
  if (t.file().empty()) {
    p->Add("file", "multiple_choice needs a task file (lm-evaluation-harness format)");
  }
  if (config.model().vocab_size() < 256 || NeverBytes(d.format())) {
    p->Add("task",
           absl::StrCat("multiple_choice needs byte-level data (text, or a prepared directory of "
                        "bytes): the worker scores the task's texts as bytes and cannot tokenize "
                        "them for another vocabulary; this run has model.vocab_size ",
                        config.model().vocab_size(), " and train.data.format ",
                        DataFormat_Name(d.format())));
  }
  const std::string& name = t.name();
  if (!name.empty()) {
    const bool plain = std::all_of(name.begin(), name.end(), [](char ch) {
      return absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' ||
             ch == '.';
    });
    if (!plain || name.size() > 100) {
      p->Add("file", absl::StrCat("the task's name \"", name,
                                  "\" names its metrics: 1 to 100 letters, digits, _ - or .; "
                                  "rename its `task:`"));
    }
  }
}

}  // namespace

int EvalSamples(const EvalTask& t) { return t.samples() > 0 ? t.samples() : kDefaultEvalSamples; }

std::vector<double> PasskeyDepths(const EvalTask& t) {
  if (t.depths_size() == 0) return {0.5};
  return {t.depths().begin(), t.depths().end()};
}

int PasskeyDigits(const EvalTask& t) { return t.key_digits() > 0 ? t.key_digits() : 5; }

int MultikeyKeys(const EvalTask& t) { return t.pairs() > 0 ? t.pairs() : 4; }

int MqarPairs(const EvalTask& t) { return t.pairs() > 0 ? t.pairs() : 8; }

int MqarQueries(const EvalTask& t) {
  return t.queries() > 0 ? t.queries() : std::min(8, MqarPairs(t));
}

int64_t TokenIdSet::at(int64_t i) const {
  int64_t id = lo + i;
  for (const int64_t e : excluded) {
    if (e <= id) ++id;  // sorted: each excluded id at or below shifts the answer past it
  }
  return id;
}

TokenIdSet UsableTokenIds(const RunConfig& config) {
  TokenIdSet s;
  s.hi = config.model().vocab_size();
  const DataConfig& d = config.train().data();
  std::vector<int64_t> special;
  if (d.has_bos_token()) special.push_back(d.bos_token());
  if (d.has_eod_token()) special.push_back(d.eod_token());
  for (const int64_t id : special) {
    if (id >= s.lo && id < s.hi &&
        std::find(s.excluded.begin(), s.excluded.end(), id) == s.excluded.end()) {
      s.excluded.push_back(id);
    }
  }
  std::sort(s.excluded.begin(), s.excluded.end());
  return s;
}

TokenIdSet CopyingTokenIds(const RunConfig& config) {
  TokenIdSet usable = UsableTokenIds(config);
  const int32_t vocab = config.model().vocab_size();
  if (vocab < 256 || vocab > 258 || NeverBytes(config.train().data().format())) return usable;
  TokenIdSet printable;
  printable.lo = 32;
  printable.hi = 127;
  for (const int64_t id : usable.excluded) {
    if (id >= printable.lo && id < printable.hi) printable.excluded.push_back(id);
  }
  return printable;
}

TokenIdSet MqarKeyIds(const RunConfig& config) {
  const TokenIdSet usable = UsableTokenIds(config);
  const int64_t half = usable.size() / 2;
  TokenIdSet keys;
  keys.lo = usable.lo;
  keys.hi = half > 0 ? usable.at(half - 1) + 1 : usable.lo;
  for (const int64_t id : usable.excluded) {
    if (id < keys.hi) keys.excluded.push_back(id);
  }
  return keys;
}

TokenIdSet MqarValueIds(const RunConfig& config) {
  const TokenIdSet usable = UsableTokenIds(config);
  const int64_t half = usable.size() / 2;
  TokenIdSet values;
  values.hi = usable.hi;
  values.lo = half < usable.size() ? usable.at(half) : usable.hi;
  for (const int64_t id : usable.excluded) {
    if (id >= values.lo) values.excluded.push_back(id);
  }
  return values;
}

std::string PasskeyKeySentence(const std::string& key) {
  return absl::StrCat("\nThe pass key is ", key, ". Remember it. ", key, " is the pass key.\n");
}

std::string PasskeyQuestion() { return "\nWhat is the pass key? The pass key is "; }

std::string MultikeySentence(const std::string& name, const std::string& key) {
  return absl::StrCat("\nThe pass key of ", name, " is ", key, ". Remember it. ", key,
                      " is the pass key of ", name, ".\n");
}

std::string MultikeyQuestion(const std::string& name) {
  return absl::StrCat("\nWhat is the pass key of ", name, "? The pass key of ", name, " is ");
}

int64_t MultikeyFixedTokens(int digits, int keys, bool bos) {
  const std::string key(static_cast<size_t>(std::max(digits, 0)), '0');
  const std::string name(kMultikeyNameBytes, 'a');
  return (bos ? 1 : 0) +
         static_cast<int64_t>(keys) * static_cast<int64_t>(MultikeySentence(name, key).size()) +
         static_cast<int64_t>(MultikeyQuestion(name).size() + key.size());
}

int64_t PasskeyFixedTokens(int digits, bool bos) {
  const std::string key(static_cast<size_t>(std::max(digits, 0)), '0');
  return (bos ? 1 : 0) + static_cast<int64_t>(PasskeyKeySentence(key).size() +
                                              PasskeyQuestion().size() + key.size());
}

absl::Status ValidateEvalTasks(const RunConfig& config) {
  std::vector<std::string> problems;
  const TrainConfig& train = config.train();
  for (int i = 0; i < train.evals_size(); ++i) {
    const EvalTask& t = train.evals(i);
    TaskProblems p(i, &problems);
    std::vector<std::string> known;
    for (const TaskFields& k : KnownTasks()) known.emplace_back(k.task);
    const TaskFields* fields = FindTask(t.task());
    if (fields == nullptr) {
      p.Add("task", t.task().empty()
                        ? absl::StrCat("required: one of ", absl::StrJoin(known, ", "))
                        : absl::StrCat("unknown task \"", t.task(), "\"; the tasks are ",
                                       absl::StrJoin(known, ", ")));
      continue;
    }
    for (const std::string& set : SetFields(t)) {
      if (std::find(fields->reads.begin(), fields->reads.end(), set) == fields->reads.end()) {
        p.Add(set, absl::StrCat(t.task(), " does not read it (it reads ",
                                absl::StrJoin(fields->reads, ", "), "): leave it out"));
      }
    }
    if (t.samples() < 0 || t.samples() > kMaxEvalSamples) {
      p.Add("samples", absl::StrCat("must be 1 to ", kMaxEvalSamples, " (0: the default ",
                                    kDefaultEvalSamples, "), got ", t.samples()));
    }
    if (t.task() == kPositionLossTask) CheckPositionLoss(config, t, &p);
    if (t.task() == kCopyingTask) CheckCopying(config, t, &p);
    if (t.task() == kPasskeyTask || t.task() == kMultikeyTask) CheckPasskey(config, t, &p);
    if (t.task() == kMqarTask) CheckMqar(config, t, &p);
    if (t.task() == kMultipleChoiceTask) CheckMultipleChoice(config, t, &p);
  }
  const std::vector<Metric> metrics = Metrics(config);
  std::map<std::string, int> first_task;  // metric name -> the first task producing it
  for (const Metric& m : metrics) {
    const auto [it, inserted] = first_task.emplace(m.name, m.task);
    // A name twice within one task is a length listed twice, reported above.
    if (!inserted && it->second != m.task) {
      problems.push_back(absl::StrCat("train.evals[", m.task, "]: produces the metric ", m.name,
                                      ", as train.evals[", it->second,
                                      "] does: each metric name once"));
    }
  }
  if (static_cast<int64_t>(metrics.size()) > kMaxEvalMetrics) {
    problems.push_back(absl::StrCat("train.evals: the tasks produce ", metrics.size(),
                                    " metrics; an evaluation stores at most ", kMaxEvalMetrics,
                                    ": fewer bins, lengths or tasks"));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
}

std::vector<std::string> EvalMetricNames(const RunConfig& config) {
  std::vector<std::string> names;
  for (Metric& m : Metrics(config)) names.push_back(std::move(m.name));
  return names;
}

std::optional<double> EvalChanceLevel(const std::string& metric, const RunConfig& config) {
  for (const Metric& m : Metrics(config)) {
    if (m.name != metric) continue;
    switch (m.kind) {
      case MetricKind::kLoss:
        return std::log(static_cast<double>(config.model().vocab_size()));
      case MetricKind::kCopyingAccuracy:
        return 1.0 / static_cast<double>(std::max<int64_t>(1, CopyingTokenIds(config).size()));
      case MetricKind::kPasskeyDigit:
        return 0.1;
      case MetricKind::kPasskeyExact:
        return 1.0 / (9.0 * std::pow(10.0, PasskeyDigits(config.train().evals(m.task)) - 1));
      case MetricKind::kMqarAccuracy:
        return 1.0 / static_cast<double>(std::max<int64_t>(1, MqarValueIds(config).size()));
      case MetricKind::kChoiceAccuracy: {
        const double chance = config.train().evals(m.task).chance();
        if (chance > 0) return chance;
        return std::nullopt;
      }
      case MetricKind::kChoiceLogprob:
        return std::nullopt;
    }
  }
  return std::nullopt;
}

std::optional<bool> EvalMetricHigherIsBetter(const std::string& metric, const RunConfig& config) {
  for (const Metric& m : Metrics(config)) {
    if (m.name == metric) return m.kind != MetricKind::kLoss;
  }
  return std::nullopt;
}

}  // namespace ablate
