// --capture-range: restrict the analysis to the steady-state part of a program, the way Nsight
// Systems' --capture-range=nvtx does, by clipping the trace's records to a window; the rules then
// see only that part without knowing about windows.
#pragma once

#include <string>

#include "trace/trace.h"

namespace gpulab::trace {

// From the start of the first range named `name` to the end of the last one. An InputError that
// lists the range names the trace has when none is called `name`.
AnalysisWindow capture_window(const Trace& trace, const std::string& name);

// The trace with its records clipped to the window: those wholly outside are dropped, those that
// straddle an edge are cut at it (a cut copy, memset or migration keeps the bytes of its part at
// its rate), samples outside are dropped; `window` records what was kept.
Trace clip_to_window(const Trace& trace, const AnalysisWindow& window);

}  // namespace gpulab::trace
