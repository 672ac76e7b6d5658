// The pipeline's shape within its memory budget (RepackOptions -> PipelinePlan;
// the public part is in k3/repack/repack.h): what the runner and the pipeline
// share about how deep each stage is.
#pragma once

#include <cstddef>

namespace k3::repack {

// Blocks queued per stage of one stream's pipeline: with several streams each
// gets a share (at least 2), counted by BlocksPerStream.
size_t PipelineDepth(int streams);

}  // namespace k3::repack
