// What /metrics reports beyond the store's contents: the coordinator's own statistics, as
// DashboardMetric samples for DashboardOptions::operator_stats.
#ifndef ABLATE_ORCHESTRATOR_DASHBOARD_METRICS_H_
#define ABLATE_ORCHESTRATOR_DASHBOARD_METRICS_H_

#include <vector>

#include "orchestrator/dashboard/server.h"
#include "orchestrator/store/store.h"

namespace ablate {

// The store writer's backlog, throughput and longest transaction (ablate_store_*).
std::vector<DashboardMetric> StoreMetrics(const StoreStats& stats);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_DASHBOARD_METRICS_H_
