#include "common/credentials.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/state_dir.h"

namespace ablate {
namespace {

std::string LeaseMessage(int64_t run_id, int32_t attempt, int64_t worker_id) {
  return absl::StrCat("ablate lease: run ", run_id, " attempt ", attempt, " worker ", worker_id);
}

// Not a LeaseMessage of any run: a worker secret is never a lease secret.
std::string WorkerMessage(int64_t worker_id) {
  return absl::StrCat("ablate worker: ", worker_id);
}

}  // namespace

HmacSha256::HmacSha256(absl::string_view key) {
  mac_ = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  keyed_ = mac_ == nullptr ? nullptr : EVP_MAC_CTX_new(mac_);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  // OpenSSL refuses an empty key; HMAC() keyed with none is keyed with one zero byte.
  const unsigned char zero = 0;
  if (keyed_ == nullptr ||
      EVP_MAC_init(keyed_, key.empty() ? &zero : reinterpret_cast<const unsigned char*>(key.data()),
                   key.empty() ? 1 : key.size(), params) != 1) {
    std::abort();  // OpenSSL without HMAC-SHA256: nothing here can be signed or checked
  }
}

HmacSha256::~HmacSha256() {
  EVP_MAC_CTX_free(keyed_);
  EVP_MAC_free(mac_);
}

std::string HmacSha256::Hex(absl::string_view message) const {
  unsigned char digest[EVP_MAX_MD_SIZE];
  size_t length = 0;
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_dup(keyed_);
  if (ctx == nullptr ||
      EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(message.data()),
                     message.size()) != 1 ||
      EVP_MAC_final(ctx, digest, &length, sizeof digest) != 1) {
    std::abort();  // out of memory
  }
  EVP_MAC_CTX_free(ctx);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), length));
}

const char* RoleName(Role role) {
  switch (role) {
    case Role::kAdmin: return "admin";
    case Role::kWorker: return "worker";
    case Role::kRead: return "read";
    case Role::kNone: break;
  }
  return "none";
}

CredentialDigest DigestOf(absl::string_view credential) {
  static_assert(sizeof(CredentialDigest) == SHA256_DIGEST_LENGTH);
  CredentialDigest d;
  SHA256(reinterpret_cast<const unsigned char*>(credential.data()), credential.size(), d.data());
  return d;
}

bool DigestEquals(const CredentialDigest& a, const CredentialDigest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Credentials Credentials::Derive(absl::string_view secret) {
  Credentials c;
  c.admin = std::string(secret);
  c.worker = absl::StrCat("worker-", HmacSha256(secret).Hex("ablate credential: worker"));
  c.read = absl::StrCat("read-", HmacSha256(secret).Hex("ablate credential: read"));
  return c;
}

Role Credentials::RoleOf(absl::string_view presented) const {
  return CredentialChecker(*this).RoleOf(presented);
}

CredentialChecker::CredentialChecker(const Credentials& credentials) {
  if (!credentials.admin.empty()) admin_ = DigestOf(credentials.admin);
  if (!credentials.worker.empty()) worker_ = DigestOf(credentials.worker);
  if (!credentials.read.empty()) read_ = DigestOf(credentials.read);
}

Role CredentialChecker::RoleOf(absl::string_view presented) const {
  // All three compared, whichever matches: the time taken does not say which role was tried.
  const CredentialDigest digest = DigestOf(presented);
  const bool is_admin = admin_.has_value() && DigestEquals(digest, *admin_);
  const bool is_worker = worker_.has_value() && DigestEquals(digest, *worker_);
  const bool is_read = read_.has_value() && DigestEquals(digest, *read_);
  if (is_admin) return Role::kAdmin;
  if (is_worker) return Role::kWorker;
  if (is_read) return Role::kRead;
  return Role::kNone;
}

std::string LeaseSecret(absl::string_view secret, int64_t run_id, int32_t attempt,
                        int64_t worker_id) {
  return HmacSha256(secret).Hex(LeaseMessage(run_id, attempt, worker_id));
}

std::string LeaseSecret(const HmacSha256& key, int64_t run_id, int32_t attempt,
                        int64_t worker_id) {
  return key.Hex(LeaseMessage(run_id, attempt, worker_id));
}

std::string WorkerSecret(const HmacSha256& key, int64_t worker_id) {
  return key.Hex(WorkerMessage(worker_id));
}

bool LeaseSecretEquals(absl::string_view presented, absl::string_view expected) {
  return presented.size() == expected.size() &&
         CRYPTO_memcmp(presented.data(), expected.data(), expected.size()) == 0;
}

absl::StatusOr<Credentials> LoadOrCreateCredentials(const std::string& state_dir,
                                                    const std::string& secret) {
  std::string key = secret;
  if (key.empty()) {
    absl::StatusOr<std::string> token = LoadOrCreateToken(state_dir);
    if (!token.ok()) return token.status();
    key = *token;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(state_dir, ec);
  }
  Credentials credentials = Credentials::Derive(key);
  const std::filesystem::path dir(state_dir);
  if (absl::Status s = WriteFileAtomically((dir / kWorkerTokenFile).string(),
                                           credentials.worker + "\n", 0600);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteFileAtomically((dir / kReadTokenFile).string(),
                                           credentials.read + "\n", 0600);
      !s.ok()) {
    return s;
  }
  return credentials;
}

}  // namespace ablate
