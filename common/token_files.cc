#include "common/token_files.h"

#include <fnmatch.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/durable_file.h"

namespace ablate {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string Sha256Hex(const std::string& text) {
  Sha256Stream h;
  h.Update(text.data(), text.size());
  return h.Hex();
}

// "none": a synthetic task's ids are not text (mqar).
const char* TokenizerKinds[] = {"bytes", "bpe", "unigram", "model", "none"};

json SplitJson(const SplitInfo& s) {
  return {{"file", s.file}, {"documents", s.documents}, {"tokens", s.tokens}, {"sha256", s.sha256}};
}

// Reads `key` of `object` as T, or records why not.
template <typename T>
bool Field(const json& object, const char* key, T* out, std::string* error) {
  const auto it = object.find(key);
  if (it == object.end()) {
    *error = absl::StrCat("no field \"", key, "\"");
    return false;
  }
  try {
    *out = it->get<T>();
  } catch (const json::exception&) {
    *error = absl::StrCat("field \"", key, "\" is ", it->type_name(), ", not the expected type");
    return false;
  }
  return true;
}

bool ParseSplit(const json& object, const char* key, SplitInfo* s, std::string* error) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_object()) {
    *error = absl::StrCat("no object \"", key, "\"");
    return false;
  }
  std::string inner;
  if (!Field(*it, "file", &s->file, &inner) || !Field(*it, "documents", &s->documents, &inner) ||
      !Field(*it, "tokens", &s->tokens, &inner) || !Field(*it, "sha256", &s->sha256, &inner)) {
    *error = absl::StrCat(key, ": ", inner);
    return false;
  }
  if (s->file.empty() || s->file.find('/') != std::string::npos || s->file[0] == '.') {
    *error = absl::StrCat(key, ".file: \"", s->file, "\" is not a file name in the directory");
    return false;
  }
  return true;
}

int64_t FileSize(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  return ec ? -1 : static_cast<int64_t>(size);
}

}  // namespace

struct Sha256Stream::Context {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx{EVP_MD_CTX_new(), EVP_MD_CTX_free};
};

Sha256Stream::Sha256Stream() : context_(std::make_unique<Context>()) {
  if (context_->ctx == nullptr ||
      EVP_DigestInit_ex(context_->ctx.get(), EVP_sha256(), nullptr) != 1) {
    std::abort();  // OpenSSL without SHA-256: nothing here can be keyed or checked
  }
}

Sha256Stream::~Sha256Stream() = default;

void Sha256Stream::Update(const void* data, size_t n) {
  EVP_DigestUpdate(context_->ctx.get(), data, n);
}

std::string Sha256Stream::Hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(context_->ctx.get(), digest, &n);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), n));
}

int TokenBytesFor(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

json ManifestJson(const DataManifest& m) {
  json inputs = json::array();
  for (const InputInfo& in : m.inputs) {
    inputs.push_back({{"path", in.path}, {"bytes", in.bytes}, {"sha256", in.sha256}});
  }
  json j = {{"version", kManifestVersion},
            {"kind", m.kind},
            {"tokenizer",
             {{"kind", m.tokenizer}, {"file", m.tokenizer_file}, {"sha256", m.tokenizer_sha256}}},
            {"vocab_size", m.vocab_size},
            {"token_dtype", m.token_bytes == 4 ? "uint32" : "uint16"},
            {"special_tokens", {{"eod", m.eod_token}, {"bos", m.bos_token}, {"unk", m.unk_token}}},
            {"splits", {{"train", SplitJson(m.train)}, {"val", SplitJson(m.val)}}},
            {"inputs", inputs},
            {"params", m.params},
            {"ablate_version", m.ablate_version}};
  if (!m.checksum.empty()) j["checksum"] = m.checksum;
  return j;
}

absl::Status WriteManifest(const std::string& dir, DataManifest* m) {
  m->checksum.clear();
  m->checksum = Sha256Hex(ManifestJson(*m).dump());  // nlohmann sorts keys: canonical
  return WriteFileAtomically((fs::path(dir) / kManifestFile).string(),
                             ManifestJson(*m).dump(2) + "\n", 0644);
}

bool IsPreparedDir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kManifestFile, ec);
}

absl::StatusOr<DataManifest> ReadManifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestFile).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open for reading"));
  const auto fail = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    return fail(absl::StrCat("not JSON: ", e.what()));
  }
  if (!j.is_object()) return fail("not a JSON object");
  DataManifest m;
  std::string error;
  int version = 0;
  if (!Field(j, "version", &version, &error)) return fail(error);
  if (version != kManifestVersion) {
    return fail(absl::StrCat("manifest version ", version, " is not ", kManifestVersion,
                             " (written by another ablate): prepare the data again"));
  }
  std::string stored;
  if (!Field(j, "checksum", &stored, &error)) return fail(error);
  json body = j;
  body.erase("checksum");
  if (Sha256Hex(body.dump()) != stored) {
    return fail(
        "the checksum does not match the contents: the manifest was edited after it was written; "
        "prepare the data again (ablate data prepare) instead of editing it");
  }
  m.checksum = stored;
  const auto tokenizer = j.find("tokenizer");
  if (tokenizer == j.end() || !tokenizer->is_object()) return fail("no object \"tokenizer\"");
  if (!Field(*tokenizer, "kind", &m.tokenizer, &error) ||
      !Field(*tokenizer, "file", &m.tokenizer_file, &error) ||
      !Field(*tokenizer, "sha256", &m.tokenizer_sha256, &error)) {
    return fail(absl::StrCat("tokenizer: ", error));
  }
  if (std::find(std::begin(TokenizerKinds), std::end(TokenizerKinds), m.tokenizer) ==
      std::end(TokenizerKinds)) {
    return fail(absl::StrCat("tokenizer.kind \"", m.tokenizer,
                             "\" is not bytes, bpe, unigram, model or none"));
  }
  std::string dtype;
  if (!Field(j, "kind", &m.kind, &error) || !Field(j, "vocab_size", &m.vocab_size, &error) ||
      !Field(j, "token_dtype", &dtype, &error) ||
      !Field(j, "ablate_version", &m.ablate_version, &error)) {
    return fail(error);
  }
  if (dtype != "uint16" && dtype != "uint32") {
    return fail(absl::StrCat("token_dtype \"", dtype, "\" is not uint16 or uint32"));
  }
  m.token_bytes = dtype == "uint32" ? 4 : 2;
  if (m.vocab_size < 2 || (m.token_bytes == 2 && m.vocab_size > 65536)) {
    return fail(absl::StrCat("vocab_size ", m.vocab_size, " does not fit ", dtype));
  }
  const auto special = j.find("special_tokens");
  if (special == j.end() || !special->is_object()) return fail("no object \"special_tokens\"");
  if (!Field(*special, "eod", &m.eod_token, &error) ||
      !Field(*special, "bos", &m.bos_token, &error) ||
      !Field(*special, "unk", &m.unk_token, &error)) {
    return fail(absl::StrCat("special_tokens: ", error));
  }
  for (const auto& [name, id] :
       {std::pair{"eod", m.eod_token}, {"bos", m.bos_token}, {"unk", m.unk_token}}) {
    if (id < -1 || id >= m.vocab_size) {
      return fail(absl::StrCat("special_tokens.", name, " = ", id,
                               " is outside the vocabulary [0, ", m.vocab_size, ")"));
    }
  }
  if (m.eod_token < 0)
    return fail("special_tokens.eod: a prepared directory has an end-of-document token");
  const auto splits = j.find("splits");
  if (splits == j.end() || !splits->is_object()) return fail("no object \"splits\"");
  if (!ParseSplit(*splits, "train", &m.train, &error) ||
      !ParseSplit(*splits, "val", &m.val, &error)) {
    return fail(absl::StrCat("splits.", error));
  }
  const auto inputs = j.find("inputs");
  if (inputs == j.end() || !inputs->is_array()) return fail("no array \"inputs\"");
  for (const json& input : *inputs) {
    InputInfo info;
    if (!input.is_object() || !Field(input, "path", &info.path, &error) ||
        !Field(input, "bytes", &info.bytes, &error) ||
        !Field(input, "sha256", &info.sha256, &error)) {
      return fail(
          absl::StrCat("inputs: ", input.is_object() ? error : "an entry is not an object"));
    }
    m.inputs.push_back(std::move(info));
  }
  m.params = j.value("params", json::object());
  // The splits must be the files the manifest describes: a truncated or replaced file is caught
  // here by its size (its bytes are hashed only by `ablate data verify`-style tools: a full read).
  for (const SplitInfo* s : {&m.train, &m.val}) {
    const std::string file = (fs::path(dir) / s->file).string();
    const int64_t size = FileSize(file);
    if (size < 0) return absl::NotFoundError(absl::StrCat(file, ": missing (named by ", path, ")"));
    if (size != s->tokens * m.token_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", size, " bytes, but the manifest says ", s->tokens, " tokens of ",
                       m.token_bytes, " bytes (", s->tokens * m.token_bytes,
                       "): the file was changed after it was prepared"));
    }
  }
  if (!m.tokenizer_file.empty() && FileSize((fs::path(dir) / m.tokenizer_file).string()) < 0) {
    return absl::NotFoundError(absl::StrCat((fs::path(dir) / m.tokenizer_file).string(),
                                            ": missing (named by ", path, ")"));
  }
  return m;
}

bool HasLlmcMagic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  int32_t magic = 0;
  return in.read(reinterpret_cast<char*>(&magic), sizeof(magic)) && magic == kLlmcMagic;
}

absl::StatusOr<LlmcShard> ReadLlmcHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open for reading"));
  int32_t header[256];
  if (!in.read(reinterpret_cast<char*>(header), sizeof(header))) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", std::max<int64_t>(FileSize(path), 0),
                     " bytes, shorter than an llm.c shard's header of 256 int32 (1024 bytes)"));
  }
  if (header[0] != kLlmcMagic) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": magic ", header[0],
                                                   " at byte 0 is not llm.c's ", kLlmcMagic,
                                                   ": not an llm.c / modded-nanogpt shard"));
  }
  if (header[1] != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": version ", header[1], " at byte 4 is not 1 (uint16 tokens), the version read"));
  }
  LlmcShard shard;
  shard.tokens = header[2];
  const int64_t size = FileSize(path);
  const int64_t expected = kLlmcHeaderBytes + shard.tokens * shard.token_bytes;
  if (shard.tokens < 0 || size != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the header (byte 8) says ", shard.tokens, " tokens, so ", expected,
                     " bytes, but the file has ", size,
                     size < expected ? " (a short body)" : " (trailing bytes)"));
  }
  return shard;
}

bool IsMegatronPrefix(const std::string& prefix) {
  std::error_code ec;
  return fs::is_regular_file(prefix + ".idx", ec) && fs::is_regular_file(prefix + ".bin", ec);
}

absl::StatusOr<MegatronIndex> ReadMegatronIndex(const std::string& prefix) {
  const std::string idx = prefix + ".idx";
  const std::string bin = prefix + ".bin";
  std::ifstream in(idx, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(idx, ": cannot open for reading"));
  const auto fail = [&](int64_t offset, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(idx, ": at byte ", offset, ": ", what));
  };
  char magic[9];
  if (!in.read(magic, 9) || std::memcmp(magic, "MMIDIDX\0\0", 9) != 0) {
    return fail(0, "not a Megatron-LM index (the header MMIDIDX\\0\\0)");
  }
  uint64_t version = 0;
  uint8_t code = 0;
  uint64_t sequences = 0, documents = 0;
  if (!in.read(reinterpret_cast<char*>(&version), 8)) return fail(9, "ends before its version");
  if (version != 1) return fail(9, absl::StrCat("version ", version, " is not 1"));
  if (!in.read(reinterpret_cast<char*>(&code), 1)) return fail(17, "ends before its dtype code");
  MegatronIndex index;
  index.dtype_code = code;
  switch (code) {
    case 1:
      index.token_bytes = 1;
      break;  // uint8
    case 4:
      index.token_bytes = 4;
      break;  // int32 (read as non-negative ids)
    case 8:
      index.token_bytes = 2;
      break;  // uint16
    default:
      return fail(17, absl::StrCat("dtype code ", static_cast<int>(code),
                                   " is not read (1 uint8, 4 int32 and 8 uint16 are)"));
  }
  if (!in.read(reinterpret_cast<char*>(&sequences), 8) ||
      !in.read(reinterpret_cast<char*>(&documents), 8)) {
    return fail(18, "ends before its sequence and document counts");
  }
  const int64_t idx_size = FileSize(idx);
  constexpr int64_t kHead = 34;
  // Checked against the file's size before anything is allocated: a corrupt count must not ask
  // for terabytes.
  if (sequences > static_cast<uint64_t>(idx_size) || documents > static_cast<uint64_t>(idx_size) ||
      kHead + static_cast<int64_t>(sequences) * 12 + static_cast<int64_t>(documents) * 8 >
          idx_size) {
    return fail(18, absl::StrCat(sequences, " sequences and ", documents, " document entries need ",
                                 kHead + static_cast<int64_t>(sequences) * 12 +
                                     static_cast<int64_t>(documents) * 8,
                                 " bytes; the index has ", idx_size));
  }
  index.lengths.resize(sequences);
  index.pointers.resize(sequences);
  index.documents.resize(documents);
  in.read(reinterpret_cast<char*>(index.lengths.data()),
          static_cast<std::streamsize>(sequences * 4));
  in.read(reinterpret_cast<char*>(index.pointers.data()),
          static_cast<std::streamsize>(sequences * 8));
  in.read(reinterpret_cast<char*>(index.documents.data()),
          static_cast<std::streamsize>(documents * 8));
  if (!in) return fail(kHead, "ends before its arrays");
  index.bin_bytes = FileSize(bin);
  if (index.bin_bytes < 0) return absl::NotFoundError(absl::StrCat(bin, ": missing beside ", idx));
  int64_t next = 0;
  for (uint64_t s = 0; s < sequences; ++s) {
    const int64_t length_at = kHead + static_cast<int64_t>(s) * 4;
    if (index.lengths[s] < 0)
      return fail(length_at, absl::StrCat("sequence ", s, " has length ", index.lengths[s]));
    if (index.pointers[s] != next) {
      return fail(kHead + static_cast<int64_t>(sequences) * 4 + static_cast<int64_t>(s) * 8,
                  absl::StrCat("sequence ", s, " starts at byte ", index.pointers[s], " of ", bin,
                               ", not at ", next, " where the one before it ends"));
    }
    next += static_cast<int64_t>(index.lengths[s]) * index.token_bytes;
  }
  if (next != index.bin_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(idx, " describes ", next, " bytes of tokens, but ", bin, " has ",
                     index.bin_bytes, ": the index and the data disagree"));
  }
  const int64_t doc_at = kHead + static_cast<int64_t>(sequences) * 12;
  for (uint64_t d = 0; d < documents; ++d) {
    const int64_t v = index.documents[d];
    const int64_t prev = d == 0 ? -1 : index.documents[d - 1];
    if (v < 0 || v > static_cast<int64_t>(sequences) || (d > 0 && v <= prev) ||
        (d == 0 && v != 0)) {
      return fail(doc_at + static_cast<int64_t>(d) * 8,
                  absl::StrCat("document index entry ", d, " = ", v,
                               " is not increasing from 0 within the ", sequences, " sequences"));
    }
  }
  if (documents > 0 && index.documents.back() != static_cast<int64_t>(sequences)) {
    return fail(doc_at + static_cast<int64_t>(documents - 1) * 8,
                absl::StrCat("the document index ends at ", index.documents.back(), ", not at the ",
                             sequences, " sequences"));
  }
  return index;
}

bool IsGlob(const std::string& path) {
  return fs::path(path).filename().string().find_first_of("*?[") != std::string::npos;
}

absl::StatusOr<std::vector<std::string>> ExpandDataGlob(const std::string& pattern) {
  if (!IsGlob(pattern)) return std::vector<std::string>{pattern};
  const fs::path p(pattern);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (dir.string().find_first_of("*?[") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(pattern, ": only the file name may hold *, ? or [...], not its directory"));
  }
  const std::string name = p.filename().string();
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string file = it->path().filename().string();
    if (fnmatch(name.c_str(), file.c_str(), FNM_PERIOD) == 0) {
      files.push_back((p.parent_path() / file).string());
    }
  }
  if (ec)
    return absl::NotFoundError(
        absl::StrCat(pattern, ": cannot list ", dir.string(), ": ", ec.message()));
  if (files.empty()) return absl::NotFoundError(absl::StrCat(pattern, ": no file matches"));
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<std::string> FingerprintFiles(const std::vector<std::string>& files) {
  constexpr int64_t kBlock = 64 << 10;
  constexpr int kBlocks = 17;
  Sha256Stream h;
  std::vector<char> buffer(kBlock);
  for (const std::string& file : files) {
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat(file, ": cannot read: ", std::strerror(errno)));
    }
    std::ifstream in(file, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat(file, ": cannot open for reading"));
    const int64_t size = st.st_size;
    const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    const std::string head = absl::StrCat(size, " ", mtime, "\n");
    h.Update(head.data(), head.size());
    std::vector<int64_t> offsets;
    if (size <= kBlock * kBlocks) {
      for (int64_t o = 0; o < size; o += kBlock) offsets.push_back(o);  // every byte
    } else {
      for (int b = 0; b < kBlocks; ++b) offsets.push_back((size - kBlock) * b / (kBlocks - 1));
    }
    for (const int64_t o : offsets) {
      const int64_t n = std::min(kBlock, size - o);
      in.seekg(o);
      if (!in.read(buffer.data(), n)) {
        return absl::DataLossError(absl::StrCat(file, ": read error at byte ", o));
      }
      h.Update(buffer.data(), static_cast<size_t>(n));
    }
  }
  return h.Hex().substr(0, 16);
}

absl::StatusOr<std::string> Sha256File(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open for reading"));
  Sha256Stream h;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (in.gcount() > 0) h.Update(buffer.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return h.Hex();
}

}  // namespace ablate
