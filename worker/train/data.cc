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

// A token file mapped, every id checked against the vocabulary in one pass.
absl::StatusOr<TokenArray> MapBin(const fs::path& path, TokenDtype dtype, int64_t vocab_size) {
  const int width = dtype == TOKEN_UINT32 ? 4 : 2;
  absl::StatusOr<TokenArray> tokens = TokenArray::Map(path.string(), width);
  if (!tokens.ok()) return tokens.status();
  if (const int64_t bad = tokens->FirstOutside(vocab_size); bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.string(), ": token ", (*tokens)[bad], " at token offset ", bad, " (byte ",
        bad * width, ") is outside the vocabulary (model.vocab_size = ", vocab_size, ")",
        dtype == TOKEN_UINT16 ? " (a file of uint32 tokens needs train.data.token_dtype: uint32)"
                              : ""));
  }
  return tokens;
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

absl::StatusOr<TokenArray> TokenArray::Map(const std::string& path, int width) {
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
  if (bytes % width != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", bytes, " bytes is not a whole number of uint",
                                                   width * 8, " tokens"));
  }
  TokenArray a;
  a.width_ = width;
  a.size_ = bytes / width;
  if (bytes > 0) {
    void* mapped = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);  // the mapping keeps the file
    if (mapped == MAP_FAILED) {
      return absl::DataLossError(absl::StrCat(path, ": cannot map: ", std::strerror(e)));
    }
    a.data_ = static_cast<const uint8_t*>(mapped);
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

absl::StatusOr<TokenData> TokenData::Load(const DataConfig& config, int64_t vocab_size,
                                          int64_t seq_len) {
  TokenData data;
  data.seed_ = config.data_seed();
  data.seq_len_ = seq_len;
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
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path.string(), ": no such file or directory"));
  }
  DataFormat format = config.format();
  if (format == DATA_AUTO) {
    format = fs::is_directory(path) && fs::exists(path / "train.bin") ? DATA_NANOGPT_BIN : DATA_TEXT;
  }

  if (format == DATA_NANOGPT_BIN) {
    absl::StatusOr<TokenArray> train = MapBin(path / "train.bin", config.token_dtype(), vocab_size);
    if (!train.ok()) return train.status();
    absl::StatusOr<TokenArray> val = MapBin(path / "val.bin", config.token_dtype(), vocab_size);
    if (!val.ok()) return val.status();
    data.train_ = std::move(*train);
    data.val_ = std::move(*val);
    data.source_ = (path / "{train,val}.bin").string();
  } else {
    if (vocab_size < 256) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.vocab_size: byte-level text needs >= 256, got ", vocab_size));
    }
    std::vector<fs::path> files;
    if (fs::is_directory(path)) {
      for (const auto& entry : fs::directory_iterator(path)) {
        if (entry.is_regular_file() && entry.path().extension() == ".txt") files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());  // a stable corpus order
      if (files.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(path.string(), ": no .txt files in directory"));
      }
    } else {
      files.push_back(path);
    }
    std::string all;
    for (const fs::path& f : files) {
      absl::StatusOr<std::string> bytes = ReadFile(f);
      if (!bytes.ok()) return bytes.status();
      all += *bytes;
    }
    // The last val_fraction of the corpus is held out: contiguous, so no sequence straddles.
    const auto n = static_cast<int64_t>(all.size());
    const auto val_n = static_cast<int64_t>(static_cast<double>(n) * config.val_fraction());
    const TokenArray corpus = TokenArray::OfBytes(std::move(all));
    data.val_ = corpus.Slice(n - val_n, n);
    data.train_ = corpus.Slice(0, n - val_n);
    data.source_ = files.size() == 1 ? files[0].string()
                                     : absl::StrCat(path.string(), " (", files.size(), " files)");
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
    if (split->size() < seq_len + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          data.source_, ": the ", name, " split has ", split->size(),
          " tokens, fewer than train.seq_len + 1 = ", seq_len + 1,
          split->size() == 0 ? " (empty)" : ""));
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
  const TokenArray& tokens = split == Split::kTrain ? train_ : val_;
  const uint64_t salt = split == Split::kTrain ? 0x7261696eULL : 0x76616c00ULL;
  std::mt19937_64 rng(Mix(seed_ ^ Mix(salt ^ Mix(static_cast<uint64_t>(index)))));
  std::uniform_int_distribution<int64_t> offset(0, tokens.size() - len - 1);
  for (int64_t b = 0; b < batch_size; ++b) {
    Window(tokens, offset(rng), len, inputs + b * len, targets + b * len);
  }
}

void TokenData::Consecutive(Split split, int64_t count, int64_t len, int64_t* inputs,
                            int64_t* targets) const {
  const TokenArray& tokens = split == Split::kTrain ? train_ : val_;
  for (int64_t w = 0; w < count; ++w) {
    Window(tokens, w * len, len, inputs + w * len, targets + w * len);
  }
}

}  // namespace ablate
