// Who may do what (docs/operations.md, "Threat model"). A coordinator has one secret (the state
// dir's `token` file, or `ablate serve --token-file`); three credentials are derived from it, so
// each holder gets only the power it needs:
// - admin (the secret itself): every call, the CLI's Submit, Cancel and Rerun included;
// - worker: WorkerService only (Register, AcquireJob, Report, Finish, Deregister): what a SLURM
//   pilot or `ablate-worker` holds;
// - read: ListSweeps, GetSweep, Watch, Query, Table and the dashboard: what a dashboard URL
//   carries.
// A worker credential still cannot report for, or finish, a run it was not leased: every Job
// carries a lease secret for its (run, attempt, worker), which Report and Finish must present.
// Lease secrets are derived from the coordinator's secret too, so a restarted coordinator checks
// the same ones without storing them (and `ablate query` cannot read them).
//
// Derivation is HMAC-SHA256 (OpenSSL) keyed with the secret; comparisons take constant time.
// Pure functions; thread-safe.
#ifndef ABLATE_COMMON_CREDENTIALS_H_
#define ABLATE_COMMON_CREDENTIALS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// OpenSSL's EVP_MAC and EVP_MAC_CTX (<openssl/types.h>), kept out of this header.
struct evp_mac_st;
struct evp_mac_ctx_st;

namespace ablate {

enum class Role { kNone = 0, kRead = 1, kWorker = 2, kAdmin = 3 };

// "admin", "worker", "read" or "none".
const char* RoleName(Role role);

struct Credentials {
  std::string admin;   // the secret
  std::string worker;  // "worker-" + 64 hex digits
  std::string read;    // "read-" + 64 hex digits

  // The three credentials of a coordinator secret (non-empty).
  static Credentials Derive(absl::string_view secret);
  // The role `presented` grants: kNone unless it equals one of the three (constant time: the
  // comparison does not stop at the first differing byte).
  Role RoleOf(absl::string_view presented) const;
};

// HMAC-SHA256 under one key, keyed once. OpenSSL's one-shot HMAC() looks its algorithms up in
// the provider store, under a lock, on every call, where a copy of the keyed state does not; the
// coordinator signs and checks a lease secret for every job. Thread-safe: each
// call works on its own copy.
class HmacSha256 {
 public:
  explicit HmacSha256(absl::string_view key);
  ~HmacSha256();
  HmacSha256(const HmacSha256&) = delete;
  HmacSha256& operator=(const HmacSha256&) = delete;

  // The MAC of `message`, 64 lowercase hex digits.
  std::string Hex(absl::string_view message) const;

 private:
  evp_mac_st* mac_ = nullptr;
  evp_mac_ctx_st* keyed_ = nullptr;  // initialised with the key; only copied from
};

// The lease secret of attempt `attempt` of run `run_id` on worker `worker_id` (64 hex digits),
// under the coordinator's secret (or its keyed HMAC).
std::string LeaseSecret(absl::string_view secret, int64_t run_id, int32_t attempt,
                        int64_t worker_id);
std::string LeaseSecret(const HmacSha256& key, int64_t run_id, int32_t attempt,
                        int64_t worker_id);

// The secret of worker `worker_id` (64 hex digits), which its AcquireJob and Deregister present:
// a worker credential alone does not let its holder act as another worker.
std::string WorkerSecret(const HmacSha256& key, int64_t worker_id);

// Whether a presented lease (or worker) secret is `expected` (64 hex digits, a length that says nothing),
// in time that does not depend on where they differ.
bool LeaseSecretEquals(absl::string_view presented, absl::string_view expected);

// Credentials are compared as SHA-256 digests with CRYPTO_memcmp: fixed length, so neither a
// matching prefix nor a credential's length shows in the time a comparison takes.
using CredentialDigest = std::array<unsigned char, 32>;
CredentialDigest DigestOf(absl::string_view credential);
bool DigestEquals(const CredentialDigest& a, const CredentialDigest& b);

// Credentials::RoleOf with the three credentials' digests computed once: what a server checks
// on every call hashes only the credential presented.
class CredentialChecker {
 public:
  explicit CredentialChecker(const Credentials& credentials);
  Role RoleOf(absl::string_view presented) const;

 private:
  // The digest of each credential, none for an empty one (it grants nothing).
  std::optional<CredentialDigest> admin_, worker_, read_;
};

// The state dir's files of the derived credentials, mode 0600 beside `token`.
inline constexpr char kWorkerTokenFile[] = "worker-token";
inline constexpr char kReadTokenFile[] = "read-token";

// Loads or creates the state dir's secret (LoadOrCreateToken) and writes the worker and read
// credentials beside it. With `secret` non-empty that secret is used and no `token` file is
// written. PermissionDenied naming the file that cannot be written.
absl::StatusOr<Credentials> LoadOrCreateCredentials(const std::string& state_dir,
                                                    const std::string& secret = "");

// What a `--token VALUE` option answers: a secret on a command line is visible to every user of
// the machine in `ps`.
inline constexpr char kTokenOnCommandLine[] =
    "--token: a token on the command line is visible to every user of the machine (ps); "
    "use --token-file FILE or the ABLATE_TOKEN environment variable";

}  // namespace ablate

#endif  // ABLATE_COMMON_CREDENTIALS_H_
