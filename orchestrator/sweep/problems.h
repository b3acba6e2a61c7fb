// The problems a sweep spec's parse finds, as "FILE:LINE: field.path: what is wrong" lines
// (config/proto_yaml.h, YamlProblem), each one once and in the order found. Every part of the
// spec parser (spec.cc, and the `tune:` block in tune.cc) writes to the one collector of its
// parse, so that a spec's InvalidArgument lists every problem, one per line.
//
// Not thread-safe: one collector per parse.
#ifndef ABLATE_ORCHESTRATOR_SWEEP_PROBLEMS_H_
#define ABLATE_ORCHESTRATOR_SWEEP_PROBLEMS_H_

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace ablate {

class SpecProblems {
 public:
  // `file` names the spec in every line.
  explicit SpecProblems(std::string file) : file_(std::move(file)) {}

  SpecProblems(const SpecProblems&) = delete;
  SpecProblems& operator=(const SpecProblems&) = delete;

  // A problem at `line` of the file (0: none known) with the field at `path` ("" for the spec).
  void Add(int line, const std::string& path, const std::string& what);
  // A problem already written as a line.
  void AddLine(std::string line);
  // Each line of a failed status's message (one of OverlayYaml, LocateProblems); none for OK.
  void Absorb(const absl::Status& status);
  // `key`, found at `line` in the mapping at `path`, is none of `known`: "unknown key" with the
  // closest known name, or the list of them when none is close.
  void UnknownKey(int line, const std::string& path, const std::string& key,
                  const std::vector<std::string>& known);

  bool empty() const { return lines_.empty(); }
  const std::string& file() const { return file_; }
  // OK when none was found, else InvalidArgument with one problem per line.
  absl::Status ToStatus() const;

 private:
  const std::string file_;
  std::vector<std::string> lines_;  // in the order found
  std::set<std::string> seen_;      // lines_, to add each once
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_SWEEP_PROBLEMS_H_
