// tracing_gpu.cuh: the device recorder (being written; see docs/format.md).
#pragma once
