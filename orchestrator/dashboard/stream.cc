// The dashboard's live stream (/api/stream?sweep=NAME): server-sent events of what changes in a
// sweep, read from the store every poll_interval with StoreReader::ChangesSince, the same read
// `ablate watch` streams over gRPC. Every write has options.write_timeout to finish: a client
// that stops reading is dropped then, and its stream slot freed.
#include <boost/asio/write.hpp>

#include "absl/strings/str_cat.h"
#include "orchestrator/dashboard/internal.h"

namespace ablate {

namespace {

namespace asio = boost::asio;

std::string SseEvent(absl::string_view name, const json& data) {
  return absl::StrCat("event: ", name, "\ndata: ", Dump(data), "\n\n");
}

}  // namespace

void DashboardServer::Impl::Stream(Connection* connection, const Request& r) {
  boost::system::error_code ec;
  auto send = [&](absl::string_view text) {
    connection->set_deadline(absl::Now() + options.write_timeout);
    asio::write(*connection, asio::buffer(text.data(), text.size()), ec);
    return !ec;
  };
  auto fail = [&](int status, const std::string& message) {
    send(dashboard::RawErrorResponse(status, message));
  };
  auto it = r.query.find("sweep");
  if (it == r.query.end() || it->second.empty()) return fail(400, "parameter 'sweep' is required");
  absl::StatusOr<SweepInfo> sweep = reader->GetSweep(it->second);
  if (!sweep.ok()) {
    return fail(sweep.status().code() == absl::StatusCode::kNotFound ? 404 : 400,
                std::string(sweep.status().message()));
  }
  const int64_t sweep_id = sweep->id;

  // Cursors: the last event and spike rows sent (ChangeCursor), and per tracked run the last step
  // sent. The client opens the stream, waits for `hello`, then loads the curves: every point after
  // a run's cursor comes on the stream, the rest with the curves (the client drops duplicates).
  ChangeCursor at;
  std::map<int64_t, int64_t> cursor;  // RUNNING runs (and those that just stopped)
  {
    absl::StatusOr<ChangeCursor> latest = reader->LatestCursor();
    if (!latest.ok()) return fail(400, std::string(latest.status().message()));
    at = *latest;
    RunFilter running;
    running.sweep_id = sweep_id;
    running.states = {RUNNING};
    absl::StatusOr<std::vector<RunInfo>> runs = reader->ListRuns(running);
    if (runs.ok()) {
      for (const RunInfo& run : *runs) cursor[run.id] = run.steps_done;
    }
  }
  if (!send("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
            "X-Accel-Buffering: no\r\nConnection: close\r\n\r\nretry: 1000\n\n")) {
    return;
  }
  if (!send(SseEvent("hello", json{{"sweep", sweep->name}, {"sweep_id", sweep_id},
                                   {"time", NowSeconds()}}))) {
    return;
  }
  absl::Time last_write = absl::Now();
  SeriesOptions series;
  series.max_points = 500;  // per run per tick: a long stall is still one bounded message
  while (Sleep(options.poll_interval)) {
    // A client that left gives its stream slot back now, not at the next write.
    if (connection->PeerClosed()) return;
    std::string out;
    bool changed = false;
    absl::StatusOr<SweepChanges> changes = reader->ChangesSince(sweep_id, at, 500, {RUNNING});
    if (!changes.ok()) continue;  // the store is busy or recovering: the next tick asks again
    at = changes->next;
    std::map<int64_t, const RunInfo*> run_of;
    for (const RunInfo& run : changes->runs) run_of[run.id] = &run;
    // 1. The event log: state changes (run_state carries DIVERGED), sweep state, workers.
    for (const EventInfo& e : changes->events) {
      out += SseEvent("event", EventJson(e));
      if (e.run_id > 0 && e.kind == "run_state") {
        // A running run is in the snapshot; one that just ended is read on its own.
        absl::StatusOr<RunInfo> ended;
        const RunInfo* run = nullptr;
        if (auto it = run_of.find(e.run_id); it != run_of.end()) {
          run = it->second;
        } else if (ended = reader->GetRun(e.run_id); ended.ok()) {
          run = &*ended;
        }
        if (run != nullptr) {
          out += SseEvent("run", RunJson(*run));
          if (run->state == RUNNING) cursor.emplace(run->id, 0);
        }
      }
      changed = true;
    }
    // Runs that became RUNNING without an event we saw yet (the event is in the next tick).
    std::set<int64_t> still_running;
    for (const RunInfo& run : changes->runs) {
      still_running.insert(run.id);
      cursor.emplace(run.id, 0);
    }
    // 2. New points of tracked runs (a run that stopped gets one last poll, then is dropped).
    for (auto c = cursor.begin(); c != cursor.end();) {
      series.from_step = c->second + 1;
      absl::StatusOr<std::vector<StepMetrics>> m = reader->MetricSeries(c->first, series);
      if (m.ok() && !m->empty()) {
        json steps = json::array(), loss = json::array(), grad = json::array();
        for (const StepMetrics& p : *m) {
          steps.push_back(p.step());
          loss.push_back(p.loss());
          grad.push_back(p.grad_norm());
        }
        c->second = m->back().step();
        out += SseEvent("points", json{{"run", c->first}, {"step", steps}, {"loss", loss},
                                       {"grad_norm", grad}});
      }
      if (still_running.count(c->first) == 0) {
        c = cursor.erase(c);
      } else {
        ++c;
      }
    }
    // 3. New spike events of the sweep.
    for (const SweepSpike& spike : changes->spikes) {
      out += SseEvent("spike", SpikeJson(spike.run_id, spike.event));
      changed = true;
    }
    // 4. The sweep's progress after any change.
    if (changed) {
      absl::StatusOr<SweepInfo> now = reader->GetSweepById(sweep_id);
      if (now.ok()) out += SseEvent("sweep", SweepJson(*now, NowSeconds()));
    }
    // A comment now and then: proxies keep the connection, and a gone client is noticed.
    if (out.empty() && absl::Now() - last_write > absl::Seconds(10)) out = ": ping\n\n";
    if (!out.empty()) {
      if (!send(out)) return;
      last_write = absl::Now();
    }
  }
}

}  // namespace ablate
