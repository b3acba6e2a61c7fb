#include "orchestrator/sweep/program_budget.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/text_format.h"
#include "config/program_config.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace ablate {

namespace {

// The most values one call of the counter asks about while searching.
constexpr int kProbesPerCall = 16;
// The most calls one search makes.
constexpr int kMaxCalls = 24;

// Runs argv in dir with `input` on stdin; its stdout, or why not.
absl::StatusOr<std::string> RunWithInput(const std::vector<std::string>& argv,
                                         const std::string& dir, const std::string& input,
                                         absl::Duration timeout, const std::string& what) {
  const std::string exe = FindProgramExecutable(argv.front(), dir);
  if (exe.empty())
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", argv.front(), " not found"));
  std::vector<std::string> args = argv;
  std::vector<char*> c_args;
  for (std::string& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat(what, ": pipe: ", strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat(what, ": fork: ", strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);
    dup2(in[0], 0);
    dup2(out[1], 1);
    if (chdir(dir.c_str()) == 0) execve(exe.c_str(), c_args.data(), environ);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  // The input from a thread of its own: a counter may answer before it read everything.
  std::thread writer([fd = in[1], &input] {
    signal(SIGPIPE, SIG_IGN);
    size_t done = 0;
    while (done < input.size()) {
      const ssize_t n = write(fd, input.data() + done, input.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    close(fd);
  });
  std::string output;
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  char buf[1 << 14];
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) continue;
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buf, static_cast<size_t>(n));
    if (output.size() > (64u << 20)) break;
  }
  if (timed_out) kill(-pid, SIGKILL);
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  writer.join();
  if (timed_out) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": no answer within ", absl::FormatDuration(timeout), " (killed)"));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, WIFEXITED(status) ? absl::StrCat(" exited with code ", WEXITSTATUS(status))
                                : std::string(" was killed by a signal")));
  }
  return output;
}

// Caches answers (and records them) in front of `ask`.
ProgramCounter Cached(
    std::function<absl::StatusOr<std::vector<ParamCount>>(const std::vector<std::string>&)> ask,
    std::shared_ptr<std::map<std::string, ParamCount>> cache) {
  return [ask = std::move(ask), cache](
             const std::vector<std::string>& objects) -> absl::StatusOr<std::vector<ParamCount>> {
    std::vector<std::string> missing;
    for (const std::string& o : objects) {
      if (!cache->count(o) && std::find(missing.begin(), missing.end(), o) == missing.end()) {
        missing.push_back(o);
      }
    }
    if (!missing.empty()) {
      absl::StatusOr<std::vector<ParamCount>> got = ask(missing);
      if (!got.ok()) return got.status();
      for (size_t i = 0; i < missing.size(); ++i) (*cache)[missing[i]] = (*got)[i];
    }
    std::vector<ParamCount> out;
    for (const std::string& o : objects) out.push_back(cache->at(o));
    return out;
  };
}

}  // namespace

ProgramCounter SiblingCounter(ProgramCounter inner,
                              std::vector<std::map<std::string, std::string>> siblings) {
  if (siblings.empty() || !inner) return inner;
  return [inner = std::move(inner), siblings = std::move(siblings)](
             const std::vector<std::string>& objects) -> absl::StatusOr<std::vector<ParamCount>> {
    std::vector<std::string> all = objects;
    std::set<std::string> asked(objects.begin(), objects.end());
    for (const std::string& o : objects) {
      const nlohmann::json params = nlohmann::json::parse(o, nullptr, /*allow_exceptions=*/false);
      if (!params.is_object()) continue;
      ProgramConfig config;
      for (const auto& [name, value] : params.items()) SetProgramParam(name, value.dump(), &config);
      for (const std::map<std::string, std::string>& sibling : siblings) {
        ProgramConfig other = config;
        for (const auto& [name, json] : sibling) SetProgramParam(name, json, &other);
        std::string text = ProgramParamsJson(other);
        if (asked.insert(text).second) all.push_back(std::move(text));
      }
    }
    if (all.size() > objects.size()) {
      absl::StatusOr<std::vector<ParamCount>> got = inner(all);
      if (got.ok()) return std::vector<ParamCount>(got->begin(), got->begin() + objects.size());
    }
    return inner(objects);
  };
}

ProgramCounter CommandCounter(const std::string& command, const std::string& dir,
                              absl::Duration timeout,
                              std::shared_ptr<std::map<std::string, ParamCount>> record) {
  if (record == nullptr) record = std::make_shared<std::map<std::string, ParamCount>>();
  auto ask =
      [command, dir, timeout](
          const std::vector<std::string>& objects) -> absl::StatusOr<std::vector<ParamCount>> {
    const std::string what = absl::StrCat("program.count (", command, ")");
    absl::StatusOr<std::vector<std::string>> argv = SplitCommandWords(command);
    if (!argv.ok() || argv->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": not a command"));
    }
    std::string input;
    for (const std::string& o : objects) absl::StrAppend(&input, o, "\n");
    absl::StatusOr<std::string> output = RunWithInput(*argv, dir, input, timeout, what);
    if (!output.ok()) return output.status();
    std::vector<std::string> lines;
    for (absl::string_view l : absl::StrSplit(*output, '\n', absl::SkipWhitespace())) {
      lines.emplace_back(l);
    }
    if (lines.size() != objects.size()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": answered ", lines.size(),
                                                     " lines for ", objects.size(),
                                                     " configs (one JSON line each)"));
    }
    std::vector<ParamCount> counts;
    for (size_t i = 0; i < lines.size(); ++i) {
      const nlohmann::json j = nlohmann::json::parse(lines[i], nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("total") ||
          !j["total"].is_number_integer() || j["total"].get<int64_t>() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": line ", i + 1,
                         " is not {\"total\": N, \"activated\": M}: ", lines[i].substr(0, 200)));
      }
      ParamCount c;
      c.set_total(j["total"].get<int64_t>());
      c.set_activated(j.contains("activated") && j["activated"].is_number_integer()
                          ? j["activated"].get<int64_t>()
                          : c.total());
      counts.push_back(c);
    }
    return counts;
  };
  return Cached(ask, record);
}

ProgramCounter RecordedCounter(std::shared_ptr<const std::map<std::string, ParamCount>> known) {
  return
      [known](const std::vector<std::string>& objects) -> absl::StatusOr<std::vector<ParamCount>> {
        std::vector<ParamCount> out;
        for (const std::string& o : objects) {
          auto it = known->find(o);
          if (it == known->end()) {
            return absl::InvalidArgumentError(
                absl::StrCat("program.count: the request carries no count of ", o.substr(0, 200),
                             "; submit with the ablate CLI, which runs program.count"));
          }
          out.push_back(it->second);
        }
        return out;
      };
}

absl::StatusOr<BudgetSolution> SolveProgramBudget(const BudgetRule& rule, int64_t anchor_total,
                                                  const std::string& anchor,
                                                  const ProgramCounter& count,
                                                  ProgramConfig* program) {
  const std::string& name = rule.param();
  const std::string path = absl::StrCat("params.", name);
  const std::optional<double> start = ProgramParamNumber(*program, name);
  if (!start || *start != std::floor(*start) || *start < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget.match: ", path, " must be a positive integer param to solve"));
  }
  const int64_t multiple = std::max<int64_t>(1, rule.multiple());
  const int64_t v0 = static_cast<int64_t>(*start);
  std::map<int64_t, int64_t> seen;  // value -> total
  int calls = 0;
  // The totals at `values`, checked to grow with the value over everything asked so far.
  auto ask = [&](std::vector<int64_t> values) -> absl::Status {
    std::vector<int64_t> fresh;
    for (int64_t v : values) {
      if (!seen.count(v)) fresh.push_back(v);
    }
    if (fresh.empty()) return absl::OkStatus();
    if (++calls > kMaxCalls) {
      return absl::InvalidArgumentError(absl::StrCat("budget: ", path, ": no match after ",
                                                     kMaxCalls, " calls of program.count"));
    }
    std::vector<std::string> objects;
    for (int64_t v : fresh) {
      ProgramConfig probe = *program;
      SetProgramParam(name, absl::StrCat(v), &probe);
      objects.push_back(ProgramParamsJson(probe));
    }
    absl::StatusOr<std::vector<ParamCount>> got = count(objects);
    if (!got.ok()) return got.status();
    for (size_t i = 0; i < fresh.size(); ++i) seen[fresh[i]] = (*got)[i].total();
    int64_t prev_v = 0, prev_t = -1;
    for (const auto& [v, t] : seen) {
      if (prev_t > t) {
        return absl::InvalidArgumentError(absl::StrCat("budget: program.count is not monotone in ",
                                                       path, ": ", name, "=", prev_v, " gives ",
                                                       prev_t, ", ", name, "=", v, " gives ", t));
      }
      prev_v = v;
      prev_t = t;
    }
    return absl::OkStatus();
  };
  auto round_down = [&](int64_t v) { return std::max(multiple, v / multiple * multiple); };
  // Bracket [lo, hi] with total(lo) <= target <= total(hi), by doubling from v0.
  int64_t lo = round_down(v0), hi = lo;
  if (absl::Status s = ask({lo}); !s.ok()) return s;
  if (seen[lo] < anchor_total) {
    std::vector<int64_t> up;
    for (int k = 1; k <= kProbesPerCall; ++k) up.push_back(round_down(lo << k));
    if (absl::Status s = ask(up); !s.ok()) return s;
    for (int64_t v : up) {
      hi = v;
      if (seen[v] >= anchor_total) break;
      lo = v;
    }
  } else {
    std::vector<int64_t> down;
    for (int k = 1; k <= kProbesPerCall && (lo >> k) >= multiple; ++k) {
      down.push_back(round_down(lo >> k));
    }
    if (absl::Status s = ask(down); !s.ok()) return s;
    hi = lo;
    for (int64_t v : down) {
      lo = v;
      if (seen[v] <= anchor_total) break;
      hi = v;
    }
  }
  // Narrow it: evenly spaced multiples inside, one call each round.
  while (hi - lo > multiple && seen[lo] < anchor_total && seen[hi] > anchor_total) {
    std::vector<int64_t> inside;
    const int64_t steps = (hi - lo) / multiple;
    for (int k = 1; k <= kProbesPerCall; ++k) {
      const int64_t v = lo + (steps * k / (kProbesPerCall + 1)) * multiple;
      if (v > lo && v < hi) inside.push_back(v);
    }
    if (inside.empty()) break;
    if (absl::Status s = ask(inside); !s.ok()) return s;
    for (int64_t v : inside) {
      if (seen[v] <= anchor_total) lo = std::max(lo, v);
      if (seen[v] >= anchor_total) hi = std::min(hi, v);
    }
  }
  // The closest of the values asked about (ties: the smaller model).
  int64_t best = lo;
  for (const auto& [v, t] : seen) {
    if (v % multiple != 0) continue;
    const int64_t r = std::llabs(t - anchor_total), rb = std::llabs(seen[best] - anchor_total);
    if (r < rb || (r == rb && t < seen[best])) best = v;
  }
  const int64_t residual = seen[best] - anchor_total;
  const std::string anchor_text =
      absl::StrCat(anchor, "'s ", FormatCount(anchor_total), " parameters");
  if (static_cast<double>(std::llabs(residual)) >
      rule.tolerance() * static_cast<double>(anchor_total)) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget: impossible: no ", path, " (multiple of ", multiple,
                     ") brings the count within ", rule.tolerance() * 100, "% of ", anchor_text,
                     "; closest is ", best, " with residual ", FormatCount(residual)));
  }
  SetProgramParam(name, absl::StrCat(best), program);
  BudgetSolution solution;
  solution.set_match(BUDGET_FFN);
  solution.set_dim(path);
  solution.set_from(v0);
  solution.set_to(best);
  solution.set_anchor(anchor);
  solution.set_anchor_total(anchor_total);
  solution.set_residual(residual);
  solution.set_text(absl::StrCat(name, " ", v0, " -> ", best, " (residual ",
                                 residual > 0 ? "+" : "", FormatCount(residual), " vs ", anchor,
                                 ")"));
  return solution;
}

}  // namespace ablate
