// Why a listening address cannot be bound, for a start-up error a user can act on: gRPC and
// the metrics exposer only say that they failed.
#pragma once

#include <string>

namespace fastformer {

// Tries to bind `address` ("host:port", "[v6]:port", ":port") itself and returns what stops
// it, e.g. "address already in use" or "cannot resolve host 'x': ...". Returns "" when the
// address binds (the failure was something else) or is not of that form.
std::string listen_problem(const std::string& address);

}  // namespace fastformer
