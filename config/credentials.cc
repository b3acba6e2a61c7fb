#include "config/credentials.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "config/state_dir.h"

namespace ablate {
namespace {

std::string HmacHex(absl::string_view key, absl::string_view message) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest, &length);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), length));
}

}  // namespace

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

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  return DigestEquals(DigestOf(a), DigestOf(b));
}

Credentials Credentials::Derive(absl::string_view secret) {
  Credentials c;
  c.admin = std::string(secret);
  c.worker = absl::StrCat("worker-", HmacHex(secret, "ablate credential: worker"));
  c.read = absl::StrCat("read-", HmacHex(secret, "ablate credential: read"));
  return c;
}

Role Credentials::RoleOf(absl::string_view presented) const {
  // All three compared, whichever matches: the time taken does not say which role was tried.
  const bool is_admin = !admin.empty() && ConstantTimeEquals(presented, admin);
  const bool is_worker = !worker.empty() && ConstantTimeEquals(presented, worker);
  const bool is_read = !read.empty() && ConstantTimeEquals(presented, read);
  if (is_admin) return Role::kAdmin;
  if (is_worker) return Role::kWorker;
  if (is_read) return Role::kRead;
  return Role::kNone;
}

std::string LeaseSecret(absl::string_view secret, int64_t run_id, int32_t attempt,
                        int64_t worker_id) {
  return HmacHex(secret, absl::StrCat("ablate lease: run ", run_id, " attempt ", attempt,
                                      " worker ", worker_id));
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
