// Assertions the tests share beyond GoogleTest's own.
#pragma once

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace pslab::test {

// f() must throw a std::runtime_error whose message contains `says`; `unless` says what went
// wrong if it returns instead.
template <typename F>
void expect_refused(F&& f, const std::string& says, const char* unless) {
  try {
    f();
    ADD_FAILURE() << unless;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

}  // namespace pslab::test
