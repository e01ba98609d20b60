// kvtier/testing/reference_copy.h — the independent reference for every transfer backend.
//
// Copies a request 4 bytes at a time, computing every address from KvGeometry::HeadOffset with no
// run merging, no threads and no shortcuts. Slow by design: tests and `kvtier bench` compare each
// backend's output with it. Host memory only.
#pragma once

#include "kvtier/transfer.h"

namespace kvtier::testing {

// REQUIRES: both regions and both index lists in host memory.
// Validates the request first (ValidateTransfer), like every backend.
Status ReferenceTransfer(const TransferRequest& request);

}  // namespace kvtier::testing
