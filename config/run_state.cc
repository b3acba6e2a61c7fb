#include "config/run_state.h"

namespace ablate {

bool RunEnded(RunState state) {
  switch (state) {
    case SUCCEEDED:
    case FAILED:
    case DIVERGED:
    case CANCELLED:
    case STOPPED:
      return true;
    default:
      return false;
  }
}

const std::vector<std::string>& RunStateNames() {
  static const std::vector<std::string>* const names = [] {
    auto* out = new std::vector<std::string>;
    const google::protobuf::EnumDescriptor* d = RunState_descriptor();
    for (int i = 0; i < d->value_count(); ++i) {
      if (d->value(i)->number() != RUN_STATE_UNSPECIFIED) out->push_back(d->value(i)->name());
    }
    return out;
  }();
  return *names;
}

}  // namespace ablate
