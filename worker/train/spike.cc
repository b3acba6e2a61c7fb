#include "worker/train/spike.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ablate {

std::optional<double> CatastrophicSpikeDetector::Observe(double value) {
  if (!std::isfinite(value)) return std::nullopt;  // hard faults are the monitor's business
  if (seen_ < warmup_) {
    max_ = seen_ == 0 ? value : std::max(max_, value);
    ++seen_;
    return std::nullopt;
  }
  // A warmup maximum of 0 or less is no scale to compare with (a signal that stays 0).
  if (max_ > 0 && value >= factor_ * max_) return factor_ * max_;
  return std::nullopt;
}

std::optional<double> StatisticalSpikeDetector::Observe(double value) {
  if (!std::isfinite(value)) return std::nullopt;
  if (static_cast<int>(values_.size()) == window_) {
    const double n = window_;
    const double mean = sum_ / n;
    const double std = std::sqrt(std::max(0.0, sq_sum_ / n - mean * mean));
    const double threshold = mean + sigmas_ * std;
    if (value > threshold) return threshold;
    sum_ -= values_.front();
    sq_sum_ -= values_.front() * values_.front();
    values_.pop_front();
  }
  values_.push_back(value);
  sum_ += value;
  sq_sum_ += value * value;
  return std::nullopt;
}

std::optional<double> DivergenceDetector::Observe(double loss) {
  std::optional<double> diverged;
  if (std::isfinite(loss) && static_cast<int>(values_.size()) == window_) {
    const double mean = sum_ / window_;
    run_ = loss >= factor_ * mean ? run_ + 1 : 0;
    if (run_ > patience_) diverged = mean;
  }
  if (std::isfinite(loss)) {
    values_.push_back(loss);
    sum_ += loss;
    if (static_cast<int>(values_.size()) > window_) {
      sum_ -= values_.front();
      values_.pop_front();
    }
  }
  return diverged;
}

namespace {

int DivergenceWindow(const SpikeConfig& c, int64_t total_steps) {
  return std::max(c.divergence_min_window(),
                  static_cast<int>(c.divergence_window_fraction() * static_cast<double>(total_steps)));
}

}  // namespace

SpikeMonitor::SpikeMonitor(const SpikeConfig& c, int64_t total_steps)
    : config_(c),
      loss_catastrophic_(c.catastrophic_factor(), c.catastrophic_warmup()),
      grad_catastrophic_(c.catastrophic_factor(), c.catastrophic_warmup()),
      loss_statistical_(c.stat_window(), c.stat_sigmas()),
      grad_statistical_(c.stat_window(), c.stat_sigmas()),
      divergence_(c.divergence_factor(), c.divergence_patience(), DivergenceWindow(c, total_steps)) {}

SpikeMonitor::Verdict SpikeMonitor::Observe(int64_t step, double loss,
                                            std::optional<double> reported_grad_norm) {
  // Not reported (a program's step line without one): its detectors see nothing.
  const bool has_grad = reported_grad_norm.has_value();
  const double grad_norm = reported_grad_norm.value_or(0);
  Verdict v;
  auto add = [&](const char* signal, double value, double baseline, SpikeKind kind) {
    SpikeEvent e;
    e.set_step(step);
    e.set_signal(signal);
    e.set_value(value);
    e.set_baseline(baseline);
    e.set_kind(kind);
    v.events.push_back(std::move(e));
  };

  v.nonfinite = !std::isfinite(loss) || (has_grad && !std::isfinite(grad_norm));
  if (v.nonfinite) {
    add(std::isfinite(loss) ? "grad_norm" : "loss", std::isfinite(loss) ? grad_norm : loss, 0.0,
        SPIKE_NONFINITE);
    if (++nonfinite_run_ >= config_.max_nonfinite_steps()) {
      v.diverged = true;
      v.reason = absl::StrCat("loss or gradient norm non-finite for ", nonfinite_run_,
                              " consecutive steps");
    }
    return v;
  }
  nonfinite_run_ = 0;

  for (const auto& [signal, value, catastrophic, statistical] :
       {std::tuple{"loss", loss, &loss_catastrophic_, &loss_statistical_},
        std::tuple{"grad_norm", grad_norm, &grad_catastrophic_, &grad_statistical_}}) {
    if (!has_grad && absl::string_view(signal) == "grad_norm") continue;
    if (auto base = catastrophic->Observe(value)) {
      add(signal, value, *base, SPIKE_CATASTROPHIC);
      v.spike = true;
    }
    if (auto base = statistical->Observe(value)) {
      add(signal, value, *base, SPIKE_STATISTICAL);
      v.spike = true;
    }
  }
  if (auto mean = divergence_.Observe(loss)) {
    add("loss", loss, *mean, SPIKE_DIVERGENCE);
    v.diverged = true;
    v.reason = absl::StrCat("loss >= ", config_.divergence_factor(), "x its window mean (",
                            *mean, ") for more than ", config_.divergence_patience(), " steps");
  }
  return v;
}

SpikeDecision ApplySpikePolicy(SpikePolicy policy, int64_t rollbacks,
                               SpikeMonitor::Verdict* verdict) {
  SpikeDecision d;
  d.skip = verdict->nonfinite;
  if (verdict->spike && !verdict->diverged) {
    if (policy == SPIKE_SKIP || (policy == SPIKE_ROLLBACK && rollbacks >= kMaxRollbacks)) {
      d.skip = true;
    } else if (policy == SPIKE_ROLLBACK) {
      d.roll_back = true;
    } else if (policy == SPIKE_STOP) {
      verdict->diverged = true;
      verdict->reason = "spike with policy STOP";
    }
  }
  for (SpikeEvent& e : verdict->events) {
    if (verdict->diverged) {
      e.set_action(SPIKE_ACTION_STOPPED);
    } else if (d.roll_back && e.kind() != SPIKE_NONFINITE) {
      e.set_action(SPIKE_ACTION_ROLLED_BACK);
    } else if (d.skip) {
      e.set_action(SPIKE_ACTION_SKIPPED);
    }
  }
  return d;
}

}  // namespace ablate
