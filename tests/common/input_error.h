// The message of the core::InputError a callable throws, for tests of clear error messages.
#pragma once

#include <string>

#include "core/error.h"

namespace gpulab::testing {

// The message of the InputError `f` throws ("" when it throws nothing).
template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const core::InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace gpulab::testing
