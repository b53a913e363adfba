// Every method no registered service has: UNIMPLEMENTED with a message naming the method and
// what this server does serve (gRPC's own answer carries no message). Triton's repository,
// shared-memory, trace and log RPCs land here.
#pragma once

#include <grpcpp/generic/async_generic_service.h>

#include "server/grpc/status.h"

namespace fastformer::rpc {

class UnimplementedMethods final : public grpc::CallbackGenericService {
 public:
  explicit UnimplementedMethods(Intake& intake) : intake_(intake) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

 private:
  Intake& intake_;
};

}  // namespace fastformer::rpc
