// What the files of CoordinatorCore share (not for use outside them and finishing.cc): the job
// template the scheduler carries with a queued run, a worker's registered resources, and a stored
// run as the scheduler queues it. core.cc builds the core (construction, the rebuild from the
// store, the lease checker), client_api.cc is the client API, worker_api.cc the worker API
// (register, acquire, report, deregister, the lease and worker checks), finish.cc the ending of
// attempts (a worker's Finish, a gang member's, a lost or failed attempt's retry).
#ifndef ABLATE_ORCHESTRATOR_COORDINATOR_CORE_INTERNAL_H_
#define ABLATE_ORCHESTRATOR_COORDINATOR_CORE_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "orchestrator/coordinator/scheduler.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/store/store.h"
#include "proto/ablate.pb.h"

namespace ablate {

// The parts of a run's job that never change (a stored config is never rewritten). Submit makes
// one per run from the configs it expanded, and the scheduler carries it with the run: a dispatch
// then reads nothing from the store, where it read the run and parsed its JSON config.
struct JobTemplate {
  RunConfig config;
  std::string sweep;
  std::string variant;
};

namespace core_internal {

// A worker's registered resources (unknown fields of a newer worker ignored).
WorkerResources ResourcesOf(const WorkerInfo& w);

// What a worker with resources `r` offers the scheduler. Its host is where it serves a gang's
// rendezvous when it holds rank 0.
WorkerOffer OfferFrom(const WorkerResources& r);

// `job` null: MakeJob reads the stored config when the run is dispatched (runs queued again after
// a restart, a rerun or a retry), so a restart does not parse every queued run's config up front.
QueuedRun ToQueued(const RunInfo& run, absl::Time not_before,
                   std::shared_ptr<const JobTemplate> job = nullptr);

// The start of run `run_id`'s next attempt on worker_id (PENDING -> RUNNING).
RunTransition StartOn(int64_t run_id, int64_t worker_id);

}  // namespace core_internal
}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_COORDINATOR_CORE_INTERNAL_H_
