#include "proto/tls.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace ablate {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the ", what, " ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string pem = ss.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " ", path, " is not a PEM file (no -----BEGIN line)"));
  }
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() && key_file.empty()) return grpc::InsecureServerCredentials();
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  absl::StatusOr<std::string> cert = ReadPemFile(cert_file, "TLS certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(key_file, "TLS private key");
  if (!key.ok()) return key.status();
  if (key->find("PRIVATE KEY-----") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TLS private key ", key_file, " holds no PRIVATE KEY block"));
  }
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const std::string& ca_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<std::string> ca = ReadPemFile(ca_file, "TLS CA file");
  if (!ca.ok()) return ca.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *ca;
  return grpc::SslCredentials(options);
}

std::string ResolveTlsCa(const std::string& flag, const std::string& state_dir) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("ABLATE_TLS_CA"); env != nullptr && *env != '\0') return env;
  if (!state_dir.empty()) {
    const std::filesystem::path copy = std::filesystem::path(state_dir) / kTlsCaFile;
    std::error_code ec;
    if (std::filesystem::exists(copy, ec)) return copy.string();
  }
  return "";
}

}  // namespace ablate
