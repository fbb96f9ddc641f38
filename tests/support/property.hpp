// tests/support/property.hpp: rapidcheck properties inside Catch2 test cases,
// with kvtier's case count (10,000 by default; KVTIER_PROPERTY_CASES overrides).
//
//   TEST_CASE("lookup: min over ranks is the longest present prefix", "[property]") {
//     kvtier::test::prop("min over ranks", [](std::uint32_t w) { RC_ASSERT(...); });
//   }
#pragma once

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include <rapidcheck.h>
#include <catch2/catch.hpp>

namespace kvtier::test {

/// Cases per property: KVTIER_PROPERTY_CASES if set, else `fallback` (10,000).
inline int property_cases(int fallback = 10000) {
  if (const char* env = std::getenv("KVTIER_PROPERTY_CASES")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return fallback;
}

/// Runs `testable` as a rapidcheck property with property_cases() cases and
/// fails the enclosing Catch2 test case with rapidcheck's counterexample.
/// `fallback_cases` lowers the default for properties that are expensive per case
/// (the environment variable still overrides it).
template <class Testable>
void prop(const std::string& description, Testable&& testable, int fallback_cases = 10000) {
  using namespace rc::detail;
  TestParams params = configuration().testParams;
  params.maxSuccess = property_cases(fallback_cases);
  TestMetadata metadata;
  metadata.id = description;
  metadata.description = description;
  const auto result = checkTestable(std::forward<Testable>(testable), metadata, params);
  std::ostringstream report;
  printResultMessage(result, report);
  if (result.template is<SuccessResult>()) {
    std::cout << "property '" << description << "': " << report.str() << "\n";
    SUCCEED();
  } else {
    INFO(description << ":\n" << report.str());
    FAIL();
  }
}

}  // namespace kvtier::test
