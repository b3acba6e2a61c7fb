// Optional TLS for the gRPC APIs. Without it traffic is plaintext, guarded by the bearer token
// alone: fine on loopback or a trusted cluster network, not across the internet.
//
// Server: `ablate serve --tls-cert CERT.pem --tls-key KEY.pem` (PEM; the certificate must name
// the address clients dial: a DNS or IP subjectAltName). The server then also writes a copy of
// the certificate to <state_dir>/tls-ca.pem, so clients on the same machine (and the workers of
// `ablate up`) trust it without a flag when it is self-signed, the usual case for a lab.
//
// Clients (`ablate` commands, `ablate-worker`): the CA bundle that signed the server's
// certificate, first found wins: --tls-ca FILE, $ABLATE_TLS_CA, <state_dir>/tls-ca.pem. None:
// plaintext. A client with a CA talking to a plaintext server (or the reverse) fails to connect
// (UNAVAILABLE), and so does one whose CA did not sign the server's certificate.
#ifndef ABLATE_PROTO_TLS_H_
#define ABLATE_PROTO_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace ablate {

// The name of the certificate copy in a state dir.
inline constexpr char kTlsCaFile[] = "tls-ca.pem";

// TLS credentials from PEM files when both are given, plaintext when both are "". Errors name the
// file that is missing, unreadable or not PEM, or the flag given without its partner.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const std::string& cert_file, const std::string& key_file);

// TLS trusting the PEM bundle `ca_file`, or plaintext when it is "".
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const std::string& ca_file);

// The CA file a client uses: `flag`, else $ABLATE_TLS_CA, else <state_dir>/tls-ca.pem when it
// exists ("" state_dir: skipped), else "" (plaintext).
std::string ResolveTlsCa(const std::string& flag, const std::string& state_dir);

// The contents of a PEM file; errors name the file and what is wrong with it.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* what);

}  // namespace ablate

#endif  // ABLATE_PROTO_TLS_H_
