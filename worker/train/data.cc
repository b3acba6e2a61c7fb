#include "worker/train/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/token_files.h"
#include "config/data_source.h"

namespace ablate {

namespace fs = std::filesystem;

std::vector<std::string> DefaultCorpusCandidates(const std::string& exe, const char* data_dir) {
  constexpr char kFile[] = "kjv.txt";
  if (data_dir != nullptr && *data_dir != 0) return {(fs::path(data_dir) / kFile).string()};
  std::vector<std::string> candidates;
  if (!exe.empty()) {
    const fs::path bin = fs::path(exe).parent_path();
    candidates.push_back((bin / ".." / "share" / "ablate" / kFile).lexically_normal().string());
    candidates.push_back((bin / ".." / "data" / kFile).lexically_normal().string());
  }
#ifdef ABLATE_SOURCE_DATA_DIR
  candidates.push_back((fs::path(ABLATE_SOURCE_DATA_DIR) / kFile).string());
#endif
  candidates.push_back((fs::path("data") / kFile).string());
  return candidates;
}

std::string DefaultCorpusPath() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (const std::string& path :
       DefaultCorpusCandidates(ec ? "" : exe.string(), std::getenv("ABLATE_DATA_DIR"))) {
    if (fs::exists(path, ec)) return path;
  }
  return "";
}

namespace {

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open for reading"));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat(path.string(), ": read error"));
  return bytes;
}

// A 64-bit mix (splitmix64's finaliser): decorrelates (seed, split, index) into an RNG seed.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

TokenArray TokenArray::OfBytes(std::string bytes) {
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  TokenArray a;
  a.data_ = reinterpret_cast<const uint8_t*>(owned->data());
  a.size_ = static_cast<int64_t>(owned->size());
  a.width_ = 1;
  a.owner_ = std::move(owned);
  return a;
}

absl::StatusOr<TokenArray> TokenArray::Map(const std::string& path, int width, int64_t offset) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open for reading: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": cannot stat: ", std::strerror(e)));
  }
  const auto bytes = static_cast<int64_t>(st.st_size);
  if (offset > bytes || (bytes - offset) % width != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", bytes - offset, " bytes",
                     offset > 0 ? absl::StrCat(" after byte ", offset) : "",
                     " is not a whole number of uint", width * 8, " tokens"));
  }
  TokenArray a;
  a.width_ = width;
  a.size_ = (bytes - offset) / width;
  if (bytes > 0) {
    void* mapped = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);  // the mapping keeps the file
    if (mapped == MAP_FAILED) {
      return absl::DataLossError(absl::StrCat(path, ": cannot map: ", std::strerror(e)));
    }
    a.data_ = static_cast<const uint8_t*>(mapped) + offset;
    a.owner_ = std::shared_ptr<const void>(
        mapped, [bytes](const void* p) { ::munmap(const_cast<void*>(p), static_cast<size_t>(bytes)); });
  } else {
    ::close(fd);
  }
  return a;
}

TokenArray TokenArray::Slice(int64_t begin, int64_t end) const {
  TokenArray a = *this;
  a.data_ = data_ + begin * width_;
  a.size_ = end - begin;
  return a;
}

int64_t TokenArray::FirstOutside(int64_t vocab_size) const {
  const auto scan = [&](const auto* p) -> int64_t {
    for (int64_t i = 0; i < size_; ++i) {
      if (static_cast<int64_t>(p[i]) >= vocab_size) return i;
    }
    return -1;
  };
  switch (width_) {
    case 1: return scan(data_);
    case 2: return scan(reinterpret_cast<const uint16_t*>(data_));
    default: return scan(reinterpret_cast<const uint32_t*>(data_));
  }
}

namespace {

using Segment = TokenData::Segment;
using SplitTokens = TokenData::SplitTokens;

// Document starts of `tokens`: 0 and every offset right after an `eod` (one pass).
std::vector<int64_t> StartsAfter(const TokenArray& tokens, int64_t eod) {
  std::vector<int64_t> starts = {0};
  for (int64_t i = 0; i + 1 < tokens.size(); ++i) {
    if (tokens[i] == eod) starts.push_back(i + 1);
  }
  return starts;
}

// Tokens [begin, end) of a segment, its document starts re-based.
Segment Cut(const Segment& s, int64_t begin, int64_t end) {
  Segment out;
  out.tokens = s.tokens.Slice(begin, end);
  for (const int64_t start : s.starts) {
    if (start >= begin && start < end) out.starts.push_back(start - begin);
  }
  return out;
}

void Add(Segment segment, bool documents, SplitTokens* split) {
  split->tokens += segment.tokens.size();
  if (documents) split->documents += static_cast<int64_t>(segment.starts.size());
  split->segments.push_back(std::move(segment));
}

// The last `fraction` of `all`'s tokens held out: the cut moved on to the next document start
// where documents are known, so no document is in both splits.
void HoldOut(std::vector<Segment> all, double fraction, bool documents, SplitTokens* train,
             SplitTokens* val) {
  int64_t total = 0;
  for (const Segment& s : all) total += s.tokens.size();
  int64_t cut = total - static_cast<int64_t>(static_cast<double>(total) * fraction);
  for (Segment& s : all) {
    const int64_t n = s.tokens.size();
    if (cut >= n) {
      Add(std::move(s), documents, train);
    } else if (cut <= 0) {
      Add(std::move(s), documents, val);
    } else {
      int64_t at = cut;
      if (documents) {
        const auto next = std::lower_bound(s.starts.begin(), s.starts.end(), cut);
        if (next != s.starts.end()) at = *next;
      }
      Add(Cut(s, 0, at), documents, train);
      if (at < n) Add(Cut(s, at, n), documents, val);
    }
    cut -= n;
  }
}

// Every id of `tokens` below the vocabulary; the error names the file and the offset.
absl::Status CheckIds(const TokenArray& tokens, const std::string& file, int64_t header_bytes,
                      int64_t vocab_size, const std::string& hint) {
  if (const int64_t bad = tokens.FirstOutside(vocab_size); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": token ", tokens[bad], " at token offset ", bad, " (byte ",
                     header_bytes + bad * tokens.width(),
                     ") is outside the vocabulary (model.vocab_size = ", vocab_size, ")", hint));
  }
  return absl::OkStatus();
}

// A Megatron dataset mapped, its documents' starts from its index.
absl::StatusOr<Segment> MapMegatron(const std::string& prefix, int64_t vocab_size) {
  absl::StatusOr<MegatronIndex> index = ReadMegatronIndex(prefix);
  if (!index.ok()) return index.status();
  absl::StatusOr<TokenArray> tokens = TokenArray::Map(prefix + ".bin", index->token_bytes);
  if (!tokens.ok()) return tokens.status();
  if (absl::Status s = CheckIds(*tokens, prefix + ".bin", 0, vocab_size, ""); !s.ok()) return s;
  Segment segment;
  segment.tokens = *std::move(tokens);
  for (size_t d = 0; d + 1 < index->documents.size(); ++d) {
    const int64_t first = index->documents[d];
    if (first < static_cast<int64_t>(index->pointers.size())) {
      segment.starts.push_back(index->pointers[first] / index->token_bytes);
    }
  }
  if (segment.starts.empty() || segment.starts.front() != 0)
    segment.starts.insert(segment.starts.begin(), 0);
  return segment;
}

}  // namespace

absl::StatusOr<TokenData> TokenData::Load(const DataConfig& config, int64_t vocab_size,
                                          int64_t seq_len) {
  TokenData data;
  data.seed_ = config.data_seed();
  data.seq_len_ = seq_len;
  data.doc_aligned_ = config.doc_aligned();
  const fs::path path = config.path().empty() ? fs::path(DefaultCorpusPath()) : fs::path(config.path());
  std::error_code ec;
  if (path.empty()) {
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    return absl::NotFoundError(absl::StrCat(
        "the default corpus kjv.txt is not in any of ",
        absl::StrJoin(DefaultCorpusCandidates(ec ? "" : exe.string(), std::getenv("ABLATE_DATA_DIR")),
                      ", "),
        ": run `make data` in the repository, `make install`, or set ABLATE_DATA_DIR (or give "
        "train.data.path)"));
  }
  absl::StatusOr<DataSource> source =
      ResolveDataSource(config, path.string(), !config.fingerprint().empty());
  if (!source.ok()) return source.status();
  if (!config.fingerprint().empty() && source->fingerprint != config.fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path.string(), ": the data changed after the sweep was expanded (its fingerprint was ",
        config.fingerprint(), ", it is now ", source->fingerprint,
        "): submit the sweep again to train on the new data, under new run keys"));
  }
  int64_t eod = config.has_eod_token() ? config.eod_token() : -1;
  // Documents are known from a Megatron index, or from an end-of-document token.
  bool documents = source->format == DATA_MEGATRON;
  std::vector<Segment> train, val;
  switch (source->format) {
    case DATA_PREPARED:
    case DATA_NANOGPT_BIN: {
      int width = config.token_dtype() == TOKEN_UINT32 ? 4 : 2;
      std::string hint =
          width == 2 ? " (a file of uint32 tokens needs train.data.token_dtype: uint32)" : "";
      if (source->manifest) {
        const DataManifest& m = *source->manifest;
        width = m.token_bytes;
        hint = "";
        if (vocab_size < m.vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrCat("model.vocab_size: ", vocab_size, " is smaller than the vocabulary of ",
                           path.string(), " (", m.vocab_size, ", its manifest.json)"));
        }
        if (!config.has_eod_token()) eod = m.eod_token;
        // Bigram-backcopy (`ablate data synth`) defines query classes: its trigger tokens.
        if (m.params.value("task", "") == "bigram-backcopy" &&
            m.params.contains("trigger_tokens") && m.params["trigger_tokens"].is_array()) {
          for (const auto& t : m.params["trigger_tokens"]) {
            if (t.is_number_integer()) data.triggers_.push_back(t.get<int32_t>());
          }
        }
      }
      for (const auto& [file, out] :
           {std::pair{source->train[0], &train}, {source->val[0], &val}}) {
        absl::StatusOr<TokenArray> tokens = TokenArray::Map(file, width);
        if (!tokens.ok()) return tokens.status();
        if (absl::Status s = CheckIds(*tokens, file, 0, vocab_size, hint); !s.ok()) return s;
        out->push_back({*std::move(tokens), {}});
      }
      data.source_ = source->manifest ? path.string() : (path / "{train,val}.bin").string();
      break;
    }
    case DATA_LLMC: {
      for (const auto& [files, out] : {std::pair{&source->train, &train}, {&source->val, &val}}) {
        for (const std::string& file : *files) {
          absl::StatusOr<LlmcShard> shard = ReadLlmcHeader(file);
          if (!shard.ok()) return shard.status();
          absl::StatusOr<TokenArray> tokens =
              TokenArray::Map(file, shard->token_bytes, kLlmcHeaderBytes);
          if (!tokens.ok()) return tokens.status();
          if (absl::Status s = CheckIds(*tokens, file, kLlmcHeaderBytes, vocab_size, ""); !s.ok())
            return s;
          out->push_back({*std::move(tokens), {}});
        }
      }
      data.source_ = source->train.size() == 1
                         ? source->train[0]
                         : absl::StrCat(path.string(), " (", source->train.size(), " shards)");
      break;
    }
    case DATA_MEGATRON: {
      for (const auto& [prefixes, out] :
           {std::pair{&source->train, &train}, {&source->val, &val}}) {
        for (const std::string& prefix : *prefixes) {
          absl::StatusOr<Segment> segment = MapMegatron(prefix, vocab_size);
          if (!segment.ok()) return segment.status();
          out->push_back(*std::move(segment));
        }
      }
      data.source_ = source->train[0];
      break;
    }
    default: {  // DATA_TEXT
      if (vocab_size < 256) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.vocab_size: byte-level text needs >= 256, got ", vocab_size));
      }
      std::string all;
      for (const std::string& f : source->train) {
        absl::StatusOr<std::string> bytes = ReadFile(f);
        if (!bytes.ok()) return bytes.status();
        all += *bytes;
      }
      train.push_back({TokenArray::OfBytes(std::move(all)), {}});
      data.source_ = source->train.size() == 1
                         ? source->train[0]
                         : absl::StrCat(path.string(), " (", source->train.size(), " files)");
    }
  }
  if (eod >= 0) {
    documents = true;
    for (auto* segments : {&train, &val}) {
      for (Segment& s : *segments) {
        if (s.starts.empty()) s.starts = StartsAfter(s.tokens, eod);
      }
    }
  }
  if (val.empty()) {
    // One set of files: its last val_fraction is held out, contiguous (at a document start where
    // documents are known), so no window straddles the two.
    HoldOut(std::move(train), config.val_fraction(), documents, &data.train_, &data.val_);
  } else {
    for (Segment& s : train) Add(std::move(s), documents, &data.train_);
    for (Segment& s : val) Add(std::move(s), documents, &data.val_);
  }
  if (data.doc_aligned_ && !documents) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.data.doc_aligned: ", data.source_,
        " has no documents ablate knows: give train.data.eod_token, or use a prepared directory "
        "or a Megatron dataset"));
  }
  if (config.has_bos_token()) {
    if (config.bos_token() < 0 || config.bos_token() >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("train.data.bos_token: ", config.bos_token(),
                                                     " is outside the vocabulary [0, ",
                                                     vocab_size, ")"));
    }
    data.bos_ = config.bos_token();
  }
  for (const auto& [name, split] : {std::pair{"train", &data.train_}, {"validation", &data.val_}}) {
    int64_t longest = 0;
    bool aligned_window = false;
    for (const Segment& s : split->segments) {
      longest = std::max(longest, s.tokens.size());
      for (const int64_t start : s.starts) {
        if (start + seq_len + 1 <= s.tokens.size()) aligned_window = true;
      }
    }
    if (longest < seq_len + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          data.source_, ": the ", name, " split has ", split->tokens,
          split->segments.size() > 1 ? " tokens in files each" : " tokens",
          " fewer than train.seq_len + 1 = ", seq_len + 1, split->tokens == 0 ? " (empty)" : ""));
    }
    if (data.doc_aligned_ && !aligned_window) {
      return absl::InvalidArgumentError(absl::StrCat(
          data.source_, ": no document of the ", name, " split starts seq_len + 1 = ", seq_len + 1,
          " tokens before the end of its file: doc_aligned has no window to draw"));
    }
  }
  return data;
}

void TokenData::Batch(Split split, int64_t index, int64_t batch_size, int64_t* inputs,
                      int64_t* targets) const {
  Batch(split, index, batch_size, seq_len_, inputs, targets);
}

void TokenData::Window(const TokenArray& tokens, int64_t start, int64_t len,
                       int64_t* in, int64_t* out) const {
  if (bos_ >= 0) {
    in[0] = bos_;
    for (int64_t t = 1; t < len; ++t) in[t] = tokens[start + t - 1];
    for (int64_t t = 0; t < len; ++t) out[t] = tokens[start + t];
    return;
  }
  for (int64_t t = 0; t < len; ++t) {
    in[t] = tokens[start + t];
    out[t] = tokens[start + t + 1];
  }
}

void TokenData::Batch(Split split, int64_t index, int64_t batch_size, int64_t len,
                      int64_t* inputs, int64_t* targets) const {
  const SplitTokens& tokens = split == Split::kTrain ? train_ : val_;
  const uint64_t salt = split == Split::kTrain ? 0x7261696eULL : 0x76616c00ULL;
  std::mt19937_64 rng(Mix(seed_ ^ Mix(salt ^ Mix(static_cast<uint64_t>(index)))));
  // The windows each file can start: any offset with len + 1 tokens from it, or (doc_aligned)
  // any document start with them. One draw over all files, so each window is equally likely
  // (a single file draws as it always has: an offset in [0, size - len - 1]).
  bool aligned = doc_aligned_;
  std::vector<int64_t> cumulative;
  int64_t total = 0;
  for (int pass = 0; pass < 2 && total == 0; ++pass) {
    cumulative.clear();
    for (const Segment& s : tokens.segments) {
      const int64_t last = s.tokens.size() - len - 1;  // the last start with a whole window
      int64_t n = 0;
      if (last >= 0) {
        n = aligned ? std::upper_bound(s.starts.begin(), s.starts.end(), last) - s.starts.begin()
                    : last + 1;
      }
      total += n;
      cumulative.push_back(total);
    }
    if (total == 0) aligned = false;  // a length longer than any document's room (an eval length)
  }
  std::uniform_int_distribution<int64_t> draw(0, total - 1);
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t g = draw(rng);
    const size_t k = std::upper_bound(cumulative.begin(), cumulative.end(), g) - cumulative.begin();
    const int64_t local = g - (k == 0 ? 0 : cumulative[k - 1]);
    const Segment& s = tokens.segments[k];
    Window(s.tokens, aligned ? s.starts[local] : local, len, inputs + b * len, targets + b * len);
  }
}

void TokenData::Consecutive(Split split, int64_t count, int64_t len, int64_t* inputs,
                            int64_t* targets) const {
  const SplitTokens& tokens = split == Split::kTrain ? train_ : val_;
  size_t segment = 0;
  int64_t at = 0;
  for (int64_t w = 0; w < count; ++w) {
    // On to the next file (or back to the first) when this one has no whole window left.
    for (size_t tries = 0;
         at + len + 1 > tokens.segments[segment].tokens.size() && tries <= tokens.segments.size();
         ++tries) {
      segment = (segment + 1) % tokens.segments.size();
      at = 0;
    }
    Window(tokens.segments[segment].tokens, at, len, inputs + w * len, targets + w * len);
    at += len;
  }
}

}  // namespace ablate
