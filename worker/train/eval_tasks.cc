#include "worker/train/eval_tasks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/choice_task.h"
#include "config/data_source.h"
#include "config/eval_config.h"

namespace ablate {

namespace {

using Metrics = std::map<std::string, double>;
using Items = std::map<std::string, std::vector<float>>;

// Separates the random streams of the tasks that draw (EvalTask.seed is shared by default).
constexpr uint32_t kCopyingStream = 1;
constexpr uint32_t kPasskeyStream = 2;
constexpr uint32_t kMqarStream = 3;
constexpr uint32_t kMultikeyStream = 4;

// Validation tokens read per window for the passkey filler: any length would do, as long as the
// split holds one window and a token more (TokenData::Consecutive).
constexpr int64_t kFillerWindow = 1024;

// std::mt19937_64 and std::seed_seq are specified exactly by the standard, the std
// distributions are not (libstdc++ and libc++ differ): the draws are written out so that a seed
// gives the same items on every platform. One stream per (task, seed, setting), so that adding a
// length to a task leaves the items of its other lengths as they were.
class Rng {
 public:
  Rng(uint64_t seed, uint32_t stream, uint64_t setting, uint64_t setting2 = 0) {
    std::seed_seq seq{static_cast<uint32_t>(seed),
                      static_cast<uint32_t>(seed >> 32),
                      stream,
                      static_cast<uint32_t>(setting),
                      static_cast<uint32_t>(setting >> 32),
                      static_cast<uint32_t>(setting2),
                      static_cast<uint32_t>(setting2 >> 32)};
    gen_.seed(seq);
  }
  // Uniform in [0, n), n > 0: rejection of the low values that would bias x % n.
  uint64_t Below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    for (;;) {
      const uint64_t x = gen_();
      if (x >= threshold) return x % n;
    }
  }

 private:
  std::mt19937_64 gen_;
};

// A length is scored with YaRN as the lengths of train.eval_seq_lens are (EvaluateLength): when
// the model has it, beyond its original length, or always with yarn.apply ALWAYS.
bool YarnAt(const ModelConfig& model, int64_t len) {
  const YarnConfig& yarn = model.yarn();
  return yarn.factor() > 0 && (yarn.apply() == YARN_ALWAYS || len > yarn.original_seq_len());
}

// What a task's errors start with: "train.evals[i] (passkey)".
std::string TaskName(int index, const EvalTask& task) {
  return absl::StrCat("train.evals[", index, "] (", task.task(), ")");
}

// Runs `model` over the rows of `tokens` (N, T), on the CPU, in calls of at most train.batch_size
// rows (fewer where the logits would pass kMaxEvalLogitFloats), handing each call's first row and
// its logits (rows, T, V) float to `score`.
void ForEachCall(const LogitsFn& model, const RunConfig& config, const torch::Tensor& tokens,
                 bool yarn, torch::Device device,
                 const std::function<void(int64_t, const torch::Tensor&)>& score) {
  const int64_t n = tokens.size(0);
  const int64_t len = tokens.size(1);
  const int64_t vocab = config.model().vocab_size();
  const int64_t rows = std::max<int64_t>(
      1, std::min<int64_t>(config.train().batch_size(), kMaxEvalLogitFloats / (len * vocab)));
  for (int64_t first = 0; first < n; first += rows) {
    const int64_t end = std::min(n, first + rows);
    torch::Tensor logits = model(tokens.slice(0, first, end).to(device), yarn);
    TORCH_CHECK(logits.dim() == 3 && logits.size(0) == end - first && logits.size(1) == len &&
                    logits.size(2) == vocab,
                "evaluation model: logits of ", end - first, " x ", len, " tokens must be (",
                end - first, ", ", len, ", ", vocab, "), got ", logits.sizes());
    score(first, logits.to(torch::kFloat32));
  }
}

// The cross-entropy (nats) of each row of `logits` (..., V) against `targets` (...).
torch::Tensor TokenLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return -torch::log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
}

// 1 where the target is the argmax of its logits, shared when the maximum is tied: 1/k when the
// target is one of k tied maxima (the expected score of breaking the tie at random), so that a
// model with flat logits scores 1/V on every platform rather than whatever index argmax picks.
torch::Tensor TieSharedHits(const torch::Tensor& logits, const torch::Tensor& targets) {
  const torch::Tensor is_max = logits.eq(std::get<0>(logits.max(-1, /*keepdim=*/true)));
  return is_max.gather(-1, targets.unsqueeze(-1)).squeeze(-1).to(torch::kFloat64) /
         is_max.sum(-1).to(torch::kFloat64);
}

void Put(Metrics* out, std::string name, double value) {
  if (std::isfinite(value)) (*out)[std::move(name)] = value;
}

// Appends the values of `scores` (any shape, row-major) to the items of `name`.
void AddItems(Items* items, const std::string& name, const torch::Tensor& scores) {
  const torch::Tensor flat = scores.to(torch::kCPU, torch::kFloat32).contiguous().view(-1);
  const float* begin = flat.data_ptr<float>();
  std::vector<float>& into = (*items)[name];
  into.insert(into.end(), begin, begin + flat.numel());
}

// ---- position_loss -----------------------------------------------------------------------------

void PositionLoss(const LogitsFn& model, const TokenData& data, const RunConfig& config,
                  const EvalTask& task, torch::Device device, Metrics* out) {
  const int64_t len = task.bins(task.bins_size() - 1);
  const int64_t samples = EvalSamples(task);
  torch::Tensor x = torch::empty({samples, len}, torch::kLong);
  torch::Tensor y = torch::empty({samples, len}, torch::kLong);
  data.Consecutive(TokenData::Split::kVal, samples, len, x.data_ptr<int64_t>(),
                   y.data_ptr<int64_t>());
  for (const bool yarn : {false, true}) {
    if (yarn && !(config.model().yarn().factor() > 0)) continue;
    torch::Tensor sum = torch::zeros({len}, torch::kFloat64);  // by position, over the windows
    ForEachCall(model, config, x, yarn, device, [&](int64_t first, const torch::Tensor& logits) {
      const torch::Tensor targets = y.slice(0, first, first + logits.size(0)).to(device);
      sum += TokenLoss(logits, targets).to(torch::kFloat64).sum(0).cpu();
    });
    for (int b = 0; b + 1 < task.bins_size(); ++b) {
      const int64_t lo = task.bins(b), hi = task.bins(b + 1);
      Put(out, absl::StrCat(yarn ? "position_loss_yarn@" : "position_loss@", lo, "-", hi),
          sum.slice(0, lo, hi).sum().item<double>() / static_cast<double>((hi - lo) * samples));
    }
  }
}

// ---- copying -----------------------------------------------------------------------------------
//
// [BOS] s s for a random string s of L ids. Scored: the second copy's tokens but its first,
// predicted from everything before them. The first is left out because nothing in the input says
// that a copy starts there: any model, however well it copies, is at chance on it.

void Copying(const LogitsFn& model, const RunConfig& config, const EvalTask& task,
             torch::Device device, Metrics* out, Items* items) {
  const TokenIdSet ids = CopyingTokenIds(config);
  const DataConfig& d = config.train().data();
  const int64_t bos = d.has_bos_token() ? 1 : 0;
  const int64_t samples = EvalSamples(task);
  for (const int32_t len : task.lengths()) {
    Rng rng(task.seed(), kCopyingStream, static_cast<uint64_t>(len));
    const int64_t total = bos + 2 * int64_t{len};
    torch::Tensor tokens = torch::empty({samples, total}, torch::kLong);
    auto t = tokens.accessor<int64_t, 2>();
    for (int64_t r = 0; r < samples; ++r) {
      if (bos) t[r][0] = d.bos_token();
      for (int64_t i = 0; i < len; ++i) {
        const int64_t id =
            ids.at(static_cast<int64_t>(rng.Below(static_cast<uint64_t>(ids.size()))));
        t[r][bos + i] = id;
        t[r][bos + len + i] = id;
      }
    }
    // Positions bos+L .. bos+2L-2 predict the second copy's tokens 1 .. L-1.
    const int64_t from = bos + len, to = bos + 2 * int64_t{len} - 1;
    double loss = 0, hits = 0;
    ForEachCall(
        model, config, tokens, YarnAt(config.model(), total), device,
        [&](int64_t first, const torch::Tensor& logits) {
          const torch::Tensor targets =
              tokens.slice(0, first, first + logits.size(0)).slice(1, from + 1, to + 1).to(device);
          const torch::Tensor scored = logits.slice(1, from, to);
          loss += TokenLoss(scored, targets).to(torch::kFloat64).sum().item<double>();
          const torch::Tensor row_hits = TieSharedHits(scored, targets);
          hits += row_hits.sum().item<double>();
          AddItems(items, absl::StrCat("copying_acc@", len), row_hits.mean(1));  // per string
        });
    const double scored = static_cast<double>(samples * (len - 1));
    Put(out, absl::StrCat("copying@", len), loss / scored);
    Put(out, absl::StrCat("copying_acc@", len), hits / scored);
  }
}

// ---- passkey -----------------------------------------------------------------------------------

// Whether `data` is byte-level: text, or a prepared directory of bytes (its manifest says so).
absl::Status CheckByteLevel(int index, const EvalTask& task, const RunConfig& config) {
  const DataConfig& d = config.train().data();
  const std::string path = d.path().empty() ? DefaultCorpusPath() : d.path();
  absl::StatusOr<DataSource> source = ResolveDataSource(d, path, /*fingerprint=*/false);
  if (!source.ok()) {
    return absl::Status(source.status().code(),
                        absl::StrCat(TaskName(index, task), ": ", source.status().message()));
  }
  const bool bytes =
      source->format == DATA_TEXT || (source->format == DATA_PREPARED && source->manifest &&
                                      source->manifest->tokenizer == "bytes");
  if (bytes && config.model().vocab_size() >= 256) return absl::OkStatus();
  std::string what = DataFormat_Name(source->format);
  if (source->manifest)
    absl::StrAppend(&what, " with tokenizer \"", source->manifest->tokenizer, "\"");
  return absl::InvalidArgumentError(absl::StrCat(
      TaskName(index, task), ": ", task.task(),
      " needs byte-level data (text, or a prepared directory whose manifest.json has tokenizer "
      "\"bytes\"), because the worker writes the task's texts as bytes and cannot tokenize them "
      "for a SentencePiece vocabulary; ",
      path, " is ", what));
}

// The first `n` tokens of the validation text, read back to back from its start (the split's
// text repeats when it is shorter), without the ids that are no byte (ids >= 256, BOS, EOD):
// documents glued, as `ablate data synth passkey` draws its filler.
absl::StatusOr<std::vector<int64_t>> ValidationBytes(const TokenData& data, const RunConfig& config,
                                                     int64_t n) {
  std::vector<int64_t> bytes;
  if (n == 0) return bytes;
  const DataConfig& d = config.train().data();
  const auto special = [&](int64_t id) {
    return id >= 256 || (d.has_bos_token() && id == d.bos_token()) ||
           (d.has_eod_token() && id == d.eod_token());
  };
  const int64_t window = std::min<int64_t>(kFillerWindow, data.val_tokens() - 1);
  int64_t windows = (n + window - 1) / window;
  for (;;) {
    std::vector<int64_t> inputs(static_cast<size_t>(windows * window));
    std::vector<int64_t> targets(inputs.size());
    // The targets of back-to-back windows are the text itself, with or without a BOS.
    data.Consecutive(TokenData::Split::kVal, windows, window, inputs.data(), targets.data());
    bytes.clear();
    for (const int64_t id : targets) {
      if (!special(id)) bytes.push_back(id);
      if (static_cast<int64_t>(bytes.size()) == n) return bytes;
    }
    if (bytes.empty() && windows * window >= data.val_tokens()) {
      return absl::InvalidArgumentError(
          absl::StrCat("passkey: the validation split of ", data.source(),
                       " holds no text bytes for the filler (only BOS and end-of-document ids)"));
    }
    windows *= 2;
  }
}

// Byte-level ids of `text`.
std::vector<int64_t> ToTokens(const std::string& text) {
  return std::vector<int64_t>(reinterpret_cast<const unsigned char*>(text.data()),
                              reinterpret_cast<const unsigned char*>(text.data()) + text.size());
}

// Sequences of exactly L tokens: [BOS] filler[0, depth) + the key sentence + filler[depth, n) +
// the question + the key, where the filler is the sample's window of the validation text and
// depth = round(d x n). One random key per sample, shared by its depths, and so is its filler:
// the depths differ in where the key sits only.
//
// Scored on the key's digits at the end: passkey@L, the teacher-forced accuracy of each digit;
// passkey_exact@L, the exact match of the key decoded greedily (argmax) after the question.
// Greedy decoding stays on the key as long as every digit it picked was right, so for a causal
// model the decoded key is the key exactly when every teacher-forced argmax is right: one forward
// pass gives both, where decoding would take one per digit.
//
// multikey (RULER's multi-key needle in a haystack, arXiv 2404.06654) is the same with `pairs`
// keys, each named: the key asked for at each depth, the others (distractors, with their own
// names and keys) at positions drawn uniformly over the filler once per sample; the question
// names the key it asks for. Scored as passkey: multikey@L, multikey_exact@L.
absl::Status Passkey(const LogitsFn& model, const TokenData& data, const RunConfig& config,
                     int index, const EvalTask& task, torch::Device device, Metrics* out,
                     Items* items) {
  const DataConfig& d = config.train().data();
  const int64_t bos = d.has_bos_token() ? 1 : 0;
  const int64_t samples = EvalSamples(task);
  const int digits = PasskeyDigits(task);
  const bool multikey = task.task() == kMultikeyTask;
  const int keys = multikey ? MultikeyKeys(task) : 1;
  const std::vector<double> depths = PasskeyDepths(task);
  const int64_t rows = samples * static_cast<int64_t>(depths.size());
  for (const int32_t len : task.lengths()) {
    Rng rng(task.seed(), multikey ? kMultikeyStream : kPasskeyStream, static_cast<uint64_t>(len));
    const int64_t n_filler = len - (multikey ? MultikeyFixedTokens(digits, keys, bos != 0)
                                             : PasskeyFixedTokens(digits, bos != 0));
    absl::StatusOr<std::vector<int64_t>> filler = ValidationBytes(data, config, samples * n_filler);
    if (!filler.ok()) {
      return absl::Status(
          filler.status().code(),
          absl::StrCat(TaskName(index, task), " at length ", len, ": ", filler.status().message()));
    }
    torch::Tensor tokens = torch::empty({rows, len}, torch::kLong);
    auto t = tokens.accessor<int64_t, 2>();
    for (int64_t s = 0; s < samples; ++s) {
      const auto draw_key = [&] {
        std::string key(static_cast<size_t>(digits), '0');
        key[0] = static_cast<char>('1' + rng.Below(9));  // no leading zero, as synth's keys
        for (int i = 1; i < digits; ++i)
          key[static_cast<size_t>(i)] = static_cast<char>('0' + rng.Below(10));
        return key;
      };
      const std::string key = draw_key();
      std::vector<int64_t> sentence = ToTokens(PasskeyKeySentence(key));
      std::vector<int64_t> ending = ToTokens(PasskeyQuestion() + key);
      // multikey: the distractors' sentences at their positions in the filler.
      std::vector<std::pair<int64_t, std::vector<int64_t>>> distractors;
      if (multikey) {
        std::vector<std::string> names;
        while (static_cast<int>(names.size()) < keys) {
          std::string name(kMultikeyNameBytes, 'a');
          for (char& c : name) c = static_cast<char>('a' + rng.Below(26));
          if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
        }
        sentence = ToTokens(MultikeySentence(names[0], key));
        ending = ToTokens(MultikeyQuestion(names[0]) + key);
        for (int k = 1; k < keys; ++k) {
          const auto at = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(n_filler) + 1));
          distractors.emplace_back(at, ToTokens(MultikeySentence(names[k], draw_key())));
        }
      }
      const auto begin = filler->begin() + s * n_filler;
      for (size_t k = 0; k < depths.size(); ++k) {
        const auto at =
            static_cast<int64_t>(std::floor(depths[k] * static_cast<double>(n_filler) + 0.5));
        // Every sentence at its position in the filler, the key asked for first where two meet.
        std::vector<std::pair<int64_t, const std::vector<int64_t>*>> needles = {{at, &sentence}};
        for (const auto& [where, text] : distractors) needles.emplace_back(where, &text);
        std::stable_sort(needles.begin(), needles.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
        std::vector<int64_t> row;
        row.reserve(static_cast<size_t>(len));
        if (bos) row.push_back(d.bos_token());
        int64_t done = 0;
        for (const auto& [where, text] : needles) {
          row.insert(row.end(), begin + done, begin + where);
          row.insert(row.end(), text->begin(), text->end());
          done = where;
        }
        row.insert(row.end(), begin + done, begin + n_filler);
        row.insert(row.end(), ending.begin(), ending.end());
        const int64_t r = static_cast<int64_t>(k) * samples + s;
        for (int64_t i = 0; i < len; ++i) t[r][i] = row[static_cast<size_t>(i)];
      }
    }
    // Positions L-D-1 .. L-2 predict the key's digits L-D .. L-1.
    const int64_t from = len - digits - 1, to = len - 1;
    double digit_hits = 0, exact = 0;
    ForEachCall(
        model, config, tokens, YarnAt(config.model(), len), device,
        [&](int64_t first, const torch::Tensor& logits) {
          const torch::Tensor targets =
              tokens.slice(0, first, first + logits.size(0)).slice(1, from + 1, to + 1).to(device);
          const torch::Tensor scored = logits.slice(1, from, to);
          const torch::Tensor row_hits = TieSharedHits(scored, targets);
          const torch::Tensor row_exact = scored.argmax(-1).eq(targets).all(-1);
          digit_hits += row_hits.sum().item<double>();
          exact += row_exact.sum().item<double>();
          AddItems(items, absl::StrCat(task.task(), "@", len), row_hits.mean(1));  // per sequence
          AddItems(items, absl::StrCat(task.task(), "_exact@", len), row_exact);
        });
    Put(out, absl::StrCat(task.task(), "@", len), digit_hits / static_cast<double>(rows * digits));
    Put(out, absl::StrCat(task.task(), "_exact@", len), exact / static_cast<double>(rows));
  }
  return absl::OkStatus();
}

// ---- mqar --------------------------------------------------------------------------------------
//
// [BOS] k1 v1 ... kP vP, then Q of the keys in a random order, each followed by its value: keys
// distinct from the lower half of the usable ids, values distinct from the upper half (Zoology's
// generator). Scored: the value predicted at each queried key. Unlike `ablate data synth mqar`,
// queries follow the pairs back to back with no filler between them: the evaluation measures
// recall, and a fixed layout keeps every item the same length.

void Mqar(const LogitsFn& model, const RunConfig& config, const EvalTask& task,
          torch::Device device, Metrics* out, Items* items) {
  const DataConfig& d = config.train().data();
  const int64_t bos = d.has_bos_token() ? 1 : 0;
  const int64_t samples = EvalSamples(task);
  const int64_t pairs = MqarPairs(task), queries = MqarQueries(task);
  const TokenIdSet key_ids = MqarKeyIds(config), value_ids = MqarValueIds(config);
  Rng rng(task.seed(), kMqarStream, static_cast<uint64_t>(pairs), static_cast<uint64_t>(queries));
  // `pairs` distinct ids of `set`, in draw order: rejection, cheap since pairs <= set.size().
  const auto distinct = [&](const TokenIdSet& set) {
    std::vector<int64_t> drawn;
    std::unordered_set<int64_t> used;
    while (static_cast<int64_t>(drawn.size()) < pairs) {
      const int64_t id = set.at(static_cast<int64_t>(rng.Below(static_cast<uint64_t>(set.size()))));
      if (used.insert(id).second) drawn.push_back(id);
    }
    return drawn;
  };
  const int64_t total = bos + 2 * pairs + 2 * queries;
  torch::Tensor tokens = torch::empty({samples, total}, torch::kLong);
  auto t = tokens.accessor<int64_t, 2>();
  for (int64_t r = 0; r < samples; ++r) {
    const std::vector<int64_t> keys = distinct(key_ids);
    const std::vector<int64_t> values = distinct(value_ids);
    int64_t at = 0;
    if (bos) t[r][at++] = d.bos_token();
    for (int64_t i = 0; i < pairs; ++i) {
      t[r][at++] = keys[static_cast<size_t>(i)];
      t[r][at++] = values[static_cast<size_t>(i)];
    }
    // Which pairs are queried, in which order: a Fisher-Yates prefix.
    std::vector<int64_t> order(static_cast<size_t>(pairs));
    for (int64_t i = 0; i < pairs; ++i) order[static_cast<size_t>(i)] = i;
    for (int64_t q = 0; q < queries; ++q) {
      const int64_t j = q + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(pairs - q)));
      std::swap(order[static_cast<size_t>(q)], order[static_cast<size_t>(j)]);
      t[r][at++] = keys[static_cast<size_t>(order[static_cast<size_t>(q)])];
      t[r][at++] = values[static_cast<size_t>(order[static_cast<size_t>(q)])];
    }
  }
  // The queried keys sit at bos + 2P + 2q; their values one position later.
  const torch::Tensor key_positions =
      torch::arange(bos + 2 * pairs, total, 2, torch::kLong).to(device);
  double hits = 0;
  ForEachCall(
      model, config, tokens, YarnAt(config.model(), total), device,
      [&](int64_t first, const torch::Tensor& logits) {
        const torch::Tensor rows = tokens.slice(0, first, first + logits.size(0)).to(device);
        const torch::Tensor targets = rows.index_select(1, key_positions + 1);
        const torch::Tensor query_hits =
            TieSharedHits(logits.index_select(1, key_positions), targets);
        hits += query_hits.sum().item<double>();
        AddItems(items, absl::StrCat("mqar@", pairs), query_hits);  // per query
      });
  Put(out, absl::StrCat("mqar@", pairs), hits / static_cast<double>(samples * queries));
}

// ---- multiple_choice ---------------------------------------------------------------------------
//
// lm-evaluation-harness's loglikelihood scoring: each choice's continuation (target_delimiter +
// the choice) after [BOS] + the context, its tokens' log-probabilities summed; the context cut
// from its start where the sequence would pass model.max_seq_len, as the harness truncates.
// Scored per document: NAME, the choice of the highest sum is the right one; NAME@acc_norm, the
// same with each sum divided by the choice's length in bytes; NAME@logprob, the right choice's
// sum. A tie at the maximum is shared (1/k when the right one is among k), as TieSharedHits.

// The task's items, its file read again and held to the fingerprint the run was keyed by.
absl::StatusOr<ChoiceTask> LoadChoiceItems(int index, const EvalTask& task) {
  absl::StatusOr<ChoiceTask> loaded = LoadChoiceTask(task.file(), task.samples());
  if (!loaded.ok()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat(TaskName(index, task), ": ", loaded.status().message()));
  }
  if (loaded->items.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(TaskName(index, task), ": ", task.file(), " gives no documents to score"));
  }
  if (!task.fingerprint().empty() && loaded->fingerprint != task.fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        TaskName(index, task), ": ", task.file(), " or its data changed since the run was keyed (",
        "fingerprint ", task.fingerprint(), ", now ", loaded->fingerprint,
        "): submit the sweep again to evaluate the new version"));
  }
  return loaded;
}

// A document's score among its choices' values: 1 when the right one is the unique maximum,
// 1/k when it is one of k equal maxima, else 0.
double ChoiceHit(const std::vector<double>& values, int gold) {
  const double best = *std::max_element(values.begin(), values.end());
  if (!(values[static_cast<size_t>(gold)] >= best)) return 0;
  const auto ties = std::count(values.begin(), values.end(), best);
  return 1.0 / static_cast<double>(ties);
}

absl::Status MultipleChoice(const LogitsFn& model, const RunConfig& config, int index,
                            const EvalTask& task, torch::Device device, Metrics* out,
                            Items* items) {
  absl::StatusOr<ChoiceTask> loaded = LoadChoiceItems(index, task);
  if (!loaded.ok()) return loaded.status();
  const DataConfig& d = config.train().data();
  const int64_t max_len = config.model().max_seq_len();
  // One request per (document, choice): its tokens and where its continuation starts.
  struct Request {
    size_t item, choice;
    std::vector<int64_t> tokens;
    int64_t from = 0;  // the continuation's first token
    double logprob = 0;
  };
  std::vector<Request> requests;
  for (size_t i = 0; i < loaded->items.size(); ++i) {
    const ChoiceItem& item = loaded->items[i];
    const std::vector<int64_t> context = ToTokens(item.context);
    for (size_t c = 0; c < item.choices.size(); ++c) {
      const std::vector<int64_t> continuation =
          ToTokens(loaded->target_delimiter + item.choices[c]);
      if (static_cast<int64_t>(continuation.size()) + 1 > max_len) {
        return absl::InvalidArgumentError(
            absl::StrCat(TaskName(index, task), ": document ", i, " of ", task.file(), ": choice ",
                         c, " is ", continuation.size(),
                         " tokens, which with one token of context must fit "
                         "model.max_seq_len ",
                         max_len));
      }
      Request r{i, c, {}, 0, 0};
      if (d.has_bos_token()) r.tokens.push_back(d.bos_token());
      r.tokens.insert(r.tokens.end(), context.begin(), context.end());
      r.tokens.insert(r.tokens.end(), continuation.begin(), continuation.end());
      const int64_t excess = static_cast<int64_t>(r.tokens.size()) - max_len;
      if (excess > 0) r.tokens.erase(r.tokens.begin(), r.tokens.begin() + excess);
      r.from = static_cast<int64_t>(r.tokens.size() - continuation.size());
      requests.push_back(std::move(r));
    }
  }
  // Batched by length (shortest first, each batch padded to its longest: the padding comes after
  // every scored token, so a causal model's scores do not see it), and by YaRN.
  std::vector<size_t> order(requests.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto yarn_of = [&](size_t r) {
    return YarnAt(config.model(), static_cast<int64_t>(requests[r].tokens.size()));
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::make_pair(yarn_of(a), requests[a].tokens.size()) <
           std::make_pair(yarn_of(b), requests[b].tokens.size());
  });
  const int64_t per_batch = std::max<int64_t>(1, config.train().batch_size());
  for (size_t first = 0; first < order.size();) {
    size_t end = first;
    const bool yarn = yarn_of(order[first]);
    while (end < order.size() && static_cast<int64_t>(end - first) < per_batch &&
           yarn_of(order[end]) == yarn) {
      ++end;
    }
    const int64_t len = static_cast<int64_t>(requests[order[end - 1]].tokens.size());
    torch::Tensor tokens = torch::zeros({static_cast<int64_t>(end - first), len}, torch::kLong);
    auto t = tokens.accessor<int64_t, 2>();
    for (size_t k = first; k < end; ++k) {
      const std::vector<int64_t>& row = requests[order[k]].tokens;
      for (size_t j = 0; j < row.size(); ++j) t[static_cast<int64_t>(k - first)][j] = row[j];
    }
    ForEachCall(model, config, tokens, yarn, device,
                [&](int64_t row0, const torch::Tensor& logits) {
                  const torch::Tensor logp = torch::log_softmax(logits, -1).cpu();
                  auto lp = logp.accessor<float, 3>();
                  for (int64_t r = 0; r < logits.size(0); ++r) {
                    Request& q = requests[order[first + static_cast<size_t>(row0 + r)]];
                    double sum = 0;
                    for (int64_t p = q.from; p < static_cast<int64_t>(q.tokens.size()); ++p) {
                      sum += lp[r][p - 1][q.tokens[static_cast<size_t>(p)]];
                    }
                    q.logprob = sum;
                  }
                });
    first = end;
  }
  std::vector<std::vector<double>> sums(loaded->items.size());
  for (const Request& r : requests) {
    std::vector<double>& s = sums[r.item];
    if (s.size() <= r.choice) s.resize(r.choice + 1);
    s[r.choice] = r.logprob;
  }
  const std::vector<std::string> names = ChoiceMetricNames(loaded->name);  // acc, norm, logprob
  std::vector<float>& acc = (*items)[names[0]];
  std::vector<float>& norm = (*items)[names[1]];
  std::vector<float>& logprob = (*items)[names[2]];
  double acc_sum = 0, norm_sum = 0, logprob_sum = 0;
  for (size_t i = 0; i < loaded->items.size(); ++i) {
    const ChoiceItem& item = loaded->items[i];
    std::vector<double> normalised = sums[i];
    for (size_t c = 0; c < normalised.size(); ++c) {
      normalised[c] /= static_cast<double>(std::max<size_t>(1, item.choices[c].size()));
    }
    const double a = ChoiceHit(sums[i], item.gold), n = ChoiceHit(normalised, item.gold);
    const double lp = sums[i][static_cast<size_t>(item.gold)];
    acc.push_back(static_cast<float>(a));
    norm.push_back(static_cast<float>(n));
    logprob.push_back(static_cast<float>(lp));
    acc_sum += a;
    norm_sum += n;
    logprob_sum += lp;
  }
  const auto count = static_cast<double>(std::max<size_t>(1, loaded->items.size()));
  Put(out, names[0], acc_sum / count);
  Put(out, names[1], norm_sum / count);
  Put(out, names[2], logprob_sum / count);
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckEvalTasksData(const TokenData& data, const RunConfig& config) {
  const TrainConfig& train = config.train();
  for (int i = 0; i < train.evals_size(); ++i) {
    const EvalTask& task = train.evals(i);
    if (task.task() == kPasskeyTask || task.task() == kMultikeyTask) {
      if (absl::Status s = CheckByteLevel(i, task, config); !s.ok()) return s;
      if (data.val_tokens() < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            TaskName(i, task), ": the filler is read from the validation split, which holds ",
            data.val_tokens(), " tokens in ", data.source()));
      }
    }
    if (task.task() == kMultipleChoiceTask) {
      if (absl::Status s = CheckByteLevel(i, task, config); !s.ok()) return s;
      if (absl::StatusOr<ChoiceTask> loaded = LoadChoiceItems(i, task); !loaded.ok()) {
        return loaded.status();
      }
    }
    if (task.task() == kPositionLossTask && task.bins_size() > 0) {
      const int64_t len = task.bins(task.bins_size() - 1);
      const int64_t span = EvalSamples(task) * len;
      if (data.val_tokens() < span + 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            TaskName(i, task), ": samples x the last bin edge (", EvalSamples(task), " x ", len,
            " = ", span, " tokens) are read from the validation split, which needs ", span + 1,
            " validation tokens; ", data.source(), " holds ", data.val_tokens(),
            " (fewer samples, or a larger val_fraction)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalTaskResults> RunEvalTasks(const LogitsFn& model, const TokenData& data,
                                             const RunConfig& config, torch::Device device) {
  EvalTaskResults results;
  Metrics& out = results.metrics;
  Items* items = &results.items;
  if (config.train().evals_size() == 0) return results;
  if (absl::Status s = ValidateEvalTasks(config); !s.ok()) return s;
  if (absl::Status s = CheckEvalTasksData(data, config); !s.ok()) return s;
  torch::NoGradGuard no_grad;
  for (int i = 0; i < config.train().evals_size(); ++i) {
    const EvalTask& task = config.train().evals(i);
    if (task.task() == kPositionLossTask) {
      PositionLoss(model, data, config, task, device, &out);
    } else if (task.task() == kCopyingTask) {
      Copying(model, config, task, device, &out, items);
    } else if (task.task() == kPasskeyTask || task.task() == kMultikeyTask) {
      absl::Status s = Passkey(model, data, config, i, task, device, &out, items);
      if (!s.ok()) return s;
    } else if (task.task() == kMqarTask) {
      Mqar(model, config, task, device, &out, items);
    } else if (task.task() == kMultipleChoiceTask) {
      absl::Status s = MultipleChoice(model, config, i, task, device, &out, items);
      if (!s.ok()) return s;
    }
  }
  return results;
}

}  // namespace ablate
