#include "orchestrator/data/prepare.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "orchestrator/data/prepared_writer.h"
#include "orchestrator/data/sentencepiece_tokenizer.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Split = PreparedWriter::Split;

// Bytes read from a file at a time.
constexpr size_t kReadBlock = 4 << 20;
// A line longer than this reaches the document splitter in segments of at most this size (cut at
// a UTF-8 character boundary), so one enormous line never has to fit in memory.
constexpr size_t kMaxSegment = 1 << 20;
// A document is handed to the encoder in pieces of whole lines of about this size: a single huge
// file costs memory for a few pieces, not for the file. The encoder then encodes each line (with
// its newline) on its own. Our trained models never learn a piece that spans a newline (their
// training sentences end at one), so this gives the same tokens as the document encoded whole;
// for a model given with --tokenizer FILE it is what spm_encode does (one line at a time).
constexpr size_t kPieceBytes = 1 << 20;
// Text handed to one encoding thread at a time: large enough that the hand-off costs nothing,
// small enough that `threads` of them, twice over, are a few MB.
constexpr size_t kBatchBytes = 256 << 10;
// Training sentences longer than this are cut (at a character boundary): SentencePiece skips a
// sentence over its max_sentence_length (4192 bytes by default), and the reservoir's memory is
// then at most max_sentences times this.
constexpr size_t kMaxSentenceBytes = 4096;

// The bytes tokenizer: ids 0-255 are the bytes, then the two special tokens.
constexpr int64_t kBytesEod = 256;
constexpr int64_t kBytesBos = 257;
constexpr int64_t kBytesVocab = 258;

enum class TokenizerKind { kBytes, kBpe, kUnigram, kModel };
enum class DocMode { kFile, kLine, kBlank };

const char* KindName(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::kBytes:
      return "bytes";
    case TokenizerKind::kBpe:
      return "bpe";
    case TokenizerKind::kUnigram:
      return "unigram";
    case TokenizerKind::kModel:
      return "model";
  }
  return "";
}

// ---- Inputs ------------------------------------------------------------------------------------

struct InputFile {
  std::string path;  // as given, or the given directory joined with the path below it
  int64_t bytes = 0;
  bool jsonl = false;
};

absl::StatusOr<std::vector<InputFile>> ListInputs(const std::vector<std::string>& inputs) {
  std::vector<InputFile> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const fs::file_status status = fs::status(input, ec);
    if (!fs::exists(status)) {
      return absl::NotFoundError(absl::StrCat("input ", input, ": no such file or directory"));
    }
    std::vector<std::string> paths;
    if (fs::is_directory(status)) {
      fs::recursive_directory_iterator it(input, ec);
      for (const fs::recursive_directory_iterator end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (absl::StartsWith(name, ".")) {  // hidden: .git, editor swap files, partial outputs
          if (it->is_directory(ec)) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file(ec)) paths.push_back(it->path().string());
      }
      if (ec)
        return absl::InvalidArgumentError(absl::StrCat("cannot list ", input, ": ", ec.message()));
      std::sort(paths.begin(), paths.end());
    } else if (fs::is_regular_file(status)) {
      paths.push_back(input);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", input, " is neither a regular file nor a directory"));
    }
    for (std::string& path : paths) {
      InputFile file;
      file.bytes = static_cast<int64_t>(fs::file_size(path, ec));
      if (ec) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ec.message()));
      file.jsonl = absl::EndsWith(path, ".jsonl");
      file.path = std::move(path);
      files.push_back(std::move(file));
    }
  }
  return files;
}

// ---- UTF-8 -------------------------------------------------------------------------------------

// The length of the valid UTF-8 character at p[0..n), or minus the length of the longest prefix
// of one (at least 1) when it is not valid: the "maximal subpart" that Unicode (ch. 3, U+FFFD
// substitution) replaces with one U+FFFD. Overlong forms, surrogates and code points above
// U+10FFFF are invalid.
int Utf8Char(const unsigned char* p, size_t n) {
  const unsigned c = p[0];
  if (c < 0x80) return 1;
  int len = 0;
  unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c == 0xE0) {
    len = 3, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    len = 3;
  } else if (c == 0xED) {
    len = 3, hi = 0x9F;
  } else if (c == 0xF0) {
    len = 4, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    len = 4;
  } else if (c == 0xF4) {
    len = 4, hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= n) return -k;
    const unsigned b = p[k];
    if (b < (k == 1 ? lo : 0x80u) || b > (k == 1 ? hi : 0xBFu)) return -k;
  }
  return len;
}

// The offset of the first invalid sequence in `s`, or npos. ASCII runs go 8 bytes at a time.
size_t FindInvalidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const int len = Utf8Char(p + i, n - i);
    if (len < 0) return i;
    i += static_cast<size_t>(len);
  }
  return std::string_view::npos;
}

// `s` with each invalid sequence replaced by U+FFFD, into *out; returns how many were replaced.
int64_t ReplaceInvalidUtf8(std::string_view s, std::string* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  int64_t replaced = 0;
  out->clear();
  out->reserve(s.size() + 16);
  for (size_t i = 0; i < s.size();) {
    const int len = Utf8Char(p + i, s.size() - i);
    if (len > 0) {
      out->append(s.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out->append("\xEF\xBF\xBD");
      ++replaced;
      i += static_cast<size_t>(-len);
    }
  }
  return replaced;
}

// The largest cut <= `at` that does not split a UTF-8 character (backs over at most 3
// continuation bytes; cuts at `at` when the bytes there are not UTF-8 anyway). At least 1.
size_t Utf8Cut(std::string_view s, size_t at) {
  if (at >= s.size()) return s.size();
  size_t cut = at;
  while (cut > 0 && at - cut < 3 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  if (cut == 0 || (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) cut = at;
  return std::max<size_t>(cut, 1);
}

// ---- Progress ----------------------------------------------------------------------------------

// A one-line bar on stderr, redrawn at most 5 times a second: bytes done of total, MB/s, ETA.
// Silent unless enabled (the caller enables it only when stderr is a terminal).
class Progress {
 public:
  Progress(bool enabled, int64_t total) : enabled_(enabled), total_(std::max<int64_t>(total, 1)) {}
  ~Progress() { Clear(); }

  void Start(const std::string& phase) {
    phase_ = phase;
    done_ = 0;
    start_ = last_ = std::chrono::steady_clock::now();
    Draw();
  }
  void Add(int64_t bytes) {
    done_ += bytes;
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    Draw();
  }
  // A line of its own above the bar (training can take a while with no bytes to count).
  void Note(const std::string& text) {
    if (!enabled_) return;
    Clear();
    fmt::print(stderr, "{}\n", text);
  }
  void Clear() {
    if (enabled_ && drawn_) fmt::print(stderr, "\r\x1b[K");
    drawn_ = false;
  }

 private:
  void Draw() {
    if (!enabled_) return;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double mb = done_ / 1e6;
    const double rate = seconds > 0 ? mb / seconds : 0;
    const double frac = std::min(1.0, static_cast<double>(done_) / total_);
    const int width = 24;
    const int filled = static_cast<int>(frac * width);
    std::string eta = "--:--";
    if (rate > 0 && done_ > 0) {
      const int64_t left = static_cast<int64_t>((total_ - done_) / 1e6 / rate);
      eta = fmt::format("{}:{:02}", left / 60, left % 60);
    }
    fmt::print(stderr, "\r{:<9} [{}{}] {:.1f}/{:.1f} MB  {:.1f} MB/s  ETA {}\x1b[K", phase_,
               std::string(filled, '#'), std::string(width - filled, '.'), mb, total_ / 1e6, rate,
               eta);
    drawn_ = true;
  }

  const bool enabled_;
  const int64_t total_;
  std::string phase_;
  int64_t done_ = 0;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

// ---- Reading a file in lines -------------------------------------------------------------------

// A file as segments: each a whole line with its '\n' (the last line may lack one), or, for a
// line over kMaxSegment bytes, consecutive parts of it. Knows the line number and the file offset
// of each segment, for errors. Feeds every byte read to `hash` (when set) and counts them.
class LineReader {
 public:
  LineReader(const std::string& path, Sha256Stream* hash, Progress* progress)
      : path_(path), hash_(hash), progress_(progress) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    } else {
      ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    buffer_.resize(kReadBlock);
  }
  ~LineReader() {
    if (fd_ >= 0) ::close(fd_);
  }

  // The next segment, valid until the next call; false at the end of the file or on an error
  // (status()).
  bool Next(std::string_view* segment) {
    if (!status_.ok()) return false;
    if (ends_line_) ++line_;
    offset_ += static_cast<int64_t>(last_size_);
    while (true) {
      const char* begin = buffer_.data() + start_;
      const size_t available = end_ - start_;
      if (const void* nl = std::memchr(begin + scanned_, '\n', available - scanned_)) {
        const size_t size = static_cast<const char*>(nl) - begin + 1;
        return Emit(segment, size, true);
      }
      scanned_ = available;
      if (available >= kMaxSegment) {
        return Emit(segment, Utf8Cut(std::string_view(begin, available), kMaxSegment), false);
      }
      if (eof_) {
        if (available == 0) return false;
        return Emit(segment, available, true);
      }
      if (!Fill()) return false;
    }
  }

  bool ends_line() const { return ends_line_; }  // the last segment ended its line
  int64_t line() const { return line_; }         // 1-based line of the last segment
  int64_t offset() const { return offset_; }     // file offset of the last segment's first byte
  int64_t bytes_read() const { return bytes_read_; }
  const absl::Status& status() const { return status_; }

 private:
  bool Emit(std::string_view* segment, size_t size, bool ends_line) {
    *segment = std::string_view(buffer_.data() + start_, size);
    start_ += size;
    scanned_ = 0;
    last_size_ = size;
    ends_line_ = ends_line;
    return true;
  }

  // Moves the unconsumed bytes to the front and reads more behind them.
  bool Fill() {
    if (start_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + start_, end_ - start_);
      end_ -= start_;
      start_ = 0;
    }
    while (true) {
      const ssize_t n = ::read(fd_, buffer_.data() + end_, buffer_.size() - end_);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status_ = absl::InvalidArgumentError(absl::StrCat("cannot read ", path_, " at byte ",
                                                          bytes_read_, ": ", std::strerror(errno)));
        return false;
      }
      if (n == 0) {
        eof_ = true;
        return true;
      }
      if (hash_ != nullptr) hash_->Update(buffer_.data() + end_, static_cast<size_t>(n));
      if (progress_ != nullptr) progress_->Add(n);
      end_ += static_cast<size_t>(n);
      bytes_read_ += n;
      return true;
    }
  }

  const std::string path_;
  Sha256Stream* const hash_;
  Progress* const progress_;
  int fd_ = -1;
  absl::Status status_;
  std::vector<char> buffer_;
  size_t start_ = 0, end_ = 0;  // unconsumed bytes: buffer_[start_, end_)
  size_t scanned_ = 0;          // of those, already searched for '\n'
  bool eof_ = false;
  bool ends_line_ = false;
  size_t last_size_ = 0;
  int64_t line_ = 1, offset_ = 0, bytes_read_ = 0;
};

// ---- Documents ---------------------------------------------------------------------------------

// Receives a document in pieces: `last` is true on its final piece (which may be empty).
using PieceSink = std::function<absl::Status(std::string_view text, bool last)>;

// `text` (one whole document) to `sink` in pieces of whole lines of at most ~kPieceBytes.
absl::Status SendInPieces(std::string_view text, const PieceSink& sink) {
  while (text.size() > kPieceBytes) {
    size_t cut = text.rfind('\n', kPieceBytes - 1);
    cut = cut == std::string_view::npos ? Utf8Cut(text, kPieceBytes) : cut + 1;
    if (absl::Status s = sink(text.substr(0, cut), false); !s.ok()) return s;
    text.remove_prefix(cut);
  }
  return sink(text, true);
}

bool IsBlankLine(std::string_view line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

// `line` without its terminator ("\n" or "\r\n").
std::string_view StripNewline(std::string_view line) {
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

// The corpus as documents, the same in both passes: reads each input and sends its documents, in
// pieces, to a sink. Checks UTF-8 on the way (refused with the file, line and offset, or replaced
// and counted).
class CorpusReader {
 public:
  CorpusReader(DocMode mode, std::string field, bool check_utf8, bool replace_utf8)
      : mode_(mode),
        field_(std::move(field)),
        check_utf8_(check_utf8),
        replace_utf8_(replace_utf8) {}

  absl::Status Read(const InputFile& file, Sha256Stream* hash, Progress* progress,
                    const PieceSink& sink) {
    LineReader reader(file.path, hash, progress);
    if (!reader.status().ok()) return reader.status();
    absl::Status status =
        file.jsonl ? ReadJsonl(file, &reader, sink) : ReadText(file, &reader, sink);
    if (!status.ok()) return status;
    if (!reader.status().ok()) return reader.status();
    if (reader.bytes_read() != file.bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path, " changed while it was being prepared (", file.bytes,
                       " bytes, then ", reader.bytes_read(), ")"));
    }
    return absl::OkStatus();
  }

  int64_t replaced() const { return replaced_; }

 private:
  // The segment checked for UTF-8: itself, or a copy with U+FFFD replacements.
  absl::StatusOr<std::string_view> Checked(std::string_view segment, const LineReader& reader,
                                           const std::string& path) {
    if (!check_utf8_) return segment;
    const size_t bad = FindInvalidUtf8(segment);
    if (bad == std::string_view::npos) return segment;
    if (!replace_utf8_) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", reader.line(), ": invalid UTF-8 at byte ",
                       reader.offset() + static_cast<int64_t>(bad),
                       " (--invalid-utf8 replace turns each bad sequence into U+FFFD)"));
    }
    replaced_ += ReplaceInvalidUtf8(segment, &fixed_);
    return std::string_view(fixed_);
  }

  absl::Status ReadText(const InputFile& file, LineReader* reader, const PieceSink& sink) {
    std::string doc;  // the open document's text not yet sent (file and blank modes)
    bool open = false;
    bool at_line_start = true;
    std::string_view raw;
    while (reader->Next(&raw)) {
      absl::StatusOr<std::string_view> checked = Checked(raw, *reader, file.path);
      if (!checked.ok()) return checked.status();
      const std::string_view segment = *checked;
      const bool starts_line = at_line_start;
      const bool ends_line = reader->ends_line();
      at_line_start = ends_line;
      absl::Status status;
      switch (mode_) {
        case DocMode::kFile:
          // Sent in pieces of whole lines: a piece goes once it is large and a new line begins.
          if (starts_line && doc.size() >= kPieceBytes) {
            status = sink(doc, false);
            doc.clear();
          }
          doc.append(segment);
          open = true;
          break;
        case DocMode::kLine: {
          const std::string_view text = ends_line ? StripNewline(segment) : segment;
          if (starts_line && ends_line) {
            if (!text.empty()) status = sink(text, true);
          } else {
            status = sink(text, ends_line);  // a line longer than kMaxSegment, in parts
          }
          break;
        }
        case DocMode::kBlank:
          if (starts_line && ends_line && IsBlankLine(segment)) {
            if (open) status = sink(StripNewline(doc), true);
            doc.clear();
            open = false;
            break;
          }
          // The document goes on: what is held ends with a newline that is not its last.
          if (starts_line && doc.size() >= kPieceBytes) {
            status = sink(doc, false);
            doc.clear();
          }
          doc.append(segment);
          open = true;
          break;
      }
      if (!status.ok()) return status;
    }
    if (!reader->status().ok() || !open) return reader->status();
    // A file's document is its bytes as they are; a paragraph ends without its last newline.
    return sink(mode_ == DocMode::kBlank ? StripNewline(doc) : std::string_view(doc), true);
  }

  absl::Status ReadJsonl(const InputFile& file, LineReader* reader, const PieceSink& sink) {
    std::string line;
    int64_t line_number = 1;
    bool at_line_start = true;
    std::string_view raw;
    while (reader->Next(&raw)) {
      if (at_line_start) line_number = reader->line();
      absl::StatusOr<std::string_view> checked = Checked(raw, *reader, file.path);
      if (!checked.ok()) return checked.status();
      line.append(*checked);  // a JSON line is parsed whole: it must fit in memory
      at_line_start = reader->ends_line();
      if (!at_line_start) continue;
      absl::Status status = JsonlLine(file.path, line_number, line, sink);
      line.clear();
      if (!status.ok()) return status;
    }
    return reader->status();
  }

  absl::Status JsonlLine(const std::string& path, int64_t line_number, const std::string& line,
                         const PieceSink& sink) {
    if (IsBlankLine(line)) return absl::OkStatus();
    const std::string where = absl::StrCat(path, ":", line_number, ": ");
    json object;
    try {
      object = json::parse(line);
    } catch (const json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(where, "not JSON: ", e.what()));
    }
    if (!object.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "a JSON ", object.type_name(), ", not an object (each line of a .jsonl file is ",
          "one object whose \"", field_, "\" field holds a document)"));
    }
    const auto it = object.find(field_);
    if (it == object.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "no field \"", field_, "\" (--field names the field that holds the text)"));
    }
    if (!it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "field \"", field_, "\" is a ", it->type_name(), ", not a string"));
    }
    const std::string& text = it->get_ref<const std::string&>();
    if (text.empty()) return absl::OkStatus();  // an empty document: nothing to train on
    return SendInPieces(text, sink);
  }

  const DocMode mode_;
  const std::string field_;
  const bool check_utf8_, replace_utf8_;
  int64_t replaced_ = 0;
  std::string fixed_;
};

// ---- Sampling and splitting --------------------------------------------------------------------

// A uniform draw from [0, bound), by rejection: the same on every standard library (unlike
// std::uniform_int_distribution), so a seed chooses the same documents everywhere.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  while (true) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

// The tokenizer's training sentences: a uniform reservoir sample (Algorithm R) of at most
// `capacity` lines of the corpus, each with its newline (so the model learns "\n" as text) and
// cut to kMaxSentenceBytes. Blank lines are not sentences.
class SentenceSample {
 public:
  SentenceSample(int64_t capacity, uint64_t seed)
      : capacity_(static_cast<size_t>(capacity)), rng_(seed) {}

  void AddText(std::string_view text) {
    while (!text.empty()) {
      const size_t nl = text.find('\n');
      const size_t size = nl == std::string_view::npos ? text.size() : nl + 1;
      std::string_view line = text.substr(0, size);
      text.remove_prefix(size);
      if (IsBlankLine(line)) continue;
      while (!line.empty()) {
        const size_t cut = Utf8Cut(line, kMaxSentenceBytes);
        Offer(line.substr(0, cut));
        line.remove_prefix(cut);
      }
    }
  }

  const std::vector<std::string>& sentences() const { return sample_; }
  int64_t seen() const { return seen_; }
  void Release() { std::vector<std::string>().swap(sample_); }

 private:
  void Offer(std::string_view sentence) {
    ++seen_;
    if (sample_.size() < capacity_) {
      sample_.emplace_back(sentence);
      return;
    }
    const uint64_t j = UniformBelow(rng_, static_cast<uint64_t>(seen_));
    if (j < capacity_) sample_[j].assign(sentence.data(), sentence.size());
  }

  const size_t capacity_;
  std::mt19937_64 rng_;
  std::vector<std::string> sample_;
  int64_t seen_ = 0;
};

// Which of `n` documents go to val.bin: exactly `count` of them, every subset of that size equally
// likely, drawn with std::mt19937_64(seed) by selection sampling (Knuth's Algorithm S: document i
// is taken with probability (still needed) / (still left)). The same subset a seeded shuffle
// would give in distribution, in one bit per document and no other memory.
std::vector<bool> ChooseValidation(int64_t n, int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<bool> is_val(static_cast<size_t>(n), false);
  int64_t needed = count;
  for (int64_t i = 0; i < n && needed > 0; ++i) {
    if (static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(n - i))) < needed) {
      is_val[static_cast<size_t>(i)] = true;
      --needed;
    }
  }
  return is_val;
}

// ---- Encoding ----------------------------------------------------------------------------------

// Encodes batches of document pieces with SentencePiece on `threads` threads. The caller keeps
// its batches in submission order and waits for the oldest before writing it, so the output is in
// corpus order whichever thread finishes first.
class EncodePool {
 public:
  struct Piece {
    std::string text;
    Split split = Split::kTrain;
    bool last = false;  // ends its document
    std::vector<int> ids;
  };
  struct Batch {
    std::vector<Piece> pieces;
    size_t bytes = 0;
    std::string error;  // set by the worker before `done`
    absl::Notification done;
  };

  EncodePool(const SentencePieceTokenizer* tokenizer, int threads) : tokenizer_(tokenizer) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~EncodePool() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& worker : workers_) worker.join();
  }

  // `batch` must outlive the pool or its `done`.
  void Submit(Batch* batch) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(batch);
  }

 private:
  bool HasWork() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }

  void Work() {
    while (true) {
      Batch* batch = nullptr;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &EncodePool::HasWork));
        if (stop_) return;
        batch = queue_.front();
        queue_.pop_front();
      }
      std::vector<int> line_ids;
      for (Piece& piece : batch->pieces) {
        // Line by line, as spm_encode does: SentencePiece's cost per byte grows with the length
        // of what it is given (a 1 MiB piece encodes at half the speed of its lines, and holds
        // hundreds of MB), and the tokens are the same (see kPieceBytes).
        std::string_view text = piece.text;
        bool ok = true;
        while (ok && !text.empty()) {
          const size_t nl = text.find('\n');
          const size_t size = nl == std::string_view::npos ? text.size() : nl + 1;
          ok = tokenizer_->Encode(text.substr(0, size), &line_ids, &batch->error);
          piece.ids.insert(piece.ids.end(), line_ids.begin(), line_ids.end());
          text.remove_prefix(size);
        }
        if (!ok) break;
        std::string().swap(piece.text);  // the text is no longer needed: keep memory to tokens
      }
      batch->done.Notify();
    }
  }

  const SentencePieceTokenizer* const tokenizer_;
  std::vector<std::thread> workers_;
  absl::Mutex mu_;
  std::deque<Batch*> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open for reading"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  return text.str();
}

// SentencePiece's message without the source location it starts with
// ("./src/trainer_interface.cc(660) [(a) == (b)] Vocabulary size too high ...").
std::string SentencePieceMessage(const std::string& message) {
  if (absl::StartsWith(message, "./") || absl::StartsWith(message, "src/")) {
    const size_t end = message.find("] ");
    if (end != std::string::npos) return message.substr(end + 2);
  }
  return message;
}

}  // namespace

absl::StatusOr<DataManifest> Prepare(const PrepareOptions& options) {
  // ---- Options, checked before anything is read.
  TokenizerKind kind;
  if (options.tokenizer == "bytes") {
    kind = TokenizerKind::kBytes;
  } else if (options.tokenizer == "bpe") {
    kind = TokenizerKind::kBpe;
  } else if (options.tokenizer == "unigram") {
    kind = TokenizerKind::kUnigram;
  } else {
    kind = TokenizerKind::kModel;
    std::error_code ec;
    if (!fs::is_regular_file(options.tokenizer, ec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tokenizer ", options.tokenizer,
          ": no such file (expected bytes, bpe, unigram or a SentencePiece .model file)"));
    }
  }
  const bool train = kind == TokenizerKind::kBpe || kind == TokenizerKind::kUnigram;
  DocMode mode;
  if (options.docs == "file") {
    mode = DocMode::kFile;
  } else if (options.docs == "line") {
    mode = DocMode::kLine;
  } else if (options.docs == "blank") {
    mode = DocMode::kBlank;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--docs ", options.docs, ": expected file, line or blank"));
  }
  if (options.invalid_utf8 != "refuse" && options.invalid_utf8 != "replace") {
    return absl::InvalidArgumentError(
        absl::StrCat("--invalid-utf8 ", options.invalid_utf8, ": expected refuse or replace"));
  }
  if (!(options.val_fraction >= 0 && options.val_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--val-fraction ", options.val_fraction, ": expected a fraction in [0, 1)"));
  }
  if (train && options.vocab_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab-size ", options.vocab_size, ": expected at least 2"));
  }
  if (train && options.max_sentences < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-sentences ", options.max_sentences, ": expected at least 1"));
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads ", options.threads, ": expected at least 1 (0: every core)"));
  }
  // SentencePiece's trainer takes at most 128 threads.
  const int threads =
      std::min(128, options.threads > 0
                        ? options.threads
                        : std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  if (options.out.empty()) return absl::InvalidArgumentError("--out: no output directory given");
  if (options.inputs.empty()) return absl::InvalidArgumentError("no input given");
  std::error_code ec;
  if (!options.force && fs::exists(options.out, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("output directory ", options.out, " already exists (--force replaces it)"));
  }
  absl::StatusOr<std::vector<InputFile>> files = ListInputs(options.inputs);
  if (!files.ok()) return files.status();
  int64_t total_bytes = 0;
  for (const InputFile& file : *files) total_bytes += file.bytes;
  Progress progress(options.progress && ::isatty(STDERR_FILENO), total_bytes);
  // Only SentencePiece needs valid UTF-8; the bytes tokenizer takes any byte.
  const bool check_utf8 = kind != TokenizerKind::kBytes;
  const bool replace_utf8 = options.invalid_utf8 == "replace";

  // ---- Pass 1: hash, check, count documents, sample training sentences.
  CorpusReader pass1(mode, options.field, check_utf8, replace_utf8);
  SentenceSample sample(train ? options.max_sentences : 0, options.seed ^ 0x9e3779b97f4a7c15ull);
  int64_t documents = 0;
  std::vector<InputInfo> inputs;
  progress.Start("reading");
  for (const InputFile& file : *files) {
    Sha256Stream hash;
    const absl::Status status =
        pass1.Read(file, &hash, &progress, [&](std::string_view text, bool last) {
          if (train) sample.AddText(text);
          if (last) ++documents;
          return absl::OkStatus();
        });
    if (!status.ok()) return status;
    inputs.push_back({file.path, file.bytes, hash.Hex()});
  }
  progress.Clear();
  const std::string corpus = options.inputs.size() == 1
                                 ? options.inputs.front()
                                 : absl::StrCat(options.inputs.size(), " inputs");
  if (documents == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "empty corpus: ", corpus, " holds no document (", files->size(),
        " files; empty files, blank lines and JSON Lines with an empty field are not documents)"));
  }
  if (documents < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(corpus,
                     " holds 1 document; a prepared directory needs at least 2, one for each split "
                     "(--docs line or --docs blank splits a text file into several)"));
  }
  const int64_t val_documents =
      std::max<int64_t>(1, std::llround(static_cast<double>(documents) * options.val_fraction));
  if (val_documents >= documents) {
    return absl::InvalidArgumentError(absl::StrCat("--val-fraction ", options.val_fraction, " of ",
                                                   documents,
                                                   " documents leaves none for training"));
  }

  // ---- The tokenizer.
  std::string model;  // the .model file's bytes; empty for bytes
  std::unique_ptr<SentencePieceTokenizer> spm;
  if (kind == TokenizerKind::kModel) {
    absl::StatusOr<std::string> bytes = ReadWholeFile(options.tokenizer);
    if (!bytes.ok()) return bytes.status();
    model = *std::move(bytes);
  } else if (train) {
    progress.Note(fmt::format("training a {}-piece {} tokenizer on {} of {} sentences",
                              options.vocab_size, KindName(kind), sample.sentences().size(),
                              sample.seen()));
    // Chosen so that text round-trips (Decode(Encode(x)) == x) and documents can be encoded in
    // pieces of lines, as Llama's SentencePiece models do: "identity" normalisation (the default,
    // NFKC, rewrites characters and turns "\n" and "\t" into spaces), extra whitespace kept, and
    // byte fallback for characters outside the vocabulary (both model types: otherwise they become
    // <unk>, and are lost). Unlike Llama, no dummy prefix: the sentences are lines, and a line
    // inside a document gets no leading space either.
    std::map<std::string, std::string> args = {
        {"model_type", KindName(kind)},
        {"vocab_size", std::to_string(options.vocab_size)},
        {"hard_vocab_limit", "true"},
        {"byte_fallback", "true"},
        {"normalization_rule_name", "identity"},
        {"remove_extra_whitespaces", "false"},
        {"add_dummy_prefix", "false"},
        {"allow_whitespace_only_pieces", "true"},
        {"max_sentence_length", std::to_string(kMaxSentenceBytes + 96)},
        {"num_threads", std::to_string(threads)},
    };
    std::string error;
    model =
        TrainSentencePiece(args, sample.sentences(), static_cast<unsigned>(options.seed), &error);
    sample.Release();
    if (model.empty()) {
      const std::string message = SentencePieceMessage(error);
      if (absl::StrContains(message, "Vocabulary size too high") ||
          absl::StrContains(message, "Vocabulary size is smaller than required_chars")) {
        return absl::InvalidArgumentError(absl::StrCat("--vocab-size ", options.vocab_size,
                                                       " does not fit this corpus (", sample.seen(),
                                                       " sentences): SentencePiece: ", message));
      }
      return absl::InvalidArgumentError(absl::StrCat("training the ", KindName(kind),
                                                     " tokenizer (--vocab-size ",
                                                     options.vocab_size, ") failed: ", message));
    }
  }
  int64_t vocab_size = kBytesVocab, eod = kBytesEod, bos = kBytesBos, unk = -1;
  if (!model.empty()) {
    std::string error;
    spm = SentencePieceTokenizer::Load(model, &error);
    if (spm == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(kind == TokenizerKind::kModel ? options.tokenizer : "the trained model",
                       ": not a SentencePiece model: ", error));
    }
    vocab_size = spm->vocab_size();
    eod = spm->eos_id();
    bos = spm->bos_id();
    unk = spm->unk_id();
    if (eod < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.tokenizer,
                       ": the model has no end-of-sentence piece (eos_id -1), which ends "
                       "every document: train it with --eos_id set"));
    }
  }

  // ---- Pass 2: encode and write, through the atomic writer.
  absl::StatusOr<std::unique_ptr<PreparedWriter>> opened =
      PreparedWriter::Open(options.out, vocab_size, TokenBytesFor(vocab_size), eod, options.force);
  if (!opened.ok()) return opened.status();
  PreparedWriter& writer = **opened;
  DataManifest manifest;
  manifest.kind = "prepared";
  manifest.tokenizer = KindName(kind);
  if (!model.empty()) {
    manifest.tokenizer_file = "tokenizer.model";
    const std::string path = writer.partial_dir() + "/" + manifest.tokenizer_file;
    std::ofstream out(path, std::ios::binary);
    out.write(model.data(), static_cast<std::streamsize>(model.size()));
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
    Sha256Stream hash;
    hash.Update(model.data(), model.size());
    manifest.tokenizer_sha256 = hash.Hex();
  }
  const std::vector<bool> is_val = ChooseValidation(documents, val_documents, options.seed);
  int64_t document = 0;  // the index of the document being read
  auto split_of_next = [&]() -> absl::StatusOr<Split> {
    if (document >= documents) {
      return absl::InvalidArgumentError(
          absl::StrCat("the inputs changed while being prepared: more than the ", documents,
                       " documents the first pass counted"));
    }
    return is_val[static_cast<size_t>(document)] ? Split::kVal : Split::kTrain;
  };
  CorpusReader pass2(mode, options.field, check_utf8, replace_utf8);
  progress.Start("encoding");
  if (spm == nullptr) {
    std::vector<int32_t> ids;
    for (const InputFile& file : *files) {
      const absl::Status status =
          pass2.Read(file, nullptr, &progress, [&](std::string_view text, bool last) {
            absl::StatusOr<Split> split = split_of_next();
            if (!split.ok()) return split.status();
            ids.resize(text.size());
            for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
            if (absl::Status s = writer.AppendTokens(*split, ids); !s.ok()) return s;
            if (!last) return absl::OkStatus();
            ++document;
            return writer.EndDocument(*split);
          });
      if (!status.ok()) return status;
    }
  } else {
    // Batches in flight, oldest first; declared before the pool, so the pool's threads are
    // joined before any batch they may hold is freed.
    std::deque<std::unique_ptr<EncodePool::Batch>> pending;
    auto current = std::make_unique<EncodePool::Batch>();
    EncodePool pool(spm.get(), threads);
    auto write_oldest = [&]() -> absl::Status {
      std::unique_ptr<EncodePool::Batch> batch = std::move(pending.front());
      pending.pop_front();
      batch->done.WaitForNotification();
      if (!batch->error.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("SentencePiece could not encode: ", batch->error));
      }
      for (const EncodePool::Piece& piece : batch->pieces) {
        if (absl::Status s = writer.AppendTokens(piece.split, piece.ids); !s.ok()) return s;
        if (piece.last) {
          if (absl::Status s = writer.EndDocument(piece.split); !s.ok()) return s;
        }
      }
      return absl::OkStatus();
    };
    auto submit = [&]() -> absl::Status {
      pool.Submit(current.get());
      pending.push_back(std::move(current));
      current = std::make_unique<EncodePool::Batch>();
      // Two batches per thread in flight: the threads never wait for the reader, and memory
      // stays at a few MB.
      while (pending.size() > static_cast<size_t>(2 * threads)) {
        if (absl::Status s = write_oldest(); !s.ok()) return s;
      }
      return absl::OkStatus();
    };
    for (const InputFile& file : *files) {
      const absl::Status status =
          pass2.Read(file, nullptr, &progress, [&](std::string_view text, bool last) {
            absl::StatusOr<Split> split = split_of_next();
            if (!split.ok()) return split.status();
            current->pieces.push_back({std::string(text), *split, last, {}});
            current->bytes += text.size();
            if (last) ++document;
            return current->bytes >= kBatchBytes ? submit() : absl::OkStatus();
          });
      if (!status.ok()) return status;
    }
    if (!current->pieces.empty()) {
      if (absl::Status s = submit(); !s.ok()) return s;
    }
    while (!pending.empty()) {
      if (absl::Status s = write_oldest(); !s.ok()) return s;
    }
  }
  progress.Clear();
  if (document != documents) {
    return absl::InvalidArgumentError(
        absl::StrCat("the inputs changed while being prepared: ", document,
                     " documents, where the first pass "
                     "counted ",
                     documents));
  }

  manifest.bos_token = bos;
  manifest.unk_token = unk;
  manifest.inputs = std::move(inputs);
  // What decides the output and nothing else (not --threads, not --quiet): the manifest's hash
  // keys the runs trained on it.
  manifest.params = {
      {"val_fraction", options.val_fraction},
      {"seed", options.seed},
      {"docs", options.docs},
      {"field", options.field},
      {"max_sentences", train ? json(options.max_sentences) : json(nullptr)},
      {"vocab_size_requested", train ? json(options.vocab_size) : json(nullptr)},
      {"invalid_utf8", check_utf8 ? json(options.invalid_utf8) : json(nullptr)},
      {"replaced_sequences", pass1.replaced()},
  };
  if (absl::Status s = writer.Commit(&manifest); !s.ok()) return s;
  return manifest;
}

void AddPrepareCommand(CLI::App* app) {
  auto options = std::make_shared<PrepareOptions>();
  auto quiet = std::make_shared<bool>(false);
  CLI::App* cmd = app->add_subcommand(
      "prepare",
      "Turn raw text into prepared token data: train.bin, val.bin, the tokenizer and "
      "manifest.json in --out");
  cmd->add_option("inputs", options->inputs,
                  "Text files, .jsonl files (one JSON object a line) and directories of them "
                  "(recursive, sorted, hidden entries skipped)")
      ->required();
  cmd->add_option("--out", options->out, "The directory to create (written atomically)")
      ->required();
  cmd->add_option("--tokenizer", options->tokenizer,
                  "bytes (258 ids), bpe or unigram (SentencePiece, trained on the corpus), or "
                  "an existing SentencePiece .model file")
      ->capture_default_str();
  cmd->add_option("--vocab-size", options->vocab_size, "Vocabulary of a trained bpe/unigram model")
      ->capture_default_str();
  cmd->add_option("--field", options->field, "The JSON Lines field that holds a document")
      ->capture_default_str();
  cmd->add_option("--docs", options->docs,
                  "What a document is in a text file: file (all of it), line (each non-empty "
                  "line), blank (paragraphs separated by blank lines)")
      ->check(CLI::IsMember({"file", "line", "blank"}))
      ->capture_default_str();
  cmd->add_option("--val-fraction", options->val_fraction,
                  "Fraction of documents in val.bin (at least one), chosen by --seed")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seeds the validation choice and the training sample")
      ->capture_default_str();
  cmd->add_option("--max-sentences", options->max_sentences,
                  "Lines sampled to train a bpe/unigram model (bounds its memory)")
      ->capture_default_str();
  cmd->add_option("--threads", options->threads, "Encoding and training threads (default: cores)");
  cmd->add_option("--invalid-utf8", options->invalid_utf8,
                  "refuse (an error naming file, line and byte) or replace (with U+FFFD, counted "
                  "in the manifest); not checked with --tokenizer bytes")
      ->check(CLI::IsMember({"refuse", "replace"}))
      ->capture_default_str();
  cmd->add_flag("--force", options->force, "Replace --out if it exists (once the new one is done)");
  cmd->add_flag("--quiet", *quiet, "No progress bar and no summary");
  cmd->callback([options, quiet] {
    options->progress = !*quiet;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<DataManifest> manifest = Prepare(*options);
    if (!manifest.ok()) {
      fmt::print(stderr, "ablate data prepare: {}\n", std::string(manifest.status().message()));
      std::exit(1);
    }
    if (*quiet) return;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int64_t bytes = 0;
    for (const InputInfo& input : manifest->inputs) bytes += input.bytes;
    fmt::print(
        "prepared {}: {} documents, {} tokens (train {} documents, {} tokens; val {} "
        "documents, {} tokens); {} tokenizer, vocabulary {}; {:.1f} MB of text in {:.1f} s "
        "({:.1f} MB/s)\n",
        options->out, manifest->train.documents + manifest->val.documents,
        manifest->train.tokens + manifest->val.tokens, manifest->train.documents,
        manifest->train.tokens, manifest->val.documents, manifest->val.tokens, manifest->tokenizer,
        manifest->vocab_size, bytes / 1e6, seconds, seconds > 0 ? bytes / 1e6 / seconds : 0.0);
  });
}

}  // namespace ablate
